"""Bitwise comparison and recovery metrics over hand-made journals."""
from __future__ import annotations

from pathlib import Path

from analysis.compare import compare
from analysis.journal import Journal, JournalWriter, float_bits, rank_journal
from analysis.metrics import recoveries
from analysis.verdict import ExpectConfig, judge


def digests(step: int, rng: str = "r") -> dict:
    return {"model": {"w": f"w{step}"}, "optimizer": {"state.w.exp_avg": f"m{step}"}, "rng": {"torch": f"{rng}{step}"}}


def write_run(root: Path, ranks: int, steps: int, *, kill_at: int | None = None, restore: int = 0, bad_rng_after: bool = False) -> Journal:
    for r in range(ranks):
        w = JournalWriter(rank_journal(root, r), rank=r, attempt=0)
        w.write("start", node="node0")
        w.write("state", step=0, digests=digests(0))
        stop = kill_at if kill_at is not None else steps
        for s in range(stop):
            w.write("step", step=s, loss=1.0 / (s + 1), loss_bits=float_bits(1.0 / (s + 1)))
            w.write("state", step=s + 1, digests=digests(s + 1))
        if kill_at is not None:
            if r == 0:
                w.write("fault", fault="kill", id=0, step=kill_at, phase="iteration")
            w.write("start", node="node0")
            w.write("checkpoint_restored", step=restore, tier="persistent", seconds=0.1)
            w.write("state", step=restore, digests=digests(restore, "x" if bad_rng_after else "r"))
            for s in range(restore, steps):
                w.write("step", step=s, loss=1.0 / (s + 1), loss_bits=float_bits(1.0 / (s + 1)))
                w.write("state", step=s + 1, digests=digests(s + 1))
        w.write("finish", step=steps)
        w.close()
    return Journal.load(root)


def test_identical_runs(tmp_path: Path) -> None:
    ref = write_run(tmp_path / "ref", 2, 10)
    run = write_run(tmp_path / "run", 2, 10, kill_at=7, restore=5)
    c = compare(ref, run)
    assert c.equal and c.states_compared == 2 * (8 + 1 + 5)
    v = judge(ref, run, ExpectConfig(max_lost_steps=2), steps=10, faults_declared=1)
    assert v["passed"] and v["lost_steps"] == 2 and v["faults_fired"] == 1


def test_divergence_named(tmp_path: Path) -> None:
    ref = write_run(tmp_path / "ref", 2, 10)
    run = write_run(tmp_path / "run", 2, 10, kill_at=7, restore=5, bad_rng_after=True)
    first = compare(ref, run).first
    assert first is not None and (first.step, first.component, first.key) == (5, "rng", "torch")
    v = judge(ref, run, ExpectConfig(), steps=10, faults_declared=1)
    assert not v["passed"] and v["first_divergence"]["component"] == "rng"


def test_lost_steps_over_limit_fails(tmp_path: Path) -> None:
    ref = write_run(tmp_path / "ref", 1, 10)
    run = write_run(tmp_path / "run", 1, 10, kill_at=9, restore=0)
    v = judge(ref, run, ExpectConfig(max_lost_steps=5), steps=10, faults_declared=1)
    assert v["bitwise_equal"] and v["lost_steps"] == 9 and not v["passed"]
    assert recoveries(run)[0].restored_step == 0


def test_fault_that_never_fired_fails(tmp_path: Path) -> None:
    ref = write_run(tmp_path / "ref", 1, 5)
    run = write_run(tmp_path / "run", 1, 5)
    v = judge(ref, run, ExpectConfig(), steps=5, faults_declared=1)
    assert not v["passed"] and any("fired" in f for f in v["failures"])


def test_incomplete_run_fails(tmp_path: Path) -> None:
    ref = write_run(tmp_path / "ref", 1, 5)
    run = write_run(tmp_path / "run", 1, 3)
    v = judge(ref, run, ExpectConfig(), steps=5, faults_declared=0)
    assert not v["passed"] and not v["completed"]


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    write_run(tmp_path, 1, 2)
    p = rank_journal(tmp_path, 0)
    p.write_text(p.read_text() + '{"t": 1, "event": "st')
    assert Journal.load(tmp_path).events("finish", 0)
