"""The reference cache: keyed on all the code a worker runs, and safe to share between processes."""
from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from harness.run import runner
from harness.run.launcher import LaunchResult
from harness.worker.workload import WorkloadConfig

ROOT = Path(__file__).resolve().parents[2]


def test_the_key_covers_every_file_a_worker_runs() -> None:
    files = {f.relative_to(ROOT).as_posix() for f in runner.training_code(ROOT)}
    # the probe and the session write the cached journal; the old key left them out
    for must in ("harness/worker/probe.py", "harness/worker/session.py", "harness/worker/workload.py",
                 "baft/state/train.py", "baft/strategies/baft/strategy.py", "analysis/journal.py"):
        assert must in files, must


def test_the_key_changes_with_any_worker_file(tmp_path: Path) -> None:
    for rel in runner._TRAINING_CODE:
        src = ROOT / rel
        if src.is_dir():
            shutil.copytree(src, tmp_path / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, tmp_path / rel)
    w = WorkloadConfig()
    before = runner.reference_key(w, tmp_path)
    assert runner.reference_key(w, tmp_path) == before
    for rel in ("harness/worker/probe.py", "baft/strategies/sync.py"):
        with open(tmp_path / rel, "a") as f:
            f.write("\n# changed\n")
        assert runner.reference_key(w, tmp_path) != before, rel
        before = runner.reference_key(w, tmp_path)


def test_concurrent_callers_run_the_reference_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[Path] = []

    def fake_launch(run_dir: Path, spec: object, config: object) -> LaunchResult:
        calls.append(run_dir)
        (run_dir / "journal").mkdir(parents=True)
        time.sleep(0.3)  # long enough that the other callers arrive while it runs
        (run_dir / "journal" / "launcher.jsonl").write_text("{}\n")
        return LaunchResult(returncodes=[0], seconds=0.3, timed_out=False)

    monkeypatch.setattr(runner, "launch", fake_launch)
    results: list[runner.Reference] = []
    threads = [threading.Thread(target=lambda: results.append(runner.ensure_reference(WorkloadConfig(), tmp_path, 10)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert sorted(r.cached for r in results) == [False, True, True]
    assert len({r.run_dir for r in results}) == 1 and (results[0].run_dir / "complete").is_file()


def test_a_failed_reference_is_not_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(runner, "launch", lambda run_dir, spec, config: LaunchResult(returncodes=[1], seconds=0.1, timed_out=False))
    with pytest.raises(runner.LaunchError):
        runner.ensure_reference(WorkloadConfig(), tmp_path, 10)
    assert not [p for p in (tmp_path / "reference").iterdir() if p.suffix != ".lock" and (p / "complete").exists()]


def test_the_built_in_reference_runs_on_one_node_and_a_script_keeps_its_nodes(monkeypatch: pytest.MonkeyPatch,
                                                                              tmp_path: Path) -> None:
    two = WorkloadConfig(stages=2, data_parallel=2, nodes=2)
    assert runner.reference_key(two) == runner.reference_key(WorkloadConfig(stages=2, data_parallel=2, nodes=1))
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    assert (runner.reference_key(WorkloadConfig(script=str(script), nproc=2, nodes=2))
            != runner.reference_key(WorkloadConfig(script=str(script), nproc=2, nodes=1)))
    launched = []

    def fake_launch(run_dir: Path, spec, config):
        launched.append((spec.workload.nodes, config.nodes, config.world_size))
        (run_dir / "journal").mkdir(parents=True)
        return LaunchResult(returncodes=[0], timed_out=False, seconds=0.1)

    monkeypatch.setattr(runner, "launch", fake_launch)
    runner.ensure_reference(two, tmp_path / "cache", timeout=60)
    assert launched == [(1, 1, 4)]  # the four ranks on one agent


def _journal(run_dir: Path, rank_steps: int | None) -> None:
    from analysis.journal import JournalWriter, launcher_journal

    w = JournalWriter(launcher_journal(run_dir))
    w.write("hang_detected", silent_seconds=5.2, timeout=5.0, stopped_pids=[], killed_pids=[1])
    w.close()
    if rank_steps is not None:
        r = JournalWriter(run_dir / "journal" / "rank-0" / "events.jsonl", rank=0)
        r.write("start", incarnation=0)
        for s in range(rank_steps):
            r.write("step", step=s, incarnation=0)
        r.close()


@pytest.mark.parametrize(("rank_steps", "says"), [
    (None, "no optimizer step within 5 s of the start (run.startup_timeout)"),  # killed while still importing
    (0, "no optimizer step within 5 s of the start (run.startup_timeout)"),
    (3, "the job made no progress for 5 s (a hang; run.hang_timeout)"),
])
def test_a_stopped_reference_says_why_also_before_any_rank_journalled(tmp_path: Path, rank_steps: int | None,
                                                                      says: str) -> None:
    _journal(tmp_path, rank_steps)
    assert says in (runner.silence(tmp_path, 5.0) or "")


def test_a_reference_the_watchdog_never_stopped_has_no_silence(tmp_path: Path) -> None:
    (tmp_path / "journal").mkdir()
    assert runner.silence(tmp_path, 5.0) is None
