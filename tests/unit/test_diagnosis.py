"""The diagnosis of a failed resume from synthetic journals: a cause is named only when its evidence is there."""
from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.compare import compare
from analysis.diagnosis import CAUSES, diagnose
from analysis.journal import Journal, JournalWriter, float_bits, rank_journal
from analysis.metrics import recoveries
from analysis.verdict import ExpectConfig, judge

COMPONENTS = ("model", "optimizer", "scheduler", "rng", "data")
STEPS = 12


def state(step: int, moved: dict[str, int | None] | None = None, keys: int = 1) -> dict:
    """The digests of the reference at ``step``; ``moved``: components at another step (None: no step)."""
    out = {}
    for c in COMPONENTS:
        at = (moved or {}).get(c, step)
        out[c] = {f"k{i}": (f"{c}{i}@{at}" if at is not None else f"{c}{i}?") for i in range(keys)}
    return out


def write(root: Path, *, kill_at: int | None = None, resume: int = 0, moved: dict[str, int | None] | None = None,
          later: int | None = None, repeat_partial: bool = False, unconsumed: bool = False) -> Journal:
    """One rank: steps 0..STEPS; with ``kill_at``, a restart whose first state is ``state(resume, moved)``; from
    ``later`` on (steps after the resume), the run's model differs; so it does after a ``moved`` resume unless
    ``unconsumed`` (what moved reached nothing else)."""
    w = JournalWriter(rank_journal(root, 0), rank=0, attempt=0)
    w.write("start", node="node0", world_size=1)
    w.write("state", step=0, digests=state(0))
    stop = kill_at if kill_at is not None else STEPS
    for s in range(stop):
        w.write("step", step=s, loss=1.0, loss_bits=float_bits(1.0))
        w.write("state", step=s + 1, digests=state(s + 1))
    if kill_at is not None:
        w.write("fault", fault="kill", id=0, step=kill_at, phase="iteration", fatal=True)
        w.write("start", node="node0", world_size=1)
        w.write("checkpoint_restored", step=resume, tier="persistent", seconds=0.1)
        w.write("state", step=resume, digests=state(resume, moved))
        for s in range(resume, STEPS):
            bad = (moved and not unconsumed) or (later is not None and s + 1 >= later)
            w.write("step", step=s, loss=1.0, loss_bits=float_bits(1.0), **({"backwards": 1} if repeat_partial and s == resume else {}))
            digests = state(s + 1)
            if bad:
                digests["model"] = {"k0": f"model0#{s + 1}"}
            w.write("state", step=s + 1, digests=digests)
    w.write("finish", step=STEPS)
    w.close()
    return Journal.load(root)


def codes(ref: Journal, run: Journal, reproducible: bool | None = None) -> dict[str, list[str]]:
    cmp = compare(ref, run)
    causes = diagnose(ref, run, cmp, failed=not cmp.equal, reproducible=reproducible, recoveries=recoveries(run))
    return {c.code: c.evidence for c in causes}


def test_a_correct_resume_gets_no_diagnosis(tmp_path: Path) -> None:
    ref = write(tmp_path / "ref")
    run = write(tmp_path / "run", kill_at=7, resume=5)
    assert codes(ref, run) == {}
    v = judge(ref, run, ExpectConfig(bitwise=True), steps=STEPS, faults_declared=1)
    assert v.passed and v.diagnosis == []


@settings(max_examples=60, deadline=None)
@given(k=st.integers(2, 8), placement=st.fixed_dictionaries(
    {c: st.sampled_from(["same", "start", "ahead", "behind", "none"]) for c in COMPONENTS if c != "model"}))
def test_each_cause_is_named_only_from_its_own_evidence(tmp_path_factory, k: int, placement: dict[str, str]) -> None:
    where = {"same": k, "start": 0, "ahead": k + 1, "behind": k - 1, "none": None}
    moved = {c: where[p] for c, p in placement.items() if p != "same"}
    root = tmp_path_factory.mktemp("d")
    ref = write(root / "ref")
    run = write(root / "run", kill_at=k + 2, resume=k, moved=moved)
    found = codes(ref, run)
    expected: set[str] = set()
    for comp, p in placement.items():
        if p == "same":
            continue
        expected.add({
            "optimizer": {"start": "optimizer-not-restored", "none": "optimizer-not-restored"}.get(p, "torn-checkpoint"),
            "scheduler": {"ahead": "scheduler-stepped-after-load", "behind": "torn-checkpoint"}.get(
                p, "scheduler-not-restored"),
            "rng": {"start": "rng-not-restored", "none": "rng-drawn-after-restore"}.get(p, "torn-checkpoint"),
            "data": "data-position-not-restored",
        }[comp])
    if placement["rng"] in ("start", "none") and placement["data"] == "none":
        expected.discard("data-position-not-restored")  # an order drawn from that RNG: folded into its cause
        assert any("so data (its order is drawn from it) equals no step" in e for e in found[
            "rng-not-restored" if placement["rng"] == "start" else "rng-drawn-after-restore"])
    assert set(found) == expected  # nothing moved: the run equals the reference and nothing is diagnosed
    for code, evidence in found.items():
        assert code in CAUSES and evidence
        assert any(f"model equals step {k}" in e for e in evidence), evidence


