"""The typed verdict: ``verdict.json`` keeps its format, older files load, one terminal formatter.

``tests/unit/verdicts`` holds verdict.json files as the harness wrote them before the type existed
(see its README), with the terminal summary, the suite table and the JUnit XML shown for them.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from analysis.errors import AnalysisError
from analysis.journal import Journal, JournalWriter, float_bits, launcher_journal, rank_journal
from analysis.junit import junit_xml
from analysis.losscurve import LossExpect
from analysis.summary import format_summary, format_table
from analysis.verdict import CaughtExpect, ExpectConfig, NotRun, Verdict, WallSeconds, judge, load_verdict

from .test_compare import digests, write_run
from .test_losscurve import write_elastic

FIXTURES = Path(__file__).parent / "verdicts"
TODAY = sorted(p for p in FIXTURES.glob("*.json") if not p.name.startswith("spine-era"))
OLDER = sorted(FIXTURES.glob("spine-era-*.json"))
OUT = Path("/runs/example")  # the run directory the saved summaries name


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


@pytest.mark.parametrize("path", TODAY, ids=lambda p: p.stem)
def test_todays_files_read_and_write_unchanged(path: Path) -> None:
    data = read(path)
    again = Verdict.from_json(data).to_json()
    assert again == data
    assert list(again) == list(data)  # the keys in the order they were written


@pytest.mark.parametrize("path", TODAY + OLDER, ids=lambda p: p.stem)
def test_the_summary_reads_as_before(path: Path) -> None:
    assert format_summary(Verdict.from_json(read(path)), OUT) + "\n" == path.with_suffix(".summary.txt").read_text()


@pytest.mark.parametrize("path", OLDER, ids=lambda p: p.stem)
def test_an_older_file_loads_with_the_fields_it_lacks_defaulted(path: Path) -> None:
    data = read(path)
    assert "windows" not in data and "world_size" not in data and "phases" not in data["recoveries"][0]
    v = Verdict.from_json(data)
    assert v.windows == [] and v.world_size is None and v.loss_curve is None and v.metrics is None
    assert v.fault_occurrences == data["faults_fired"] and v.recoveries[0].phases is None
    assert v.compared and v.target == "local" and v.cluster is None
    # what it has reads back unchanged; what it lacks is written from now on
    written = v.to_json()
    assert {k: written[k] for k in data if k not in ("recoveries", "first_divergence")} == \
        {k: data[k] for k in data if k not in ("recoveries", "first_divergence")}
    assert written["recoveries"][0]["lost_steps"] == data["recoveries"][0]["lost_steps"]
    assert written["windows"] == [] and written["metrics"] is None


def test_the_suite_table_and_junit_read_as_before() -> None:
    local = [p for p in sorted(FIXTURES.glob("*.json")) if "cluster" not in read(p)]  # tabled in name order
    results: list[Verdict | NotRun] = [Verdict.from_json(read(p)) for p in local]
    results.append(NotRun(scenario="broken", error="the reference run failed (exit codes [1], timed out: False)"))
    assert format_table(results) + "\n" == (FIXTURES / "suite.table.txt").read_text()
    assert junit_xml("ci", results) == (FIXTURES / "suite.junit.xml").read_text()


def test_a_cluster_run_without_reference_is_not_a_comparison() -> None:
    data = read(FIXTURES / "cluster-unjudged.json")
    v = Verdict.from_json(data)
    assert not v.compared and v.note == data["note"] and v.target == "k8s" and v.cluster is not None
    assert [f.status for f in v.cluster.firings] == ["injected", "injected"]
    assert "bitwise_equal" not in v.to_json() and v.to_json()["reference"] is None
    judged = Verdict.from_json(read(FIXTURES / "cluster-judged.json"))
    assert judged.compared and "reference" not in judged.to_json() and "agents_returncodes" not in judged.to_json()


def test_a_suite_entry_that_did_not_run() -> None:
    e = NotRun(scenario="x", error="boom")
    assert not e.passed and e.to_json() == {"scenario": "x", "error": "boom", "passed": False}


# --- judge writes today's shapes ---------------------------------------------------------------


def shape(x: Any) -> Any:
    """The structure of a JSON value: keys and lists kept, scalars by kind."""
    if isinstance(x, dict):
        return {k: shape(v) for k, v in x.items()}
    if isinstance(x, list):
        return [shape(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return type(x).__name__
    return "number"


#: Fields that do not depend on when the hand-made journals were written.
TIMELESS = ("passed", "failures", "caught", "bitwise_equal", "first_divergence", "divergent_records", "states_compared",
            "resized_records", "world_size", "loss_curve", "losses_compared", "lost_steps", "faults_fired",
            "fault_occurrences", "faults_declared", "completed", "windows", "checkpoints_rejected",
            "checkpoints_failed")


def busy_run(root: Path) -> Journal:
    """Two ranks: bubbles, snapshots, a jitter window and its summary, a hang the watchdog detects,
    checkpoints rejected and failed, a restore from shm after which rank 1's optimizer state differs
    (norms journaled)."""
    lw = JournalWriter(launcher_journal(root))
    for r in range(2):
        w = JournalWriter(rank_journal(root, r), rank=r, attempt=0)
        w.write("start", node="node0", world_size=2, created=time.time(), init_seconds=0.01)
        w.write("state", step=0, digests=digests(0), norms={"model": {"w": 1.0}})
        if r == 0:
            w.write("fault", fault="jitter", id=1, step=2, phase="iteration", fatal=False, ranks="all", from_step=2)
        for s in range(6):
            w.write("step", step=s, loss=1.0 / (s + 1), loss_bits=float_bits(1.0 / (s + 1)), seconds=0.1)
            w.write("bubbles", step=s, idle_seconds=0.02, windows=3, copy_in_windows_seconds=0.01, utilisation=0.5,
                    in_window_fraction=0.9)
            w.write("snapshot", step=s, stall_seconds=0.001, version=s)
            w.write("state", step=s + 1, digests=digests(s + 1))
        w.write("jitter_summary", id=1, batches=4, delay_seconds=0.02)
        w.write("checkpoint_rejected", step=5, tier="persistent", reason="disk full")
        w.write("checkpoint_failed", step=4, tier="replica", reason="peer gone")
        if r == 0:
            w.write("fault", fault="hang", id=0, step=6, phase="forward", rank=0)
            w.write("fault_rollback", id=1, step=6, fault="jitter")
        w.close()
    lw.write("hang_detected", silent_seconds=1.0, timeout=1.0, stopped_pids=[], killed_pids=[1])
    lw.close()
    for r in range(2):
        w = JournalWriter(rank_journal(root, r), rank=r, attempt=1)
        w.write("start", node="node0", world_size=2, incarnation=1)
        w.write("checkpoint_restored", step=4, tier="shm", seconds=0.05)
        bad = {**digests(4), "optimizer": {"state.w.exp_avg": "zz"}} if r == 1 else digests(4)
        w.write("state", step=4, digests=bad, norms={"optimizer": {"state.w.exp_avg": 2.5}})
        for s in range(4, 10):
            w.write("step", step=s, loss=1.0 / (s + 1), loss_bits=float_bits(1.0 / (s + 1)), seconds=0.1)
            w.write("state", step=s + 1, digests=digests(s + 1))
        w.write("finish", step=10)
        w.close()
    return Journal.load(root)


def busy_reference(root: Path) -> Journal:
    for r in range(2):
        w = JournalWriter(rank_journal(root, r), rank=r, attempt=0)
        w.write("start", node="node0", world_size=2)
        w.write("state", step=0, digests=digests(0), norms={"model": {"w": 1.0}})
        for s in range(10):
            w.write("step", step=s, loss=1.0 / (s + 1), loss_bits=float_bits(1.0 / (s + 1)), seconds=0.1)
            extra = {"norms": {"optimizer": {"state.w.exp_avg": 2.0}}} if s + 1 == 4 else {}
            w.write("state", step=s + 1, digests=digests(s + 1), **extra)
        w.write("finish", step=10)
        w.close()
    return Journal.load(root)


def judged(name: str, tmp: Path) -> Verdict:
    """The verdict a fixture was made from, judged now over the same kind of journals."""
    if name == "busy-norms":
        v = judge(busy_reference(tmp / "ref"), busy_run(tmp / "run"), ExpectConfig(max_lost_steps=1), steps=10,
                  faults_declared=2)
    elif name.startswith("elastic"):
        expect = ExpectConfig(max_lost_steps=1, loss=LossExpect(rtol=0.01, window=3, margin=0.01))
        v = judge(write_elastic(tmp / "ref", 4, 20), write_elastic(tmp / "run", 4, 20, lost_at=12, restore=11,
                                                                   offset=0.001), expect, steps=20, faults_declared=1)
    else:
        run = write_run(tmp / "run", 2, 10, kill_at=7, restore=5, bad_rng_after=name == "mutant-caught")
        expect = ExpectConfig(caught=CaughtExpect(component="rng", key="to"), rng="strict") if name == "mutant-caught" \
            else ExpectConfig(max_lost_steps=2)
        v = judge(write_run(tmp / "ref", 2, 10), run, expect, steps=10, faults_declared=1)
    fixture = read(FIXTURES / f"{name}.json")
    return dataclasses.replace(v, scenario=fixture["scenario"], agents_returncodes=fixture["agents_returncodes"],
                               wall_seconds=WallSeconds(**fixture["wall_seconds"]))


@pytest.mark.parametrize("name", ["kill-passed", "mutant-caught", "elastic-equivalence", "busy-norms"])
def test_judge_writes_what_was_written_before(name: str, tmp_path: Path) -> None:
    fixture = read(FIXTURES / f"{name}.json")
    v = judged(name, tmp_path)
    v.write(tmp_path)
    written = read(tmp_path / "verdict.json")
    assert shape(written) == shape(fixture)
    assert {k: written[k] for k in TIMELESS} == {k: fixture[k] for k in TIMELESS}
    assert load_verdict(tmp_path) == v and Verdict.from_json(written).to_json() == written


def test_a_broken_verdict_file_is_an_analysis_error(tmp_path: Path) -> None:
    with pytest.raises(AnalysisError, match="no verdict.json"):
        load_verdict(tmp_path)
    (tmp_path / "verdict.json").write_text("{not json")
    with pytest.raises(AnalysisError, match="not a verdict"):
        load_verdict(tmp_path)
    (tmp_path / "verdict.json").write_text(json.dumps({"scenario": "x"}))  # no passed, no failures
    with pytest.raises(AnalysisError, match="not a verdict"):
        load_verdict(tmp_path)


def test_interval_changes_are_one_per_step_and_a_long_run_of_them_is_folded_in_the_summary() -> None:
    from analysis.verdict import interval_changes

    evs = [{"rank": r, "step": s, "every": e, "before": b, "cost_seconds": 0.02, "why": f"to {e}"}
           for s, e, b in [(10, 7, 10), (17, 5, 7), (22, 8, 5), (30, 5, 8), (35, 3, 5)] for r in (0, 1)]
    changes = interval_changes(evs)
    assert [(c.step, c.every) for c in changes] == [(10, 7), (17, 5), (22, 8), (30, 5), (35, 3)]
    v = Verdict(scenario="s", passed=True, failures=[], interval_changes=changes)
    lines = [line for line in format_summary(v, OUT).splitlines() if "interval" in line or "more changes" in line]
    assert lines == ["  persist interval step 10: every 10 -> 7 steps (to 7)",
                     "    (3 more changes: every 5 -> 8 -> 5 steps; all in verdict.json)",
                     "  persist interval step 35: every 5 -> 3 steps (to 3)"]
    assert Verdict.from_json(v.to_json()).interval_changes == changes


def test_a_plan_the_windows_cannot_hold_is_said_once_per_rank_and_decision() -> None:
    from analysis.journal import Journal
    from analysis.verdict import plan_overflows

    def replan(step: int, overflow: int, policy: str = "every_k", every: int = 1) -> dict:
        return {"event": "replan", "rank": 1, "step": step, "windows": 6, "idle_ms": 4.0, "bytes": 2_000_000,
                "overflow_bytes": overflow, "policy": policy, "every": every, "stall_ms": 0.0, "bandwidth_gbps": 3.0}

    warmup = {**replan(0, 2_000_000), "windows": 0, "idle_ms": 0.0, "policy": "stall"}  # before any window was measured
    run = Journal(Path("run"), ranks={0: [{**warmup, "rank": 0}, {**replan(1, 0), "rank": 0}],  # held: nothing to say
                         1: [warmup, replan(1, 500_000, every=2), replan(4, 400_000, every=2), replan(9, 900_000, every=4),
                             replan(12, 0), replan(15, 300_000, "stall")]})
    found = plan_overflows(run)
    assert [(p.rank, p.step, p.policy, p.every) for p in found] == [(1, 1, "every_k", 2), (1, 9, "every_k", 4),
                                                                   (1, 15, "stall", 1)]
    assert found[0].describe() == ("rank 1 from step 1: 6 windows, 4.0 ms idle, hold 1.50 of 2.00 MB; a snapshot "
                                   "every 2 iterations (overflow every_k)")
    v = Verdict(scenario="s", passed=True, failures=[], plan_overflows=found)
    lines = [line for line in format_summary(v, OUT).splitlines() if "snapshot plan" in line]
    assert len(lines) == 3 and lines[2].endswith("ms stall per snapshot (overflow stall)")
    assert Verdict.from_json(v.to_json()).plan_overflows == found


def test_the_stores_stops_and_resumptions_are_in_the_verdict_at_the_step_the_ranks_had_reached(tmp_path: Path) -> None:
    from analysis.verdict import replication_changes

    (tmp_path / "journal" / "rank-0").mkdir(parents=True)
    rank = [{"t": 10.0 + s, "event": "snapshot", "step": s} for s in range(8)]
    (tmp_path / "journal" / "rank-0" / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in rank))
    store = [{"t": 9.0, "event": "replication_degraded", "node": "node1", "reason": "early"},
             {"t": 13.5, "event": "replication_degraded", "node": "node0", "reason": "the link makes ... older"},
             {"t": 16.2, "event": "replicated", "node": "node0"},
             {"t": 16.5, "event": "replication_resumed", "node": "node0", "reason": "a probe round ..."}]
    (tmp_path / "journal" / "store-node0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in store))
    changes = replication_changes(Journal.load(tmp_path))
    assert [(c.node, c.step, c.stopped) for c in changes] == [("node1", None, True), ("node0", 3, True),
                                                             ("node0", 6, False)]
    v = Verdict(scenario="s", passed=True, failures=[], replication_changes=changes)
    lines = [line for line in format_summary(v, OUT).splitlines() if "replication" in line]
    assert lines[1] == "  replication node0 stopped at step 3: the link makes ... older"
    assert lines[0].endswith("before the first step: early")
    assert Verdict.from_json(v.to_json()).replication_changes == changes
