"""The launch's config: what torchrun agents a run gets, checked before anything starts."""
from __future__ import annotations

import pytest

from harness.errors import ConfigValueError
from harness.run.launcher import LaunchConfig
from injectors.link import ThrottleConfig


def test_a_launch_config_is_elastic_only_below_its_nodes() -> None:
    assert not LaunchConfig(nodes=2, world_size=4, max_restarts=0, timeout=10).elastic
    assert not LaunchConfig(nodes=2, world_size=4, max_restarts=0, timeout=10, min_nodes=2).elastic
    assert LaunchConfig(nodes=2, world_size=4, max_restarts=0, timeout=10, min_nodes=1).elastic


@pytest.mark.parametrize(("change", "field"), [
    ({"nodes": 0}, "nodes"),
    ({"world_size": 3}, "world_size"),
    ({"max_restarts": -1}, "max_restarts"),
    ({"timeout": 0}, "timeout"),
    ({"min_nodes": 3}, "min_nodes"),
    ({"harness_faults": [(0, ThrottleConfig(link=["node0", "node1"], rate="50mbit", from_step=1))]}, "harness_faults"),
])
def test_a_bad_launch_config_fails_before_anything_starts(change: dict, field: str) -> None:
    with pytest.raises(ConfigValueError) as err:
        LaunchConfig(**{"nodes": 2, "world_size": 4, "max_restarts": 0, "timeout": 10.0, **change})
    assert err.value.field == field
