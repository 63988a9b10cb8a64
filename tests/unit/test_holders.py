"""Who held a place in a recorded world (``baft.mesh.topology.holders``) and whose persistent record a rank of a
resized world loads (``baft.strategies.restore.meta_rank``): by place and replica index, never by rank number."""
from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from baft.mesh.topology import holders
from baft.strategies.restore import meta_rank


def world(stages: int, shards: int, replicas: int, stage_major: bool) -> list[list]:
    """Every rank's [place, replica index] of a PP x DP(replicate) x DP(shard) job in either rank order."""
    out = []
    for outer in range(stages if stage_major else replicas):
        for inner in range(replicas if stage_major else stages):
            for k in range(shards):
                s, r = (outer, inner) if stage_major else (inner, outer)
                out.append([f"stage{s}.shard{k}" if shards > 1 else f"stage{s}", r])
    return out


@settings(max_examples=100, deadline=None)
@given(stages=st.integers(1, 4), shards=st.integers(1, 3), replicas=st.integers(1, 4), old_replicas=st.integers(1, 4),
       stage_major=st.booleans(), old_stage_major=st.booleans())
def test_a_resized_worlds_rank_loads_the_record_of_an_old_rank_of_its_own_place(
        stages: int, shards: int, replicas: int, old_replicas: int, stage_major: bool, old_stage_major: bool) -> None:
    old, new = world(stages, shards, old_replicas, old_stage_major), world(stages, shards, replicas, stage_major)
    manifest = {"places": old}
    for rank, (place, replica) in enumerate(new):
        strategy = SimpleNamespace(place=place, topology=SimpleNamespace(replica=replica))
        source = meta_rank(strategy, manifest, rank)
        assert old[source] == [place, replica % old_replicas]  # its own place, its replica index modulo the old count
    assert all(holders(old, p) == sorted(holders(old, p), key=lambda i: old[i][1]) for p, _ in old)


def test_a_changed_sharding_takes_a_piece_of_the_same_stage_and_a_world_without_a_map_the_rank_itself() -> None:
    old = world(2, 2, 1, True)  # stage0.shard0, stage0.shard1, stage1.shard0, stage1.shard1
    one = SimpleNamespace(place="stage1", topology=SimpleNamespace(replica=0))
    assert holders(old, "stage1") == [] and holders(old, "stage1", same_stage=True) == [2, 3]
    assert meta_rank(one, {"places": old}, 1) == 2
    assert meta_rank(one, {}, 1) == 1  # a checkpoint from before the map
    own = SimpleNamespace(place=None, topology=SimpleNamespace(replica=0))
    assert meta_rank(own, {"places": old}, 1) == 1  # a module attached without a mesh: its own record
