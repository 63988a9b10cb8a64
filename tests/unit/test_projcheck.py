"""The projection checked against a run: a run's profile read from its journals, its recoveries predicted by the
projection's rules and compared with what it measured; ``baft project --check`` and ``--from``."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analysis.journal import Journal
from analysis.metrics import recoveries
from analysis.profile import profile_of_run, read_profile
from analysis.projcheck import Launch, TierRule, check_run, summarize
from harness.cli import main as cli_main

T0 = 1_700_000_000.0
ITER, REF_ITER = 0.11, 0.10


def _write(path: Path, events: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")


def _reference(root: Path) -> None:
    for r in range(2):
        evs = [{"t": T0, "event": "start", "rank": r, "attempt": 0, "world_size": 2, "created": T0 - 0.5}]
        evs += [{"t": T0 + (s + 1) * REF_ITER, "event": "step", "rank": r, "attempt": 0, "step": s, "seconds": REF_ITER}
                for s in range(20)]
        _write(root / "journal" / f"rank-{r}" / "events.jsonl", evs + [{"t": T0 + 3, "event": "finish", "rank": r,
                                                                         "attempt": 0, "step": 20}])


def _faulted(root: Path, fault: str = "kill", persist_every: int = 5, restored: tuple[int, str] = (11, "shm"),
             nodes: int = 1) -> None:
    """Two ranks of baft, snapshotting every step (1 ms stall), persisting every ``persist_every``; the fault
    fires 1 ms into step 12 (12 steps done); the job restarts 0.8 s later and restores ``restored``."""
    t_fault = T0 + 12 * ITER + 0.001
    launcher = [{"t": T0 - 1, "event": "agent_start", "node": "node0"}]
    for r in range(2):
        a = {"rank": r, "attempt": 0}
        evs = [{"t": T0, "event": "start", **a, "world_size": 2, "created": T0 - 0.4, "node": f"node{r % nodes}"}]
        for s in range(12):
            t = T0 + (s + 1) * ITER
            evs += [{"t": t - 0.05, "event": "snapshot", **a, "step": s, "tier": "shm", "bytes": 1_000_000,
                     "copy_seconds": 0.001, "stall_seconds": 0.001},
                    {"t": t, "event": "step", **a, "step": s, "seconds": ITER},
                    {"t": t, "event": "bubbles", **a, "step": s, "idle_seconds": 0.022, "iteration_seconds": ITER}]
            if s and s % persist_every == 0:
                evs.append({"t": t + 0.01, "event": "checkpoint_saved", **a, "step": s, "tier": "persistent",
                            "bytes": 1_000_000, "seconds": 0.05})
        if r == 1 and fault != "node_loss":
            evs.append({"t": t_fault, "event": "fault", **a, "fault": fault, "id": 0, "occurrence": 0, "fatal": True,
                        "step": 12, "phase": "iteration", "node": 0})
        t1 = t_fault + 0.8
        b = {"rank": r, "attempt": 1}
        evs += [{"t": t1, "event": "start", **b, "world_size": 2, "created": t1 - 0.4, "init_seconds": 0.05, "node": f"node{r % nodes}"},
                {"t": t1 + 0.1, "event": "checkpoint_restored", **b, "step": restored[0], "tier": restored[1],
                 "seconds": 0.01}]
        evs += [{"t": t1 + 0.1 + (s - restored[0] + 1) * ITER, "event": "step", **b, "step": s, "seconds": ITER}
                for s in range(restored[0], 20)]
        _write(root / "journal" / f"rank-{r}" / "events.jsonl", evs + [{"t": t1 + 2, "event": "finish", **b,
                                                                         "step": 20}])
    if fault == "node_loss":
        launcher.append({"t": t_fault, "event": "fault", "fault": "node_loss", "id": 0, "occurrence": 0,
                         "fatal": True, "step": 12, "phase": "iteration", "node": 1, "replacement": True})
    _write(root / "journal" / "launcher.jsonl", launcher)
    spec = {"workload": {"stages": 2, "nodes": nodes},
            "checkpoint": {"strategy": "baft", "every": persist_every, "baft": {"replication": {"replicas": 1}}}}
    (root / "worker-spec.json").write_text(json.dumps(spec))


def _run_dir(tmp: Path, **kw: Any) -> Path:
    run = tmp / "run"
    _reference(run / "reference")
    _faulted(run / "faulted", **kw)
    return run


def _check(run: Path, launch: Launch | None = None):
    journal = Journal.load(run / "faulted")
    return check_run("s", profile_of_run(run), journal, recoveries(journal), launch or Launch())


def test_the_profile_holds_the_runs_component_costs_and_none_of_its_outcomes(tmp_path: Path) -> None:
    p = profile_of_run(_run_dir(tmp_path))
    assert p.iteration_seconds == pytest.approx(REF_ITER)  # the reference's: no checkpointing
    assert p.bubble_share == pytest.approx(0.2) and p.stall_seconds == pytest.approx(0.001)
    assert p.snapshot_every == 1 and p.persist_every == 5 and p.persist_seconds == pytest.approx(0.05)
    assert p.copy_gbytes_per_s == pytest.approx(0.5)  # 1 MB in 2 ms
    assert p.start_seconds == pytest.approx(0.4) and p.first_step_seconds == pytest.approx(REF_ITER)
    assert p.restart_seconds is None  # no verdict.json: the recoveries are not read into a profile


def test_a_kill_is_predicted_to_restore_the_newest_memory_version_and_the_stall_share(tmp_path: Path) -> None:
    c = _check(_run_dir(tmp_path))
    (f,) = c.faults
    assert (f.progress, f.predicted_step, f.predicted_tier) == (12, 11, "shm")
    assert f.measured_step == 11 and f.predicted_lost == f.measured_lost == 1
    assert c.predicted_overhead == pytest.approx(0.01)  # 1 ms of 100 ms
    assert c.measured_overhead == pytest.approx(ITER / REF_ITER - 1)  # the run's own slowdown, not the model's
    # detection 0 + the run's own start 0.4 s + retrieval 2 ms + the reference's first step
    assert f.predicted_recovery == pytest.approx(0.4 + 0.002 + REF_ITER)
    assert f.measured_recovery == pytest.approx(0.8 + 0.1 + ITER)


def test_a_node_lost_without_peer_copies_falls_back_to_the_persistent_tier_and_the_error_shows(
        tmp_path: Path) -> None:
    run = _run_dir(tmp_path, fault="node_loss", restored=(11, "shm"), nodes=2)
    c = _check(run)  # no store journals: nothing was replicated, so only the persistent tier (every 5) survives
    (f,) = c.faults
    assert (f.predicted_step, f.predicted_tier) == (10, "persistent") and f.measured_step == 11
    s = summarize([c])
    assert s.lost_exact == 0 and s.lost_mean_abs_error == 1


def test_a_stall_waits_for_the_watchdog_in_the_prediction(tmp_path: Path) -> None:
    c = _check(_run_dir(tmp_path, fault="hang"), Launch(hang_timeout=5.0))
    assert c.faults[0].predicted_recovery == pytest.approx(5.0 + 0.4 + 0.002 + REF_ITER)


@given(every=st.integers(1, 64), ready=st.floats(0, 10), progress=st.floats(0, 500))
def test_a_tier_serves_its_newest_durable_version(every: int, ready: float, progress: float) -> None:
    v = TierRule(name="t", every=every, ready=ready, retrieval_seconds=0.0).newest(progress)
    assert v % every == 0 and 0 <= v
    if v > 0:
        assert v + ready <= progress + 1e-6  # durable when the fault fired
    assert v + every + ready > progress - 1e-6  # and no newer one was


SCENARIO = """name: synthetic
workload: {model: gpt-tiny, stages: 2, steps: 20}
checkpoint: {strategy: baft, every: 5}
faults:
  - kill: {rank: 1, at_step: 12}