def test_a_restored_model_of_no_step_is_a_corrupt_restore(tmp_path: Path) -> None:
    ref = write(tmp_path / "ref")
    run = write(tmp_path / "run", kill_at=7, resume=5, moved={"model": None})
    assert list(codes(ref, run)) == ["corrupt-restore"]


def test_an_exact_resume_that_later_differs_is_nondeterminism_or_hidden_state(tmp_path: Path) -> None:
    ref = write(tmp_path / "ref")
    run = write(tmp_path / "run", kill_at=7, resume=5, later=8)
    assert list(codes(ref, run, reproducible=False)) == ["nondeterministic-job"]
    found = codes(ref, run, reproducible=True)
    assert list(found) == ["state-outside-fingerprints"] and "two uninterrupted runs agree" in found[
        "state-outside-fingerprints"][0]


def test_a_run_that_fails_without_any_differing_record_is_unexplained(tmp_path: Path) -> None:
    ref = write(tmp_path / "ref")
    run = write(tmp_path / "run", kill_at=7, resume=5)
    cmp = compare(ref, run)
    causes = diagnose(ref, run, cmp, failed=True, reproducible=None, recoveries=recoveries(run))
    assert [c.code for c in causes] == ["unexplained"] and causes[0].fix is None


def test_an_older_checkpoint_than_the_newest_committed_is_named(tmp_path: Path) -> None:
    ref = write(tmp_path / "ref")
    root = tmp_path / "run"
    w = JournalWriter(rank_journal(root, 0), rank=0, attempt=0)
    w.write("start", node="node0", world_size=1)
    w.write("state", step=0, digests=state(0))
    for s in range(6):
        w.write("step", step=s, loss=1.0, loss_bits=float_bits(1.0))
        w.write("state", step=s + 1, digests=state(s + 1))
        if s + 1 == 4:
            w.write("checkpoint_saved", step=4, tier="persistent", bytes=1, seconds=0.1, path="x")
    w.write("fault", fault="kill", id=0, step=6, phase="iteration", fatal=True)
    w.write("start", node="node0", world_size=1)
    w.write("state", step=0, digests=state(0))  # from scratch
    for s in range(STEPS):
        w.write("step", step=s, loss=1.0, loss_bits=float_bits(1.0))
        w.write("state", step=s + 1, digests=state(s + 1))
    w.write("finish", step=STEPS)
    w.close()
    run = Journal.load(root)
    cmp = compare(ref, run)
    (c,) = diagnose(ref, run, cmp, failed=True, reproducible=None, recoveries=recoveries(run))
    assert c.code == "older-checkpoint-restored"
    assert "step 4 was committed to the persistent tier before it, the restore took step 0" in c.evidence[0]


def test_one_changed_key_of_a_restored_component_is_a_corruption_not_a_lost_part(tmp_path: Path) -> None:
    def journal(name: str, steps: int, restart: dict | None = None) -> Journal:
        w = JournalWriter(rank_journal(tmp_path / name, 0), rank=0, attempt=0)
        w.write("start", node="node0", world_size=1)
        w.write("state", step=0, digests=state(0, keys=3))
        for s in range(steps):
            w.write("step", step=s, loss=1.0, loss_bits=float_bits(1.0))
            w.write("state", step=s + 1, digests=state(s + 1, keys=3))
        if restart is not None:
            w.write("fault", fault="kill", id=0, step=steps, phase="iteration", fatal=True)
            w.write("start", node="node0", world_size=1)
            w.write("state", step=5, digests=restart)
        w.close()
        return Journal.load(tmp_path / name)

    flipped = state(5, keys=3)
    flipped["optimizer"]["k1"] = "one byte flipped"
    found = codes(journal("ref", STEPS), journal("run", 6, restart=flipped))
    assert list(found) == ["corrupt-restore"], found
    assert "optimizer/k1 equal no step of the reference while the other 2 keys of optimizer equal step 5" in \
        found["corrupt-restore"][0]


