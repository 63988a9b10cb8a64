"""Why workers ended: the agent's ``worker_failed`` events, placed in the job's history and named in the verdict."""
from __future__ import annotations

from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.elastic.multiprocessing.errors.error_handler import ErrorHandler

from analysis.exits import worker_failures
from analysis.journal import Journal, JournalWriter, agent_journal, float_bits, rank_journal
from analysis.verdict import ExpectConfig, Verdict, judge
from harness.run.agent import failure_fields

from .test_compare import digests, write_run


def job(root: Path, ranks: int, steps: int, *, failed: list[dict], restart_after: int | None = None,
        fault_on: int | None = None) -> Journal:
    """A run of ``ranks`` ranks journaled as the harness does: incarnation 0 takes ``restart_after`` steps
    (all of them, and ``finish``, when None), then node 0's agent sees ``failed``, then (when restarted)
    incarnation 1 resumes and finishes. ``fault_on``: that rank journals a kill in incarnation 0."""
    def incarnation(attempt: int, first: int, last: int, finish: bool) -> None:
        for r in range(ranks):
            w = JournalWriter(rank_journal(root, r), rank=r, attempt=attempt)
            w.write("start", node="node0")
            w.write("state", step=first, digests=digests(first))
            for s in range(first, last):
                w.write("step", step=s, loss=1.0 / (s + 1), loss_bits=float_bits(1.0 / (s + 1)))
                w.write("state", step=s + 1, digests=digests(s + 1))
            if r == fault_on and attempt == 0:
                w.write("fault", fault="kill", id=0, step=last, phase="iteration")
            if finish:
                w.write("finish", step=last)
            w.close()

    incarnation(0, 0, steps if restart_after is None else restart_after, restart_after is None)
    agent = JournalWriter(agent_journal(root, 0))
    for f in failed:
        agent.write("worker_failed", **{"node": "node0", "attempt": 0, "local_rank": f["rank"], "pid": 100 + f["rank"],
                                        "exitcode": -6, "signal": "SIGABRT", "where": None,
                                        "message": f"Signal 6 (SIGABRT) received by PID {100 + f['rank']}", **f})
    agent.close()
    if restart_after is not None:
        incarnation(1, restart_after, steps, True)
    return Journal.load(root)


def test_a_worker_that_died_in_its_teardown_is_named_in_the_unexplained_restart(tmp_path: Path) -> None:
    # rank 1 finished all 10 steps, then aborted on its way out; torchrun restarted the job, which resumed
    ref = write_run(tmp_path / "ref", 2, 10)
    run = job(tmp_path / "run", 2, 10, failed=[{"rank": 1}], restart_after=10)
    (f,) = worker_failures(run)
    assert (f.rank, f.incarnation, f.signal, f.last_step, f.explained) == (1, 0, "SIGABRT", 9, False)
    v = judge(ref, run, ExpectConfig(), steps=10, faults_declared=0)
    assert not v.passed and v.worker_failures == [f]
    assert v.failures == ["1 restart(s) that no fault explains (1 restarts, 0 fatal fault firings): incarnation 0: rank 1 "
                          "ended with SIGABRT after step 9; see the logs/ of the run"]
    assert Verdict.from_json(v.to_json()).worker_failures == [f]


def test_a_faults_victims_are_explained_and_not_blamed(tmp_path: Path) -> None:
    ref = write_run(tmp_path / "ref", 2, 10)
    run = job(tmp_path / "run", 2, 10, restart_after=7, fault_on=0, failed=[
        {"rank": 0, "exitcode": -9, "signal": "SIGKILL"},
        {"rank": 1, "exitcode": 1, "signal": None, "message": "RuntimeError: Connection closed by peer",
         "where": 'File "train.py", line 12, in main'}])
    v = judge(ref, run, ExpectConfig(), steps=10, faults_declared=1)
    assert v.passed and [(f.rank, f.explained) for f in v.worker_failures] == [(0, True), (1, True)]


def test_a_crash_of_its_own_names_the_exception_and_the_line(tmp_path: Path) -> None:
    ref = write_run(tmp_path / "ref", 2, 10)
    run = job(tmp_path / "run", 2, 10, restart_after=7, failed=[
        {"rank": 1, "exitcode": 1, "signal": None, "message": "ValueError: bad batch",
         "where": 'File "train.py", line 40, in main'}])
    v = judge(ref, run, ExpectConfig(), steps=10, faults_declared=0)
    assert ('incarnation 0: rank 1 ended with exit code 1 after step 6: ValueError: bad batch (File "train.py", '
            'line 40, in main)') in v.failures[0]


def test_a_finished_worker_is_said_to_have_died_in_its_teardown(tmp_path: Path) -> None:
    run = job(tmp_path / "run", 1, 4, failed=[{"rank": 0}])  # after every event of the rank, its finish too
    (f,) = worker_failures(run)
    assert f.describe() == "incarnation 0: rank 0 ended with SIGABRT after finishing every step (in the process's teardown)"


def test_ranks_that_ended_alike_are_named_together_the_groups_sigterm_left_out_and_a_long_message_cut(tmp_path: Path) -> None:
    ref = write_run(tmp_path / "ref", 3, 10)
    long = "FileNotFoundError: " + "x" * 400
    run = job(tmp_path / "run", 3, 10, restart_after=4, failed=[
        *({"rank": r, "exitcode": 1, "signal": None, "message": long, "where": 'File "t.py", line 3, in main'} for r in (0, 2)),
        {"rank": 1, "exitcode": -15, "signal": "SIGTERM"}])  # torchrun stopping the rest of the group
    v = judge(ref, run, ExpectConfig(), steps=10, faults_declared=0)
    (clause,) = [f for f in v.failures if "no fault explains" in f]
    assert "incarnation 0: ranks 0, 2 ended with exit code 1 after step 3: FileNotFoundError: xxx" in clause
    assert long[:239] + "…" in clause and long[:240] not in clause and "rank 1" not in clause


def test_the_agent_reads_torchs_error_file_and_the_signal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    try:
        raise ValueError("bad batch")
    except ValueError as e:
        ErrorHandler().record_exception(e)  # what torch's ``record`` writes for an uncaught exception
    fields = failure_fields(ProcessFailure(local_rank=0, pid=7, exitcode=1, error_file=str(error_file)))
    assert fields["exitcode"] == 1 and fields["signal"] is None and fields["message"] == "ValueError: bad batch"
    assert fields["where"] is not None and "test_exits.py" in fields["where"]  # this file's frame, not a library's
    killed = failure_fields(ProcessFailure(local_rank=0, pid=7, exitcode=-6, error_file=str(tmp_path / "none")))
    assert killed == {"exitcode": -6, "signal": "SIGABRT", "message": "Signal 6 (SIGABRT) received by PID 7", "where": None}


def test_a_sigterm_alone_is_the_cause_it_names(tmp_path: Path) -> None:
    ref = write_run(tmp_path / "ref", 2, 10)
    run = job(tmp_path / "run", 2, 10, restart_after=4, failed=[{"rank": 0, "exitcode": -15, "signal": "SIGTERM"}])
    v = judge(ref, run, ExpectConfig(), steps=10, faults_declared=0)
    assert "incarnation 0: rank 0 ended with SIGTERM after step 3; see the logs/ of the run" in v.failures[0]