run: {hang_timeout: 5}
"""


def test_the_command_checks_runs_and_refuses_a_target_with_it(tmp_path: Path, capsys) -> None:
    runs = tmp_path / "suite"
    runs.mkdir()
    for name in ("a", "b"):
        run = _run_dir(tmp_path / name)
        (run / "scenario.yaml").write_text(SCENARIO.replace("synthetic", name))
        (run / "verdict.json").write_text(json.dumps({"scenario": name, "passed": True, "failures": [], "recoveries": [
            r.to_json() for r in recoveries(Journal.load(run / "faulted"))]}))
        run.rename(runs / name)
    out = tmp_path / "out"
    assert cli_main(["project", "--check", str(runs), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "kill@12: restored 11 (shm) / 11 (shm), lost 1 / 1" in printed and "2 runs: lost steps 2 of 2 exact" in printed
    result = json.loads((out / "check.json").read_text())
    assert [r["scenario"] for r in result["runs"]] == ["a", "b"] and result["summary"]["lost_exact"] == 2
    # each run's relaunch comes from the other: 0.8 s restart + 0.1 s restore, as measured there
    assert result["runs"][0]["faults"][0]["predicted_recovery"] == pytest.approx(0.9 + 0.002 + REF_ITER, abs=0.01)
    assert cli_main(["project", "--check", str(runs), "--nodes", "8"]) == 2
    assert "takes no target (--nodes given)" in capsys.readouterr().err
    assert cli_main(["project", "--check", str(tmp_path / "nothing")]) == 2


def test_a_target_takes_what_the_run_measured_where_the_flags_say_nothing(tmp_path: Path, capsys) -> None:
    run = _run_dir(tmp_path)
    out = tmp_path / "out"
    assert cli_main(["project", "--from", str(run), "--out", str(out), "--iteration-seconds", "9"]) == 0
    printed = capsys.readouterr().out
    assert "bubble share 20.0%" in printed and "iteration" not in printed.split("target:")[0]
    target = json.loads((out / "projection.json").read_text())["target"]
    assert target["bubble_fraction"] == pytest.approx(0.2) and target["iteration_seconds"] == 9
    assert target["copy_gbps"] == pytest.approx(0.5)
    assert read_profile(run).state_bytes_per_rank == 1_000_000
    assert cli_main(["project", "--from", str(tmp_path / "missing"), "--out", str(out)]) == 2
