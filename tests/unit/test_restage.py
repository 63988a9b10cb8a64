"""A job cut into another number of pipeline stages after an elastic restart (``workload.resize: stages``):
which worlds count as restaged, whose small state each new rank takes, what the workload becomes, what the
verdict says of it."""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from baft.mesh.topology import restage_source, restaged, stages_of

from analysis.metrics import _restaged
from harness.errors import ConfigValueError
from harness.worker.shapes import PRESETS
from harness.worker.spec import WorkloadConfig


def world(stages: int, replicas: int, shards: int = 1) -> list[list[Any]]:
    """A recorded world in replica-major order: each rank's [place, replica index]."""
    return [[f"stage{s}" + (f".shard{k}" if shards > 1 else ""), d]
            for d in range(replicas) for s in range(stages) for k in range(shards)]


def test_only_another_stage_count_is_a_restage() -> None:
    assert restaged(world(4, 1), world(2, 1)) and restaged(world(2, 2), world(4, 2))
    assert not restaged(world(2, 2), world(2, 1))  # fewer replicas: the same stages
    assert not restaged(world(2, 1, shards=2), world(2, 1))  # another sharding of the same stages
    assert not restaged(None, world(2, 1)) and not restaged(world(2, 1), None)
    assert stages_of(world(2, 2, shards=2)) == ["stage0", "stage1"]


@given(model=st.sampled_from(["gpt-tiny", "gpt-small", "mlp"]), old=st.integers(1, 8), new=st.integers(1, 8),
       replicas=st.integers(1, 3), data=st.data())
def test_each_new_stage_takes_the_small_state_of_the_old_stage_its_blocks_begin_in(
        model: str, old: int, new: int, replicas: int, data: st.DataObject) -> None:
    """Whenever the workload accepts a restage, baft's pick (which knows no blocks) is the old stage that held
    the new stage's first block in the model's real cut (the one build_stage makes)."""
    shape = PRESETS[model]
    assume(old <= shape.blocks and new <= shape.blocks and old != new)
    try:
        WorkloadConfig(model=model, stages=old, data_parallel=replicas, microbatches=8,
                       resize="stages").resized(new * replicas)
    except ConfigValueError as e:
        assert e.field == "stages"
        return
    before, after = world(old, replicas), world(new, replicas)
    stage, replica = data.draw(st.integers(0, new - 1)), data.draw(st.integers(0, replicas - 1))
    place, index = before[restage_source(before, f"stage{stage}", replica, after)]
    first = shape.stage_blocks(stage, new).start
    assert first in shape.stage_blocks(int(place.removeprefix("stage")), old) and index == replica


def test_a_cut_that_does_not_line_up_is_refused() -> None:
    with pytest.raises(ConfigValueError, match="lines up with the cut into 3"):
        WorkloadConfig(model="gpt-tiny", stages=4, microbatches=4, resize="stages").resized(3)


def test_a_workload_that_resizes_its_stages_keeps_its_replicas_and_microbatches() -> None:
    w = WorkloadConfig(model="gpt-tiny", stages=4, data_parallel=2, microbatches=4, nodes=2, resize="stages")
    r = w.resized(4)
    assert (r.stages, r.data_parallel, r.microbatches, r.nodes) == (2, 2, 4, 1)
    assert w.resized(8) is w
    grown = WorkloadConfig(model="gpt-tiny", stages=2, microbatches=4, nodes=2, resize="stages").resized(4)
    assert (grown.stages, grown.nodes) == (4, 4)


@pytest.mark.parametrize("fields, size, field, expected", [
    ({"dp_shard": 2, "stages": 2, "nodes": 2}, 2, "dp_shard", "1 with resize: stages"),
    ({"tp": 2, "stages": 2, "nodes": 2}, 2, "tp", "1 with resize: stages"),
    ({"schedule": "interleaved-1f1b", "virtual_stages": 2, "stages": 2, "nodes": 2}, 1, "virtual_stages", "1 with"),
    ({"stages": 2, "data_parallel": 2, "nodes": 2}, 3, "data_parallel", "a divisor of the new world size 3"),
    ({"stages": 2, "microbatches": 2, "nodes": 2}, 8, "stages", "at most 4 stages"),
    ({"stages": 1, "microbatches": 2, "nodes": 1}, 3, "microbatches", "at least the 3 stages"),
])
def test_a_restage_that_cannot_be_cut_names_its_field(fields: dict[str, Any], size: int, field: str,
                                                      expected: str) -> None:
    w = WorkloadConfig(model="gpt-tiny", resize="stages", **fields)
    with pytest.raises(ConfigValueError) as e:
        w.resized(size)
    assert e.value.field == field and expected in e.value.expected


def test_the_recovery_says_how_the_stages_changed_and_what_it_could_not_carry() -> None:
    assert _restaged([{"step": 8, "tier": "persistent"}]) is None
    said = _restaged([{"restaged_from": 4, "stages": 2, "not_carried": ["rng"], "why": "dropout streams"},
                      {"restaged_from": 4, "stages": 2, "not_carried": ["rng"]}])
    assert said == "4 -> 2 stages; not carried: rng (dropout streams)"
    assert _restaged([{"restaged_from": 2, "stages": 1, "not_carried": []}]) == "2 -> 1 stages; all carried"
