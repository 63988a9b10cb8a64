"""Each in-worker injector and the hang watchdog, end to end through ``baft run``."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from baft.persist import commits as persist
from baft.persist.interval import every_for

from analysis.journal import Journal
from injectors.process import KillConfig

from .conftest import ROOT, delivered, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
CI = ROOT / "scenarios" / "ci"


def test_segfault_is_a_real_crash_and_is_recovered(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(CI / "crash-segfault.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["bitwise_equal"] and v["recoveries"][0]["restored_tier"] == "persistent"
    log = (tmp_path / "out" / "faulted" / "logs" / "node0.log").read_text()
    # The worker died of a real SIGSEGV: faulthandler prints this only from the signal's handler, then
    # re-raises it. (torchrun's log names the first failed worker it polls, which with forked workers
    # may be the survivor that lost its peer rather than the crashed one, so it is not the evidence.)
    assert "Fatal Python error: Segmentation fault" in log and "in string_at" in log
    assert "failed (exitcode:" in log  # and torchrun saw its workers fail


@pytest.mark.serial  # its effect is a time: alone
def test_hang_is_detected_by_the_watchdog_and_restarted(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(CI / "hang-watchdog.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    rec = v["recoveries"][0]
    # Never before the journal has been silent for hang_timeout; the upper bound is generous because the
    # watchdog's poll and the journal's last write both slip on a loaded machine.
    hang_timeout = yaml.safe_load((CI / "hang-watchdog.yaml").read_text())["run"]["hang_timeout"]
    assert hang_timeout <= rec["detection_seconds"], rec  # never before the watchdog's timeout
    assert rec["restored_tier"] == "shm" and v["bitwise_equal"]
    j = Journal.load(tmp_path / "out" / "faulted")
    (hang,) = [e for e in j.launcher if e["event"] == "hang_detected"]
    assert hang["stopped_pids"] and hang["stopped_pids"] == hang["killed_pids"]
    assert "hang detected after" in out


# alone: baft must see the jitter's drift; under a loaded parallel part the windows drifted before it (idle 51 ->
# 175 ms at step 5) and the re-planned windows already held the jitter's
@pytest.mark.serial
def test_loader_jitter_makes_baft_replan_and_changes_no_sample(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(CI / "jitter-drift.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["bitwise_equal"]
    j = Journal.load(tmp_path / "out" / "faulted")
    fired = [e for e in j.events("fault") if e["fault"] == "jitter"]
    drifts = [e for e in j.events("replan") if "drifted" in e["reason"] and e["t"] > fired[0]["t"]]
    assert drifts, "the jitter did not make baft re-plan"
    (window,) = v["windows"]
    assert window["from_step"] == 8 and window["effects"]["delay_seconds"] >= 0.15 * 5


@pytest.mark.serial  # its effect is a time: alone
def test_straggler_slows_one_rank_and_stays_bitwise(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(CI / "straggler.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    (window,) = v["windows"]
    assert window["from_step"] == 6 and window["to_step"] == 14 and window["effects"]["added_seconds"] > 0.1
    j = Journal.load(tmp_path / "out" / "faulted")
    # The idling the straggler journaled happened inside rank 1's steps of the window (a fact, whatever the load).
    in_window = sum(e["seconds"] for e in j.events("step", 1) if 6 <= e["step"] < 14)
    assert in_window >= window["effects"]["added_seconds"] - 1e-3
    # And the idling is a large part of those steps: factor 3 idles twice the compute, about 60% of a window
    # step here. Whether the steps get longer is not asserted: on an oversubscribed core (CI's parallel part
    # beside this test) rank 1's sleep hands the core to rank 0, and the pipeline's step time stays what the
    # shared core allows (CI once measured 0.221 s in the window against 0.232 s after it).
    window_steps = [e["seconds"] for e in j.events("step", 1) if 6 <= e["step"] < 14]
    per_step = window["effects"]["added_seconds"] / len(window_steps)
    assert per_step >= 0.25 * sorted(window_steps)[len(window_steps) // 2]


def test_periodic_kill_fires_at_each_period(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(CI / "kill-periodic.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    j = Journal.load(tmp_path / "out" / "faulted")
    assert [(e["step"], e["occurrence"]) for e in j.events("fault")] == [(5, 0), (12, 1), (19, 2)]
    assert [r["restored_step"] for r in v["recoveries"]] == [4, 11, 18]


def test_random_failures_are_seeded_and_journaled(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(CI / "kill-mtbf.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    faults = Journal.load(tmp_path / "out" / "faulted").events("fault")
    assert [e["occurrence"] for e in faults] == [0, 1]
    assert all(e["seed"] == 236 and e["mtbf"] == 3 for e in faults)
    # Each fired no earlier than its seeded draw (load can only make a firing later).
    due = KillConfig(rank=1, mtbf=3, seed=236, times=2).time_occurrences()
    assert [round(t, 1) for t in due] == [3.4, 5.4]  # what the scenario's description promises
    assert all(e["elapsed"] >= t for e, t in zip(faults, due)), (faults, due)
    # the persistent interval adapted (checkpoint.mtbf_hours): every rank decided the same at the same
    # steps, to Daly's interval for the cost they agreed on, and both persisted the same steps
    j = Journal.load(tmp_path / "out" / "faulted")
    assert v["interval_changes"], out
    changed = {r: [(e["step"], e["every"], e["cost_seconds"]) for e in j.events("interval_changed") if e["rank"] == r]
               for r in (0, 1)}
    assert changed[0] == changed[1] and changed[0]
    for e in j.events("interval_changed"):
        assert e["every"] == every_for(e["cost_seconds"], e["mtbf_seconds"], e["iteration_seconds"], 2, 100)
    saved = {r: sorted(e["step"] for e in j.events("checkpoint_saved") if e["rank"] == r and e["tier"] == "persistent")
             for r in (0, 1)}
    # (a killed rank may not journal the persist it was in when its peer did: one per kill at most)
    assert len(set(saved[0]) ^ set(saved[1])) <= len(faults) and any(b - a != 20 for a, b in zip(saved[0], saved[0][1:]))
    assert "persist interval step" in out


def test_corrupt_checkpoint_is_rejected_and_the_job_falls_back(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(CI / "storage-corrupt.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert [c["step"] for c in v["checkpoints_rejected"]] == [12] and "checksum" in v["checkpoints_rejected"][0]["reason"]
    assert v["recoveries"][0]["restored_step"] == 8 and v["bitwise_equal"]


@pytest.mark.skipif(os.geteuid() != 0, reason="disk_full mounts a tmpfs for the checkpoints: needs root")
def test_full_disk_fails_writes_loudly_and_keeps_the_last_good_checkpoint(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(CI / "storage-disk-full.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert [c["step"] for c in v["checkpoints_failed"]] == [8, 10, 12, 14]
    assert all("No space left" in c["reason"] for c in v["checkpoints_failed"])
    assert v["recoveries"][0]["restored_step"] == 6 and v["bitwise_equal"]
    root = tmp_path / "out" / "faulted" / "checkpoints"
    assert not os.path.ismount(root)  # unmounted, files kept
    assert persist.committed_steps(root)[0] == 20


@pytest.mark.serial  # its effect is a time: alone
def test_slow_storage_delays_persistence_not_training(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(CI / "storage-slow.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["bitwise_equal"]
    # Persistence was delayed: each write in the window slept delay_ms (400 ms); only those are effects.
    (window,) = v["windows"]
    writes = window["effects"]["writes"]
    assert writes >= 2 and window["effects"] == {"writes": writes, "delay_seconds": round(writes * 0.4, 4)}
    # Training was not: every delayed write of version s (in the window from step 4, the end-of-run one aside)
    # was still in flight when iteration s + 1 finished, i.e. training went on while the write slept. (A
    # write that blocked training would be journaled between iterations s and s + 1.)
    j = Journal.load(tmp_path / "out" / "faulted")
    for rank, evs in j.ranks.items():
        delayed = 0
        for i, e in enumerate(evs):
            if e["event"] == "checkpoint_saved" and e["tier"] == "persistent" and 4 <= e["step"] < 20:
                done = [x["step"] for x in evs[:i] if x["event"] == "step" and x["incarnation"] == e["incarnation"]]
                assert done and max(done) > e["step"], (rank, e["step"], done)
                delayed += 1
        assert delayed >= 2, rank


def test_a_node_lost_for_good_shrinks_the_job_and_joining_again_grows_it(tmp_path: Path, ref_cache: Path) -> None:
    """Node 1 is lost for good at step 8 (the job goes on at half the ranks) and joins again at step 14."""
    rc, out, v = run_cli(CI / "elastic-node-join.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["world_size"] == {"reference": 4, "final": 4, "sizes": [4, 2, 4]} and v["completed"]
    assert "world size       4 -> 2 -> 4 ranks" in out
    assert v["bitwise_equal"] and v["states_compared"] > 0 and v["resized_records"] > 0
    assert v["loss_curve"]["passed"] and v["loss_curve"]["equivalence"]["equivalent"]
    loss, join = v["recoveries"]
    assert (loss["fault"]["fault"], join["fault"]["fault"]) == ("node_loss", "node_join")
    j = Journal.load(tmp_path / "out" / "faulted")
    # The loss: which tier it restored from depends on how far replication had got when node 1 vanished (under
    # a loaded CI machine the peer's replicas lag): the restore takes the freshest copy every rank can get, never
    # older than a version both of node 1's ranks had delivered to node 0's store nor than the newest persistent
    # checkpoint journaled before the loss. The persistent checkpoint in flight at the loss may still commit
    # (rank 0 writes the manifest once every rank's file is written) without any rank journaling it, as its
    # peers are gone: then it is the freshest copy.
    lost, sent = delivered(tmp_path / "out" / "faulted", 1, [2, 3])
    floor = max([e["step"] for e in j.events("checkpoint_saved", 0) if e["tier"] == "persistent" and e["t"] < lost],
                default=0)
    newest = max([s for s in sent if s >= floor], default=floor)
    assert loss["restored_tier"] in ("shm", "persistent") and loss["restored_step"] >= newest, (loss, floor, sent)
    assert loss["lost_steps"] <= 2 and join["lost_steps"] <= 2
    # The join: rank 0 held at step 14 until the job re-formed there; the ranks restored a version of the
    # shrunk job (from node 0's memory, the joined node's fresh store fed by it, or the persistent tier).
    assert join["fault"]["step"] == 14 and join["restored_step"] >= 12, join
    shrunk = {e["incarnation"] for e in j.events("start", 0) if e["world_size"] == 2}
    assert len(shrunk) == 1 and all(e["resized"] for e in j.events("step", 0) if e["incarnation"] >= min(shrunk))
    # Every rank of the grown world starts in the same incarnation; ranks 2 and 3 skipped the one they were away.
    grown = {r: [e["incarnation"] for e in j.events("start", r)] for r in range(4)}
    assert grown[0] == grown[1] == [0, 1, 2] and grown[2] == grown[3] == [0, 2], grown
    launcher = [e for e in j.launcher if e.get("node") == "node1"]
    assert [e["event"] for e in launcher if e["event"] in ("store_start", "agent_start", "node_join")] == [
        "store_start", "agent_start", "store_start", "agent_start", "node_join"]
    assert [e.get("reason") for e in launcher if e["event"] == "agent_start"] == [None, "joined"]
    exits = {e["node"]: e["returncode"] for e in j.launcher if e["event"] == "agent_exit" and e.get("reason") != "lost"}
    assert exits == {"node0": 0, "node1": 0}  # the joined node's agent ends well with the job


def test_a_thread_holding_the_gil_stops_the_rank_and_the_watchdog_recovers_the_job(tmp_path: Path,
                                                                                   ref_cache: Path) -> None:
    """Issue 54: no process is stopped (its gloo threads run on), so the watchdog kills every worker."""
    rc, out, v = run_cli(CI / "hang-gil.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    rec, = v["recoveries"]
    assert rec["detection_seconds"] is not None and rec["lost_steps"] <= 1
    (hang,) = [e for e in Journal.load(tmp_path / "out" / "faulted").launcher if e["event"] == "hang_detected"]
    assert hang["stopped_pids"] == [] and len(hang["killed_pids"]) >= 2  # the workers (and what they started)


def test_an_exception_raised_asynchronously_in_the_training_thread_kills_the_rank(tmp_path: Path,
                                                                                  ref_cache: Path) -> None:
    rc, out, v = run_cli(CI / "crash-async-exception.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    rec, = v["recoveries"]
    assert rec["lost_steps"] <= 1 and v["bitwise_equal"]
    errors = [json.loads(p.read_text()) for p in (tmp_path / "out" / "faulted" / "logs").rglob("error.json")]
    assert any("AsyncInjectedCrash" in json.dumps(e) for e in errors), errors
