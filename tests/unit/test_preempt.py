"""The preempt fault's config and request, the harness's controller on real processes and signals, and how the
verdict reads a preemption from the journals."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.exits import Preemption, preemptions
from analysis.journal import Journal, JournalWriter, launcher_journal
from harness.run.preempt import PreemptController
from injectors import FAULTS, RunShape
from injectors.errors import FaultConfigError
from injectors.preempt import PreemptConfig, PreemptRequest, ack_path, write_request
from tests.fakes import FakeAgents

SHAPE = RunShape(world_size=4, steps=20, nodes=2)


@pytest.mark.parametrize("fields, field", [
    ({"at_step": 1}, "node"),  # neither node nor ranks
    ({"node": 1, "ranks": [0], "at_step": 1}, "node"),  # both
    ({"ranks": [], "at_step": 1}, "ranks"),
    ({"ranks": [1, 1], "at_step": 1}, "ranks"),
    ({"node": 1, "at_step": 1, "grace_s": -1}, "grace_s"),
])
def test_bad_configs_name_their_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(FaultConfigError) as info:
        PreemptConfig(**fields)
    assert info.value.field == field


@pytest.mark.parametrize("fields, field", [
    ({"node": 2, "at_step": 1}, "node"),
    ({"ranks": [4], "at_step": 1}, "ranks"),
    ({"node": 0, "at_step": 1, "restart": False}, "node"),  # the rendezvous host cannot stay gone
    ({"ranks": [1], "at_step": 1, "restart": False}, "restart"),
    ({"node": 1, "at_step": 1, "every": 3, "times": 2, "restart": False}, "restart"),
    ({"node": 1, "at_time": 1, "every_seconds": 3, "times": 2, "restart": False}, "restart"),
])
def test_configs_impossible_in_the_run_are_refused(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(FaultConfigError) as info:
        PreemptConfig(**fields).check(SHAPE)
    assert info.value.field == field


def test_who_fires_it_and_what_the_scenario_reads() -> None:
    node = PreemptConfig(node=1, at_step=3)
    assert [r for r in range(4) if node.targets(r, r // 2, r % 2)] == [2]  # local rank 0 of node 1
    ranks = PreemptConfig(ranks=[3, 1], at_step=3)
    assert [r for r in range(4) if ranks.targets(r, r // 2, r % 2)] == [1]  # the lowest rank named
    assert FAULTS["preempt"][0] is PreemptConfig
    assert PreemptConfig(node=1, at_step=3, restart=False).replacement is False  # a lost node for the elastic checks
    from injectors.process import NodeLossConfig

    lost = NodeLossConfig(node=1, at_step=3)  # its twin: the same worker fires it
    assert [r for r in range(4) if lost.targets(r, r // 2, r % 2)] == [2]


@settings(max_examples=50, deadline=None)
@given(node=st.one_of(st.none(), st.integers(0, 7)), grace=st.floats(0, 1e4), step=st.integers(-1, 10**6))
def test_a_request_reads_back_as_written(tmp_path_factory: pytest.TempPathFactory, node: int | None, grace: float,
                                         step: int) -> None:
    d = tmp_path_factory.mktemp("faults")
    req = PreemptRequest(fault_id=2, occurrence=0, node=node, ranks=None if node is not None else [1], grace_s=grace,
                         restart=True, step=step, phase="forward", rank=1, at=time.time())
    path = write_request(d, req)
    assert PreemptRequest.loads(path.read_text()) == req and path.suffix == ".request"
    assert not list(d.glob("*.tmp"))


# --- the controller, on real processes ----------------------------------------------------------------------

#: A stand-in worker: ``saves`` exits 0.3 s after SIGTERM (its save), ``hangs`` ignores SIGTERM (a save that never
#: ends); it prints its pid for the journal.
WORKER = """
import os, signal, sys, time
if sys.argv[1] == "saves":
    signal.signal(signal.SIGTERM, lambda s, f: (time.sleep(0.3), os._exit(143)))
else:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(os.getpid(), flush=True)
while True:
    time.sleep(0.05)
"""
#: A stand-in torchrun agent that outlives its workers' grace: starts a worker of each kind, passes their pids on.
AGENT = f"""
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, lambda s, f: None)
kids = [subprocess.Popen([sys.executable, "-c", {WORKER!r}, m], stdout=subprocess.PIPE, text=True)
        for m in ("saves", "hangs")]
for k in kids:
    print(k.stdout.readline().strip(), flush=True)
while True:
    time.sleep(0.05)
