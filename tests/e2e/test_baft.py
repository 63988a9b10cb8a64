"""BAFT end to end: per-iteration snapshots in shared memory, restored after a kill."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from analysis.journal import Journal

from .conftest import ROOT, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_baft_loses_at_most_one_iteration(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(ROOT / "scenarios/smoke/baft-kill.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v is not None and v["bitwise_equal"]
    rec = v["recoveries"][0]
    assert rec["restored_tier"] == "shm" and rec["restored_step"] == 16 and v["lost_steps"] == 1
    j = Journal.load(tmp_path / "out" / "faulted")
    for rank in j.ranks:
        snaps = j.events("snapshot", rank)
        # A snapshot of every version; after the restart, 16 is restored from shm and not copied again.
        assert {e["step"] for e in snaps} == set(range(30))
        assert sorted(e["step"] for e in snaps if e["incarnation"] == 1) == list(range(17, 30))
        replans = [e["reason"] for e in j.events("replan", rank)]
        assert "initial profile" in replans
        bubbles = j.events("bubbles", rank)
        assert bubbles and all(b["windows"] > 0 for b in bubbles)
    # The run's snapshots lived in the directory the harness claimed (/dev/shm/baft-<12 hex digits>, see
    # harness.run.leftovers.claim_shm): the workers were told it and restored from inside it, and it is gone.
    shm = Path(json.loads((tmp_path / "out" / "faulted" / "worker-spec.json").read_text())["checkpoint"]["baft"]["shm_dir"])
    assert shm.parent == Path("/dev/shm") and re.fullmatch(r"baft-[0-9a-f]{12}", shm.name), shm
    restored_from = {Path(e["path"]) for e in j.events("checkpoint_restored")}
    assert restored_from and all(shm in p.parents for p in restored_from), (shm, restored_from)
    assert not shm.exists(), f"{shm} was left behind"


def test_baft_data_parallel_shards_the_copy(tmp_path: Path, ref_cache: Path) -> None:
    scenario = {
        "name": "baft-dp2",
        "workload": {"model": "mlp", "stages": 2, "data_parallel": 2, "microbatches": 4, "schedule": "gpipe", "steps": 16, "nodes": 2},
        "checkpoint": {"strategy": "baft", "every": 10},
        "faults": [{"kill": {"rank": 2, "at_step": 11}}],
        "expect": {"bitwise": True, "max_lost_steps": 1},
    }
    rc, out, v = run_cli(scenario, tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v is not None and v["recoveries"][0]["restored_tier"] == "shm" and v["lost_steps"] == 1
    j = Journal.load(tmp_path / "out" / "faulted")
    # Replicas of a stage copy disjoint halves: together exactly the stage's state.
    b0 = j.events("snapshot", 0)[-1]["bytes"]
    b2 = j.events("snapshot", 2)[-1]["bytes"]
    assert b0 > 0 and b2 > 0 and abs(b0 - b2) <= max(b0, b2) // 2


def test_a_kill_in_the_first_iteration_restores_the_untrained_snapshot_bitwise(tmp_path: Path,
                                                                              ref_cache: Path) -> None:
    """The snapshot of boundary 0 is taken before the data loader drew its first permutation; restoring it
    once replayed that draw, leaving the loader's generator one draw ahead (found by kill-mtbf on a busy
    machine, where the random kill landed in step 1)."""
    scenario = {
        "name": "baft-first-snapshot",
        "workload": {"model": "gpt-tiny", "stages": 2, "microbatches": 4, "steps": 8, "seed": 8},
        "checkpoint": {"strategy": "baft", "every": 40},
        # Rank 0 in step 1's first forward: it sealed version 0 before its step-0 optimizer step, and rank 1
        # seals it before rank 0 gets its last gradient. (Rank 1 killed as step 1 began once found rank 0
        # still in step 0's last backward, version 0 not sealed there: a restart from scratch.)
        "faults": [{"kill": {"rank": 0, "at_step": 1, "phase": "forward", "signal": "SIGTERM"}}],
        "expect": {"bitwise": True, "max_lost_steps": 1},
    }
    rc, out, v = run_cli(scenario, tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v is not None and v["recoveries"][0]["restored_step"] == 0 and v["recoveries"][0]["restored_tier"] == "shm"


def test_baft_on_the_zero_bubble_zbv_schedule_survives_a_fault_at_every_phase(tmp_path: Path, ref_cache: Path) -> None:
    """ZB-V: two chunks per rank in a V, every backward split into input and weight passes. A kill in each
    phase baft announces and in the weight pass; each time training continues bit for bit, and the profiler saw
    the weight passes and the windows that remain."""
    rc, out, v = run_cli(ROOT / "scenarios/ci/baft-zbv.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["bitwise_equal"] and [r["fault"]["phase"] for r in v["recoveries"]] == \
        ["snapshot", "replicate", "persist", "backward_weight"]
    j = Journal.load(tmp_path / "out" / "faulted")
    for rank in (0, 1):
        spans = {s[0] for e in j.events("timeline", rank) for s in e["spans"]}
        assert {"forward", "backward", "backward_weight", "wait"} <= spans, (rank, spans)
        assert all(b["windows"] > 0 for b in j.events("bubbles", rank))


def test_faults_during_a_restore_each_recover_to_what_every_rank_can_still_get(tmp_path: Path, ref_cache: Path) -> None:
    """The double fault in each step of baft's restore: a kill as restart 1 locates its copies, a node lost again
    while its replacement pulls from the peer; then a kill while the persistent tier loads. Bit for bit."""
    rc, out, v = run_cli(ROOT / "scenarios/ci/baft-faults-during-restore.yaml", tmp_path / "a", ref_cache)
    assert rc == 0, out
    recs = v["recoveries"]
    assert [(r["fault"].get("at_restore"), r["fault"]["phase"]) for r in recs] == \
        [(None, "iteration"), (1, "restore_locate"), (None, "iteration"), (3, "restore_pull")]
    assert recs[1]["restored_tier"] == "shm" and "peer" in recs[3]["restored_tier"] and v["bitwise_equal"]
    assert "kill rank 0 in restart 1's restore (restore_locate)" in out
    rc, out, v = run_cli(ROOT / "scenarios/ci/baft-kill-during-persistent-load.yaml", tmp_path / "b", ref_cache)
    assert rc == 0, out
    first, second = v["recoveries"]
    assert second["fault"]["phase"] == "restore_load" and first["restored_tier"] == second["restored_tier"] == "persistent"
    assert second["restored_step"] == first["restored_step"] and v["bitwise_equal"]


def test_baft_interleaved_schedule(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(ROOT / "scenarios/ci/baft-interleaved.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["recoveries"][0]["restored_tier"] == "shm" and v["lost_steps"] == 1
    j = Journal.load(tmp_path / "out" / "faulted")
    windows = {b["windows"] for b in j.events("bubbles", 0)}
    assert min(windows) > 20  # two chunks per rank: many short windows, all profiled