def test_the_findings_table_comes_from_the_runs_verdicts(tmp_path: Path, capsys) -> None:
    import shutil

    from analysis.findings import table
    from harness.cli import main

    fixtures = Path(__file__).parent / "verdicts"
    for name in ("mutant-caught", "kill-passed"):
        (tmp_path / "suite" / name).mkdir(parents=True)
        shutil.copy(fixtures / f"{name}.json", tmp_path / "suite" / name / "verdict.json")
    text = table([tmp_path / "suite"])
    lines = text.splitlines()
    assert lines[0] == "| scenario | resumed | bit for bit? | first divergence | likely cause | evidence |"
    assert len(lines) == 4
    assert "| `rng-drawn-after-restore` | rank 0: model equals step 5, rng/torch equals no step |" in text
    assert "| kill | step" in text and "| — | every component equals the reference |" in text
    assert main(["findings", str(tmp_path / "suite" / "kill-passed"), str(tmp_path / "suite" / "mutant-caught")]) == 0
    assert capsys.readouterr().out.count("\n") == 4
    assert main(["findings", str(tmp_path / "nothing")]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_an_optimizer_whose_learning_rate_alone_moved_is_left_to_the_scheduler(tmp_path: Path) -> None:
    """A scheduler stepped after loading rewrites param_groups' lr: the optimizer's state came back, only the
    scheduler is to blame; a fresh optimizer (no state keys at all) was not restored."""
    def journal(name: str, restart: dict | None) -> Journal:
        w = JournalWriter(rank_journal(tmp_path / name, 0), rank=0, attempt=0)
        w.write("start", node="node0", world_size=1)
        for s in range(9 if restart is not None else STEPS + 1):
            w.write("state", step=s, digests={"model": {"w": f"w{s}"}, "scheduler": {"last": f"s{s}"},
                                              "optimizer": {"state.0.exp_avg": f"m{s}", "param_groups.0.lr": f"lr{s}"}})
            w.write("step", step=s, loss=1.0, loss_bits=float_bits(1.0))
        if restart is not None:
            w.write("fault", fault="kill", id=0, step=9, phase="iteration", fatal=True)
            w.write("start", node="node0", world_size=1)
            w.write("state", step=5, digests=restart)
        w.close()
        return Journal.load(tmp_path / name)

    ref = journal("ref", None)
    ahead = journal("ahead", {"model": {"w": "w5"}, "scheduler": {"last": "s6"},
                              "optimizer": {"state.0.exp_avg": "m5", "param_groups.0.lr": "lr6"}})
    assert list(codes(ref, ahead)) == ["scheduler-stepped-after-load"]
    fresh = journal("fresh", {"model": {"w": "w5"}, "scheduler": {"last": "s5"},
                              "optimizer": {"param_groups.0.lr": "lr0"}})
    assert list(codes(ref, fresh)) == ["optimizer-not-restored"]


def test_a_run_that_differed_before_any_restart_blames_no_restore(tmp_path: Path) -> None:
    ref = write(tmp_path / "ref")
    root = tmp_path / "run"
    w = JournalWriter(rank_journal(root, 0), rank=0, attempt=0)
    w.write("start", node="node0", world_size=1)
    for s in range(7):
        d = state(s)
        if s >= 3:
            d["model"] = {"k0": f"drift{s}"}  # non-determinism before the fault
        w.write("state", step=s, digests=d)
        w.write("step", step=s, loss=1.0, loss_bits=float_bits(1.0))
    w.write("fault", fault="kill", id=0, step=7, phase="iteration", fatal=True)
    w.write("start", node="node0", world_size=1)
    w.write("state", step=5, digests={**state(5), "model": {"k0": "drift5"}})  # its own checkpoint
    w.close()
    run = Journal.load(root)
    found = codes(ref, run, reproducible=False)
    assert list(found) == ["nondeterministic-job"] and "before any restart" in found["nondeterministic-job"][0]
    assert list(codes(ref, run)) == ["unexplained"]  # no reproducibility check: not a resume's doing, said so


# -- the verdict's precision (issue 54) ----------------------------------------------------------------------
def test_an_rng_difference_nothing_consumed_is_latent_and_passes_unless_strict(tmp_path: Path) -> None:
    """A Lightning run without dropout: its checkpoint holds no RNG, the restarted process's differs, nothing that
    training uses draws from it. Reported with its evidence and fix; passes unless ``rng: strict``."""
    ref = write(tmp_path / "ref")
    run = write(tmp_path / "run", kill_at=7, resume=5, moved={"rng": 0}, unconsumed=True)
    v = judge(ref, run, ExpectConfig(bitwise=True), steps=STEPS, faults_declared=1)
    assert v.passed and v.failures == [] and v.diagnosis == [], v.failures
    assert not v.bitwise_equal and v.first_divergence is not None and v.first_divergence.component == "rng"
    assert [c.code for c in v.latent] == ["rng-not-restored"] and v.latent[0].fix
    strict = judge(ref, run, ExpectConfig(bitwise=True, rng="strict"), steps=STEPS, faults_declared=1)
    assert not strict.passed and [c.code for c in strict.diagnosis] == ["rng-not-restored"] and strict.latent == []


def test_an_rng_difference_that_reaches_the_model_still_fails(tmp_path: Path) -> None:
    ref = write(tmp_path / "ref")
    run = write(tmp_path / "run", kill_at=7, resume=5, moved={"rng": 0})  # dropout drew from it: the model moved
    v = judge(ref, run, ExpectConfig(bitwise=True), steps=STEPS, faults_declared=1)
    assert not v.passed and "rng-not-restored" in [c.code for c in v.diagnosis] and v.latent == []


def test_a_run_that_passes_on_its_loss_curve_gets_no_diagnosis(tmp_path: Path) -> None:
    """Not bit for bit (a later step's model differs) but judged by its loss curve, which holds: a passing run
    has nothing to explain (it got ``nondeterministic-job`` before)."""
    from analysis.losscurve import LossExpect

    ref = write(tmp_path / "ref")
    run = write(tmp_path / "run", kill_at=7, resume=5, later=8)
    v = judge(ref, run, ExpectConfig(bitwise=False, loss=LossExpect(rtol=0.1)), steps=STEPS, faults_declared=1)
    assert v.passed and v.diagnosis == [] and v.latent == [], (v.failures, v.diagnosis)


def _steps(steps: range) -> list[tuple[str, dict]]:
    return [("step", {"step": s, "loss": 1.0, "loss_bits": float_bits(1.0)}) for s in steps]


def _journal(root: Path, rank: int, attempt: int, *events: tuple[str, dict]) -> None:
    """Append ``events`` to a rank's journal of process ``attempt``."""
    w = JournalWriter(rank_journal(root, rank), rank=rank, attempt=attempt)
    for event, fields in events:
        w.write(event, **fields)
    w.close()


def _restarted(root: Path, rank: int, restored: int, tier: str) -> None:
    """A rank's restarted process: it restored ``restored`` from ``tier`` and took that step."""
    _journal(root, rank, 1, ("start", {"node": "node0", "world_size": 2}),
             ("checkpoint_restored", {"step": restored, "tier": tier, "seconds": 0.1}), *_steps(range(restored, restored + 1)))


def test_lost_work_counts_from_the_step_every_rank_had_completed(tmp_path: Path) -> None:
    """A pipeline whose last stage had entered step 8 when rank 0 was killed in step 7's snapshot, restored 6:
    one step lost (counted from 7, which every rank had completed), not two; the furthest rank said apart."""
    root = tmp_path / "run"
    for rank, done in ((0, 7), (1, 8)):
        _journal(root, rank, 0, ("start", {"node": "node0", "world_size": 2}), *_steps(range(done)))
    _journal(root, 0, 0, ("fault", {"fault": "kill", "id": 0, "step": 7, "phase": "snapshot", "fatal": True}))
    for rank in (0, 1):
        _restarted(root, rank, 6, "shm")
    rec, = recoveries(Journal.load(root))
    assert (rec.progress_before, rec.furthest_before, rec.restored_step, rec.lost_steps) == (7, 8, 6, 1)


def test_a_preemption_loses_what_the_script_trained_in_its_grace(tmp_path: Path) -> None:
    """A script that ignores SIGTERM trains on in the grace (steps 12 to 16) and is killed at its end; it resumes
    from its save at 15: one step lost, counted at the grace's end (it read 0, counted at the signal)."""
    from analysis.journal import launcher_journal

    root = tmp_path / "run"
    preempt = ("fault", {"fault": "preempt", "id": 0, "occurrence": 0, "step": 12, "phase": "data", "fatal": True})
    for rank in (0, 1):
        _journal(root, rank, 0, ("start", {"node": "node0", "world_size": 2}), *_steps(range(12)),
                 *([preempt] if rank == 0 else []))
    for rank in (0, 1):
        _journal(root, rank, 0, *_steps(range(12, 16)))  # trained on in the grace
    launcher = JournalWriter(launcher_journal(root))
    launcher.write("preempt_end", fault=0, occurrence=0, node=0, killed=[0, 1], seconds=2.0, restart=True)
    launcher.close()
    for rank in (0, 1):
        _restarted(root, rank, 15, "persistent")
    rec, = recoveries(Journal.load(root))
    assert (rec.progress_before, rec.restored_step, rec.lost_steps) == (16, 15, 1)