"""


def test_the_controller_signals_times_the_grace_kills_the_rest_and_brings_the_node_back(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()}
    agent = subprocess.Popen([sys.executable, "-c", AGENT], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pids = [int(agent.stdout.readline()) for _ in range(2)]
        for rank, pid in enumerate(pids):  # what each worker journals first: its pid
            (tmp_path / "journal" / f"rank-{rank}").mkdir(parents=True)
            (tmp_path / "journal" / f"rank-{rank}" / "events.jsonl").write_text(
                json.dumps({"t": time.time(), "event": "start", "rank": rank, "pid": pid, "world_size": 2}, separators=(",", ":")) + "\n")
        journal = JournalWriter(launcher_journal(tmp_path))
        agents = FakeAgents([agent])  # one node: its preemption restarts the job
        controller = PreemptController(tmp_path, agents, journal, token="no-such-launch")
        controller.start()
        (tmp_path / "faults").mkdir()
        path = write_request(tmp_path / "faults", PreemptRequest(
            fault_id=0, occurrence=0, node=0, ranks=None, grace_s=1.5, restart=True, step=5, phase="iteration",
            rank=0, at=time.time()))
        deadline = time.monotonic() + 60  # (a ceiling that only keeps a broken controller from hanging)
        while not ack_path(path).exists():
            assert time.monotonic() < deadline, "no SIGTERM sent"
            time.sleep(0.01)
        assert controller.busy
        while controller.busy:
            assert time.monotonic() < deadline, "the preemption never ended"
            time.sleep(0.02)
        controller.stop()
        journal.close()
        events = [json.loads(line) for line in launcher_journal(tmp_path).read_text().splitlines()]
        (end,) = [e for e in events if e["event"] == "preempt_end"]
        # the grace was waited out (one worker ignored SIGTERM): by the controller's own clock, which ends a
        # grace early only when every target and the agent are gone
        assert end["seconds"] >= 1.5 and end["killed"]
        outcome = {e["rank"]: e for e in events if e["event"] == "preempt_outcome"}
        # rank 0 exited by itself in the grace, after its 0.3 s save (a bound its handler's sleep guarantees)
        assert outcome[0]["outcome"] == "ended" and outcome[0]["seconds"] >= 0.25
        assert outcome[1]["outcome"] == "killed" and outcome[1]["seconds"] == 1.5
        (sig,) = [e for e in events if e["event"] == "preempt_signal"]
        assert sig["ranks"] == [0, 1] and sig["pids"] == sorted(pids) and sig["agent_pid"] == agent.pid
        assert agents.started == [(0, {"reason": "preempted", "fault": 0})]  # node 0: every agent, anew
        assert controller.error is None
        (p,) = preemptions(Journal.load(tmp_path))
        assert (p.ended, p.killed, p.step, p.grace_s, p.flush_journaled) == ([0], [1], 5, 1.5, False)
        assert p.describe() == ("node 0 preempted at step 5 (grace 1.5 s): rank 0 ended within "
                                f"{p.end_seconds:.2f} s of the SIGTERM with no exit of their own (the signal's default action, or a crash); "
                                "rank 1 still alive at the end of the grace: "
                                "killed; the node came back")
    finally:
        agent.kill()
        agent.wait()
        for pid in locals().get("pids", []):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def test_a_preemption_reads_back_from_the_verdict_file() -> None:
    p = Preemption(fault=1, node=None, step=9, grace_s=10.0, ended=[1], end_seconds=0.2, flush_journaled=True,
                   flushed=10, flush_seconds=0.05)
    assert Preemption.from_json(json.loads(json.dumps(p.to_json()))) == p
    assert p.describe() == ("rank 1 preempted at step 9 (grace 10 s): rank 1 ended within 0.20 s of the SIGTERM "
                            "with no exit of their own (the signal's default action, or a crash); the job persisted "
                            "step 10 in 0.05 s")
    saved = Preemption(fault=1, node=0, step=9, grace_s=10.0, ended=[0, 1], exited_0=[0, 1], end_seconds=0.17)
    assert Preemption.from_json(json.loads(json.dumps(saved.to_json()))) == saved
    assert "exited_0" not in p.to_json()  # written only when set: older files read and write unchanged
    assert saved.describe().startswith("node 0 preempted at step 9 (grace 10 s): ranks 0, 1 exited 0 within 0.17 s")
    coded = Preemption(fault=0, node=0, step=9, grace_s=10.0, ended=[0, 1, 2, 3], exited_0=[3], end_seconds=0.3,
                       exit_codes={"1": 143, "0": 143, "2": 1})
    assert Preemption.from_json(json.loads(json.dumps(coded.to_json()))) == coded
    assert "exit_codes" not in saved.to_json()
    assert coded.describe() == (
        "node 0 preempted at step 9 (grace 10 s): rank 3 exited 0 within 0.30 s of the SIGTERM; rank 2 exited 1 "
        "within 0.30 s of the SIGTERM; ranks 0, 1 exited 143 within 0.30 s of the SIGTERM; the node came back")
    assert p.flush_text == "step 10 (0.05 s)"
    already = Preemption(fault=0, node=1, step=3, grace_s=5, ended=[2], end_seconds=0.1, flush_journaled=True)
    assert already.flush_text == "nothing newer than its last checkpoint"
    assert "nothing newer than its last checkpoint to persist" in already.describe()
    assert Preemption(fault=0, node=1, step=3, grace_s=5).describe() == (
        "node 1 preempted at step 3 (grace 5 s): no worker of it was running; the node came back")


def test_a_request_nobody_takes_is_withdrawn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a harness the firing worker fails after the timeout, and its request can no longer be acted on."""
    import injectors.preempt as mod
    from injectors import WorkerContext
    from injectors.errors import InjectorError

    monkeypatch.setattr(mod, "ACK_TIMEOUT", 0.2)
    inj = mod.PreemptInjector(PreemptConfig(node=0, at_step=1), 3, WorkerContext(
        rank=0, fault_dir=tmp_path, record=lambda *a, **k: None))
    with pytest.raises(InjectorError, match="no harness took the request"):
        inj.inject({"step": 1, "phase": "iteration"})
    assert not list(tmp_path.glob("*.request")) and len(list(tmp_path.glob("*.abandoned"))) == 1


def test_a_sigterm_is_noted_not_obeyed_and_agreed_on(tmp_path: Path) -> None:
    """What a script gets from ``Session.preemption()``: the signal no longer kills the process; ``agreed``
    says it came (a single process: its own word)."""
    import signal as sig

    from harness.worker.session import Session

    previous = sig.getsignal(sig.SIGTERM)
    try:
        term = Session.preemption(None)  # needs nothing of the session
        assert not term.agreed() and term.at is None
        before = time.time()
        os.kill(os.getpid(), sig.SIGTERM)
        assert term.agreed() and term.at is not None and before <= term.at <= time.time()  # when it came
    finally:
        sig.signal(sig.SIGTERM, previous)
