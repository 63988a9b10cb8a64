"""Bitwise comparison and recovery metrics over hand-made journals."""
from __future__ import annotations

from pathlib import Path

from analysis.compare import compare
from analysis.journal import Journal, JournalWriter, float_bits, rank_journal
from analysis.metrics import recoveries
from analysis.verdict import ExpectConfig, judge


def digests(step: int, rng: str = "r") -> dict:
    return {"model": {"w": f"w{step}"}, "optimizer": {"state.w.exp_avg": f"m{step}"}, "rng": {"torch": f"{rng}{step}"}}


def write_run(root: Path, ranks: int, steps: int, *, kill_at: int | None = None, restore: int = 0, bad_rng_after: bool = False,
              journal_fault: bool = True) -> Journal:
    for r in range(ranks):
        w = JournalWriter(rank_journal(root, r), rank=r, attempt=0)
        w.write("start", node="node0")
        w.write("state", step=0, digests=digests(0))
        stop = kill_at if kill_at is not None else steps
        for s in range(stop):
            w.write("step", step=s, loss=1.0 / (s + 1), loss_bits=float_bits(1.0 / (s + 1)))
            w.write("state", step=s + 1, digests=digests(s + 1))
        if kill_at is not None:
            if r == 0 and journal_fault:
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
    assert v.passed and v.lost_steps == 2 and v.faults_fired == 1


def test_a_restart_no_fault_explains_fails_the_run(tmp_path: Path) -> None:
    # the job restarted by itself (a hang its gloo timeout ended, a crash of its own) and resumed bit for bit
    ref = write_run(tmp_path / "ref", 2, 10)
    run = write_run(tmp_path / "run", 2, 10, kill_at=7, restore=7, journal_fault=False)
    v = judge(ref, run, ExpectConfig(), steps=10, faults_declared=0)
    assert v.bitwise_equal and v.completed and not v.passed
    assert v.failures == ["1 restart(s) that no fault explains (1 restarts, 0 fatal fault firings): the job itself "
                          "crashed, hung or timed out; see the logs/ of the run"]


def test_divergence_named(tmp_path: Path) -> None:
    ref = write_run(tmp_path / "ref", 2, 10)
    run = write_run(tmp_path / "run", 2, 10, kill_at=7, restore=5, bad_rng_after=True)
    first = compare(ref, run).first
    assert first is not None and (first.step, first.component, first.key) == (5, "rng", "torch")
    v = judge(ref, run, ExpectConfig(rng="strict"), steps=10, faults_declared=1)
    assert not v.passed and v.first_divergence is not None and v.first_divergence.component == "rng"
    latent = judge(ref, run, ExpectConfig(), steps=10, faults_declared=1)  # nothing drew from it: latent
    assert latent.passed and latent.first_divergence == v.first_divergence and latent.latent


def test_lost_steps_over_limit_fails(tmp_path: Path) -> None:
    ref = write_run(tmp_path / "ref", 1, 10)
    run = write_run(tmp_path / "run", 1, 10, kill_at=9, restore=0)
    v = judge(ref, run, ExpectConfig(max_lost_steps=5), steps=10, faults_declared=1)
    assert v.bitwise_equal and v.lost_steps == 9 and not v.passed
    assert recoveries(run)[0].restored_step == 0


def test_fault_that_never_fired_fails(tmp_path: Path) -> None:
    ref = write_run(tmp_path / "ref", 1, 5)
    run = write_run(tmp_path / "run", 1, 5)
    v = judge(ref, run, ExpectConfig(), steps=5, faults_declared=1)
    assert not v.passed and any("fired" in f for f in v.failures)


def test_incomplete_run_fails(tmp_path: Path) -> None:
    ref = write_run(tmp_path / "ref", 1, 5)
    run = write_run(tmp_path / "run", 1, 3)
    v = judge(ref, run, ExpectConfig(), steps=5, faults_declared=0)
    assert not v.passed and not v.completed


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    write_run(tmp_path, 1, 2)
    p = rank_journal(tmp_path, 0)
    p.write_text(p.read_text() + '{"t": 1, "event": "st')
    assert Journal.load(tmp_path).events("finish", 0)


def write_states(root: Path, states: list[tuple[dict, dict | None]]) -> Journal:
    """One rank's journal of ``state`` events (step i = states[i]); norms omitted where None."""
    w = JournalWriter(rank_journal(root, 0), rank=0, attempt=0)
    w.write("start", node="node0")
    for step, (dig, norms) in enumerate(states):
        w.write("state", step=step, digests=dig, **({"norms": norms} if norms is not None else {}))
    w.write("finish", step=len(states) - 1)
    w.close()
    return Journal.load(root)


