"""A rank's topology refuses what it cannot place with baft's configuration error (field, expected, found),
never a ``TypeError`` of a malformed error (the checker found every one of these raised with one argument)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from baft.errors import BaftConfigError
from baft.mesh.topology import Topology, from_mesh, of


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"replica": 2, "replicas": 2}, "replica"),
    ({"replica": -1}, "replica"),
    ({"shard": 3, "shards": 2}, "shard"),
])
def test_an_index_outside_its_range(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(BaftConfigError) as e:
        Topology(**kwargs)
    assert e.value.field == field and "an index from 0" in e.value.expected


@pytest.mark.parametrize(("names", "expected"), [
    (None, "named dimensions"),
    (("pp", "data"), "names among"),
    (("dp_replicate", "dp"), "at most one replicate dimension"),
])
def test_a_mesh_it_cannot_read(names: tuple[str, ...] | None, expected: str) -> None:
    with pytest.raises(BaftConfigError) as e:
        from_mesh(SimpleNamespace(mesh_dim_names=names))
    assert e.value.field == "mesh.mesh_dim_names" and expected in e.value.expected


def test_a_mesh_and_coordinates_together() -> None:
    with pytest.raises(BaftConfigError, match="attach: expected the mesh or replica"):
        of(SimpleNamespace(mesh_dim_names=("pp",)), replica=1, replicas=2)
