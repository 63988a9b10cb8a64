"""baft on the layouts real pipeline jobs use: stages sharded with FSDP2 on a DeviceMesh (DTensor state)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.checkpoint import FileSystemReader

from baft.persist import commits as persist

from analysis.journal import Journal

from .conftest import ROOT, delivered, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _recoveries(v: dict) -> list[tuple[str, int]]:
    return [(r["restored_tier"], r["restored_step"]) for r in v["recoveries"]]


def _peer_ranks(run: Path) -> set[int]:
    """The ranks whose last restore pulled their copy from another node's store."""
    last = {e["rank"]: e["tier"] for e in Journal.load(run).events("checkpoint_restored")}
    return {r for r, tier in last.items() if tier == "peer"}


def test_fsdp_on_an_interleaved_schedule_resumes_bit_for_bit(tmp_path: Path, ref_cache: Path) -> None:
    """Two FSDP-sharded chunks per rank (a layout refused before): a torn copy, a persist and a node lost, each
    resumed bit for bit; node 1's ranks pull the shards of both their chunks from node 0's store."""
    rc, out, v = run_cli(ROOT / "scenarios/ci/pp-fsdp-interleaved.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["bitwise_equal"] and v["faults_fired"] == 3
    snapshot, persisting, node = _recoveries(v)
    assert snapshot == ("shm", 3) and node[0] == "peer+shm"
    assert _peer_ranks(tmp_path / "out" / "faulted") == {2, 3}


def test_pp_fsdp_survives_a_fault_at_every_phase_bit_for_bit(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(ROOT / "scenarios/ci/pp-fsdp-every-phase.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["bitwise_equal"] and v["states_compared"] > 0 and v["passed"] and v["faults_fired"] == 4
    snapshot, replicate, persisting, node = _recoveries(v)
    assert snapshot == ("shm", 3)  # the torn version 4 is discarded
    assert replicate[0] == "shm" and replicate[1] >= 7 and persisting[0] == "shm" and persisting[1] >= 12
    assert node[0] == "peer+shm" and node[1] >= persisting[1]
    run = tmp_path / "out" / "faulted"
    assert _peer_ranks(run) == {2, 3}  # node 1's ranks: the second shard of both stages
    j = Journal.load(run)
    assert any(r["reason"].startswith("torn") for r in j.events("checkpoint_rejected", 1))
    # The persistent tier holds each sharded tensor whole (DCP assembles it from the two ranks' halves), so a
    # load into another sharding reshards it; the snapshot copied each rank's half.
    root = run / "checkpoints"
    md = FileSystemReader(str(persist.step_dir(root, persist.committed_steps(root)[0]))).read_metadata()
    sizes = {k: tuple(m.size) for k, m in md.state_dict_metadata.items() if k.endswith("ln1.weight")}
    assert sizes == {f"model.blocks.{i}.ln1.weight": (64,) for i in range(4)}  # the whole model's names
    stage0 = _stage0_bytes(md)
    (copied,) = [e["bytes"] for e in j.events("snapshot", 0) if e["step"] == 5]
    assert 0.4 * stage0 < copied < 0.6 * stage0, (copied, stage0)  # rank 0 snapshots its half


def _stage0_bytes(md: Any, part: str = "") -> int:
    """Bytes of stage 0's whole state in a checkpoint's metadata (gpt-tiny on 2 stages: stage 0 holds the
    embedding and blocks 0 and 1; its per-rank plain tensors counted once), of the keys holding ``part``."""
    def of_stage0(key: str) -> bool:
        name = key.removeprefix("model.").removeprefix("optimizer.state.")
        return name.startswith(("embed.", "blocks.0.", "blocks.1.")) or key.startswith(("stage0/", "stage0.shard0/"))

    return sum(math.prod(m.size) * m.properties.dtype.itemsize for k, m in md.state_dict_metadata.items()
               if of_stage0(k) and part in k)


def test_pp_tp_survives_a_fault_at_every_phase_bit_for_bit(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(ROOT / "scenarios/ci/pp-tp-every-phase.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["bitwise_equal"] and v["passed"] and v["faults_fired"] == 4
    snapshot, replicate, persisting, node = _recoveries(v)
    assert snapshot == ("shm", 2) and replicate[0] == "shm" and persisting[0] == "shm" and persisting[1] >= 10
    assert node[0] == "peer+shm"
    run = tmp_path / "out" / "faulted"
    assert _peer_ranks(run) == {0, 1}  # node 0's ranks: the first tensor-parallel rank of both stages
    root = run / "checkpoints"
    md = FileSystemReader(str(persist.step_dir(root, persist.committed_steps(root)[0]))).read_metadata()
    sizes = {k: tuple(m.size) for k, m in md.state_dict_metadata.items() if k.endswith("mlp.0.weight")}
    # the column-wise weight is one whole tensor assembled from both ranks' halves (4*64 rows of 64)
    assert sizes == {f"model.blocks.{i}.mlp.0.weight": (256, 64) for i in range(4)}


def test_tp_then_fsdp_in_each_stage_resumes_bit_for_bit(tmp_path: Path, ref_cache: Path) -> None:
    """torchtitan's 3-D layout (pp × dp_shard × tp, stage-major): the MLP weights are 2-D DTensors."""
    rc, out, v = run_cli(ROOT / "scenarios/ci/pp-fsdp-tp-2d.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["bitwise_equal"] and v["passed"] and v["faults_fired"] == 4
    snapshot, replicate, persisting, node = _recoveries(v)
    assert snapshot == ("shm", 2) and replicate[0] == "shm" and replicate[1] >= 4
    assert persisting[0] == "shm" and persisting[1] >= 8 and node[0] == "peer+shm"
    run = tmp_path / "out" / "faulted"
    assert _peer_ranks(run) == {4, 5, 6, 7}  # node 1 held stage 1
    root = run / "checkpoints"
    md = FileSystemReader(str(persist.step_dir(root, persist.committed_steps(root)[0]))).read_metadata()
    sizes = {k: tuple(m.size) for k, m in md.state_dict_metadata.items() if k.endswith(("mlp.0.weight", "ln1.weight"))}
    # whole tensors: the MLP's assembled from four ranks' quarters, the norms' from two shards' halves
    assert sizes == {**{f"model.blocks.{i}.mlp.0.weight": (256, 64) for i in range(4)},
                     **{f"model.blocks.{i}.ln1.weight": (64,) for i in range(4)}}
    j = Journal.load(run)
    copied = {r: [e["bytes"] for e in j.events("snapshot", r) if e["step"] == 4] for r in range(4)}
    stage0, mlp = _stage0_bytes(md), _stage0_bytes(md, ".mlp.")
    # Each rank holds its quarter of the MLPs (2-D shards) and its shard's half of the rest (1-D shards of
    # the dp_shard mesh, alike on both tensor-parallel peers). The first TP rank of a shard copies both,
    # the second only its MLP quarter (and its buffers): the rest is the first's (baft.mesh.tpshared).
    for r0, r1 in ((0, 1), (2, 3)):
        (c0,), (c1,) = copied[r0], copied[r1]
        assert abs(c0 - (mlp / 4 + (stage0 - mlp) / 2)) < 0.02 * stage0, (copied, stage0, mlp)
        assert mlp / 4 <= c1 < mlp / 4 + 0.02 * stage0, (copied, stage0, mlp)


def test_stage_major_survives_a_fault_at_every_phase_and_pulls_the_lost_stage_from_the_peer(
        tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(ROOT / "scenarios/ci/stage-major-every-phase.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["bitwise_equal"] and v["passed"] and v["faults_fired"] == 4
    snapshot, replicate, persisting, node = _recoveries(v)
    assert snapshot == ("shm", 2) and replicate[0] == "shm" and persisting[0] == "shm" and persisting[1] >= 8
    assert node[0] == "peer+shm", v["recoveries"]
    run = tmp_path / "out" / "faulted"
    _, sent = delivered(run, 1, [2, 3])
    assert node[1] >= max(sent), (node, sorted(sent))  # the newest both had delivered
    assert _peer_ranks(run) == {2, 3}  # node 1 held stage 1: ranks 2 and 3


def test_batchnorm_statistics_are_snapshotted_at_the_step_boundary(tmp_path: Path, ref_cache: Path) -> None:
    # Hole c: copied inside the bubbles, the running statistics of a version mixed microbatches of the next
    # step; the restored state then differed from the reference's at the restored step (norm.running_mean).
    rc, out, v = run_cli(ROOT / "scenarios/ci/baft-batchnorm.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    (rec,) = v["recoveries"]
    assert v["bitwise_equal"] and rec["restored_tier"] == "shm" and rec["restored_step"] == 11
    j = Journal.load(tmp_path / "out" / "faulted")
    assert any(k.endswith("norm.running_mean") for k in j.events("state", 0)[-1]["digests"]["model"])


def test_fp16_with_a_moving_loss_scale_resumes_bit_for_bit(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(ROOT / "scenarios/ci/amp-fp16-kill.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    (rec,) = v["recoveries"]
    assert v["bitwise_equal"] and rec["restored_tier"] == "shm" and rec["restored_step"] >= 10
    j = Journal.load(tmp_path / "out" / "faulted")
    skipped = {e["step"]: e["scale"] for e in j.events("amp_step_skipped", 0)}
    # the scale moved before the kill: steps 0 and 1 overflowed at 2^24 and 2^23, then it grew again
    assert skipped.get(0) == 2.0**24 and skipped.get(1) == 2.0**23 and any(2 < s < 11 for s in skipped), skipped
    # every rank skipped the same steps (an overflow on one stage skips the step on both)
    assert all({e["step"] for e in j.events("amp_step_skipped", r)} == set(skipped) for r in (1, 2, 3))
    assert "scaler" in j.events("state", 0)[-1]["digests"]


def test_fp16_on_fsdp2_shards_resumes_bit_for_bit_after_a_torn_copy_and_a_node_lost(tmp_path: Path,
                                                                                    ref_cache: Path) -> None:
    """The scaler unscales DTensor gradient shards; its state comes back from memory and from the peer."""
    rc, out, v = run_cli(ROOT / "scenarios/ci/amp-fp16-fsdp.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["bitwise_equal"] and [t for t, _ in _recoveries(v)] == ["shm", "peer+shm"], v["recoveries"]
    j = Journal.load(tmp_path / "out" / "faulted")
    skipped = {e["step"] for e in j.events("amp_step_skipped", 0)}
    assert {0, 1} <= skipped and any(5 < s < 13 for s in skipped), skipped  # the scale moved between the faults
    assert all({e["step"] for e in j.events("amp_step_skipped", r)} == skipped for r in (1, 2, 3))
    assert _peer_ranks(tmp_path / "out" / "faulted") == {2, 3}


@pytest.mark.parametrize("name, tiers", [("amp-bf16-tp", ["shm"]), ("amp-bf16-fsdp", ["shm", "peer+shm"])])
def test_bf16_autocast_on_sharded_stages_resumes_bit_for_bit(name: str, tiers: list[str], tmp_path: Path,
                                                             ref_cache: Path) -> None:
    rc, out, v = run_cli(ROOT / f"scenarios/ci/{name}.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["bitwise_equal"] and [t for t, _ in _recoveries(v)] == tiers, v["recoveries"]
    assert "scaler" not in Journal.load(tmp_path / "out" / "faulted").events("state", 0)[-1]["digests"]  # no scaler


def test_a_pipeline_cut_into_fewer_stages_restores_by_name_and_says_what_it_could_not_carry(
        tmp_path: Path, ref_cache: Path) -> None:
    """PP4 on two nodes loses node 1 for good and goes on as PP2 (``resize: stages``): each new stage's model
    and moments come by name from the old stages that held them, scheduler, data position and step from the
    old rank where it begins; the verdict names the dropout streams it could not carry."""
    rc, out, v = run_cli(ROOT / "scenarios/ci/elastic-restage.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    (rec,) = v["recoveries"]
    assert rec["restored_tier"] == "persistent" and rec["restaged"].startswith("4 -> 2 stages; not carried: rng")
    assert "restaged 4 -> 2 stages; not carried: rng" in out and v["world_size"]["sizes"] == [4, 2]
    ref, run = Journal.load(tmp_path / "out" / "reference"), Journal.load(tmp_path / "out" / "faulted")
    step = rec["restored_step"]

    def state(j: Journal, rank: int, incarnation: int | None = None) -> dict[str, Any]:
        return next(e["digests"] for e in j.events("state", rank)
                    if e["step"] == step and incarnation in (None, e["incarnation"]))

    for new, begins_at, old in ((0, 0, (0, 1)), (1, 2, (2, 3))):
        restored, was = state(run, new, 1), state(ref, begins_at)
        assert all(restored[c] == was[c] for c in ("scheduler", "data", "step", "rng")), new
        whole = {k: d for o in old for k, d in state(ref, o)["model"].items()}
        assert restored["model"] == {k: whole[k] for k in restored["model"]} and len(restored["model"]) > len(was["model"])


def test_a_stage_major_shrink_that_memory_cannot_serve_restores_each_stage_from_the_persistent_tier(
        tmp_path: Path, ref_cache: Path) -> None:
    """No peer replicas: node 2's copies are lost with it and every rank of the shrunk world restores step 10 from
    DCP, each from the record of an old rank of its own stage (by rank number new rank 2 loaded stage 0's)."""
    rc, out, v = run_cli(ROOT / "scenarios/ci/elastic-stage-major-persistent.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["world_size"] == {"reference": 6, "final": 4, "sizes": [6, 4]} and v["completed"] and v["bitwise_equal"]
    (rec,) = v["recoveries"]
    assert (rec["restored_tier"], rec["restored_step"]) == ("persistent", 10), rec
    j = Journal.load(tmp_path / "out" / "faulted")
    lost = min(e["t"] for e in j.events("fault"))
    assert {e["rank"]: e["tier"] for e in j.events("checkpoint_restored") if e["t"] > lost} == \
        {r: "persistent" for r in range(4)}
    assert not [f for f in v["worker_failures"] if not f["explained"]], v["worker_failures"]


def test_a_stage_major_job_shrinks_from_three_replicas_to_two(tmp_path: Path, ref_cache: Path) -> None:
    """The old ranks of a stage come from the old world's map, not from rank arithmetic: after the shrink
    new rank 2 holds stage 1, where old rank 2 held stage 0."""
    rc, out, v = run_cli(ROOT / "scenarios/ci/elastic-stage-major.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["world_size"] == {"reference": 6, "final": 4, "sizes": [6, 4]} and v["completed"]
    assert v["bitwise_equal"] and v["states_compared"] > 0 and v["resized_records"] > 0
    assert v["loss_curve"]["passed"]
    (rec,) = v["recoveries"]
    run = tmp_path / "out" / "faulted"
    j = Journal.load(run)
    lost, sent = delivered(run, 2, [4, 5])  # node 2's ranks: replicas 1 and 2 of stage 1
    floor = max((e["step"] for e in j.events("checkpoint_saved", 0) if e["tier"] == "persistent" and e["t"] < lost),
                default=-1)
    fresh = {s for s in sent if s >= floor}
    if fresh:  # node 2's replicas had reached node 0's store: the restore must rebuild in memory
        assert rec["restored_tier"] in ("shm", "peer") and rec["restored_step"] >= max(fresh), (rec, floor, sent)
        restored = {e["rank"]: e.get("resized_from") for e in j.events("checkpoint_restored") if e["t"] > lost}
        assert restored == {0: 3, 1: 3, 2: 3, 3: 3}, restored  # each from its stage's three old replicas
    else:  # replication had not delivered a version as new as the persistent one: DCP reshards that
        assert (rec["restored_tier"], rec["restored_step"]) == ("persistent", floor) or (
            rec["restored_tier"] in ("shm", "peer") and rec["restored_step"] >= floor), (rec, floor, sent)
    assert {e["world_size"] for e in j.events("start", 0)} == {6, 4}