def test_divergence_carries_norms_and_relative_change(tmp_path: Path) -> None:
    same = ({"model": {"w": "a", "n": "i"}}, {"model": {"w": 2.0}})
    ref = write_states(tmp_path / "ref", [same, ({"model": {"w": "b", "n": "i"}}, {"model": {"w": 4.0}})])
    run = write_states(tmp_path / "run", [same, ({"model": {"w": "c", "n": "j"}}, {"model": {"w": 5.0}})])
    c = compare(ref, run)
    by_key = {d.key: d for d in c.divergences}
    w = by_key["w"]
    assert (w.step, w.reference_norm, w.found_norm) == (1, 4.0, 5.0)
    assert w.relative_norm_change == 0.25
    d = w.to_json()
    assert (d["reference_norm"], d["found_norm"], d["relative_norm_change"]) == (4.0, 5.0, 0.25)
    n = by_key["n"].to_json()  # an integer leaf: digests differ, no norm journaled
    assert (n["reference_norm"], n["found_norm"], n["relative_norm_change"]) == (None, None, None)


def test_norms_absent_or_zero_give_no_relative_change(tmp_path: Path) -> None:
    ref = write_states(tmp_path / "ref", [({"model": {"w": "a"}}, None), ({"model": {"w": "b"}}, {"model": {"w": 0.0}})])
    run = write_states(tmp_path / "run", [({"model": {"w": "x"}}, {"model": {"w": 1.0}}),
                                          ({"model": {"w": "y"}}, {"model": {"w": 3.0}})])
    first, second = sorted(compare(ref, run).divergences, key=lambda d: d.step)
    assert (first.reference_norm, first.found_norm, first.relative_norm_change) == (None, 1.0, None)  # older reference
    assert (second.reference_norm, second.found_norm, second.relative_norm_change) == (0.0, 3.0, None)


def test_old_journals_without_norms_still_compare(tmp_path: Path) -> None:
    ref = write_run(tmp_path / "ref", 1, 4)
    run = write_run(tmp_path / "run", 1, 4, kill_at=3, restore=2, bad_rng_after=True)
    first = compare(ref, run).first
    assert first is not None and first.to_json()["relative_norm_change"] is None and first.found_norm is None


def test_probe_journals_norms_that_size_the_divergence(tmp_path: Path) -> None:
    """End to end: the probe's ``state`` events carry norms; a weight scaled by 1.5 reads as a 0.5 change."""
    import torch

    from baft import TrainState

    from harness.worker.probe import Probe

    def journal(root: Path, scale: float) -> Journal:
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4)
        with torch.no_grad():
            model.weight.mul_(scale)
        probe = Probe(root, rank=0, attempt=0, node="node0", world_size=1)
        probe.state(0, TrainState(model=model))
        probe.close(0)
        return Journal.load(root)

    ref, run = journal(tmp_path / "ref", 1.0), journal(tmp_path / "run", 1.5)
    assert "weight" in ref.events("state", 0)[0]["norms"]["model"]
    first = compare(ref, run).first
    assert first is not None and (first.component, first.key) == ("model", "weight")
    assert first.relative_norm_change is not None and abs(first.relative_norm_change - 0.5) < 1e-6
    assert {d.key for d in compare(ref, run).divergences} == {"weight"}


def test_a_step_resumed_mid_way_is_partial_for_the_bitwise_and_the_loss_curve_judges(tmp_path: Path) -> None:
    """The first step of a restarted process that made fewer backward calls than the reference's: its loss (a
    partial sum) is compared by neither judge; the state after it is. A later step's loss still is."""
    from analysis.losscurve import LossExpect

    def write(root: Path, resumed: bool, later: float = 0.0) -> Journal:
        w = JournalWriter(rank_journal(root, 0), rank=0, attempt=0)
        w.write("start", node="node0")
        for s in range(6 if resumed else 10):
            w.write("state", step=s, digests=digests(s))
            w.write("step", step=s, loss=1.0, loss_bits=float_bits(1.0), backwards=2)
        if resumed:  # killed during step 6, resumed at 5 after its first micro-batch (the gradient restored)
            w.write("fault", fault="kill", id=0, step=6, phase="iteration")
            w.write("start", node="node0")
            for s in range(5, 10):
                loss = 0.25 if s == 5 else 1.0 + (later if s == 8 else 0.0)
                w.write("state", step=s, digests=digests(s))
                w.write("step", step=s, loss=loss, loss_bits=float_bits(loss), backwards=1 if s == 5 else 2)
        w.write("state", step=10, digests=digests(10))
        w.write("finish", step=10)
        w.close()
        return Journal.load(root)

    ref = write(tmp_path / "ref", False)
    c = compare(ref, write(tmp_path / "run", True))
    assert c.equal and [(p.step, p.backwards, p.reference_backwards) for p in c.partial] == [(5, 1, 2)]
    expect = ExpectConfig(bitwise=False, loss=LossExpect(rtol=0.01, window=1))
    assert judge(ref, write(tmp_path / "run2", True), expect, steps=10, faults_declared=1).passed
    v = judge(ref, write(tmp_path / "run3", True, later=0.5), expect, steps=10, faults_declared=1)
    assert not v.passed and any("loss curve" in f for f in v.failures)  # a whole step that differs still counts
