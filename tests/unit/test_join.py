"""A node joining again: the fault's config, the scenario's checks, the harness's controller on real processes
and signals, and how the journal numbers the incarnations of a job whose world shrank and grew."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.compare import compare
from analysis.journal import Journal, JournalWriter, _number_incarnations, launcher_journal, rank_journal
from harness.run.join import JoinController
from harness.scenario import ScenarioError, load
from injectors import FAULTS, RunShape, WorkerContext
from injectors.errors import FaultConfigError, InjectorError
from injectors.handoff import ack_path
from injectors.join import NodeJoinConfig, NodeJoinInjector, request_path
from injectors.process import lost_marker
from tests.fakes import FakeAgents

SHAPE = RunShape(world_size=4, steps=20, nodes=2)


@pytest.mark.parametrize("fields, field, check", [
    ({"node": 0, "at_step": 3}, "node", False),  # the rendezvous host never leaves for good
    ({"node": 2, "at_step": 3}, "node", True),
    ({"node": 1, "at_step": 3, "every": 2, "times": 2}, "every", True),
    ({"node": 1, "mtbf": 5.0}, "at_step", True),
])
def test_bad_configs_name_their_field(fields: dict[str, Any], field: str, check: bool) -> None:
    with pytest.raises(FaultConfigError) as info:
        c = NodeJoinConfig(**fields)
        if check:
            c.check(SHAPE)
    assert info.value.field == field


def test_rank_0_fires_it() -> None:
    c = NodeJoinConfig(node=1, at_step=3)
    c.check(SHAPE)
    assert [r for r in range(4) if c.targets(r, r // 2, r % 2)] == [0] and FAULTS["node_join"][0] is NodeJoinConfig


JOIN = """\
name: join
workload: {model: gpt-tiny, stages: 2, data_parallel: 2, microbatches: 4, steps: 24, nodes: 2}
checkpoint: {strategy: baft, every: 2}
faults:
  - node_loss: {node: 1, at_step: 8, replacement: false}
  - node_join: {node: 1, at_step: 14}
expect: {loss: {rtol: 0.02, window: 5}}
"""


def test_the_scenario_knows_which_nodes_are_gone_at_the_end(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(JOIN)
    s = load(f)
    assert s.lost_nodes == [1] and s.joined_nodes == [1] and s.lost_for_good == []


@pytest.mark.parametrize("old, new, path, expected", [
    ("replacement: false", "replacement: true", "faults[1].node_join.node", "takes away for good"),
    ("node: 1, at_step: 14", "node: 1, at_step: 8", "faults[1].node_join.at_step", "a step after faults[0]"),
    ("  - node_join: {node: 1, at_step: 14}\n",
     "  - node_join: {node: 1, at_step: 14}\n  - node_join: {node: 1, at_step: 18}\n",
     "faults[2].node_join.node", "joins once"),
    ("node_loss: {node: 1, at_step: 8, replacement: false}\n  - node_join: {node: 1, at_step: 14}",
     "node_loss: {node: 1, at_time: 20, replacement: false}\n  - node_join: {node: 1, at_time: 10}",
     "faults[1].node_join.at_time", "a time after faults[0].node_loss.at_time (20"),
])
def test_a_join_that_cannot_happen_is_bad_input(tmp_path: Path, old: str, new: str, path: str, expected: str) -> None:
    assert old in JOIN
    f = tmp_path / "s.yaml"
    f.write_text(JOIN.replace(old, new))
    with pytest.raises(ScenarioError) as e:
        load(f)
    assert e.value.path == path and expected in e.value.expected, (e.value.path, e.value.expected)


class Held:
    """The hang watchdog as the controller sees it."""

    held = 0


def start_event(root: Path, rank: int, pid: int, world: int) -> None:
    d = root / "journal" / f"rank-{rank}"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "events.jsonl", "a") as f:
        f.write(json.dumps({"t": time.time(), "event": "start", "rank": rank, "pid": pid, "world_size": world},
                           separators=(",", ":")) + "\n")


def injector(tmp_path: Path) -> NodeJoinInjector:
    return NodeJoinInjector(NodeJoinConfig(node=1, at_step=5), 1, WorkerContext(
        rank=0, fault_dir=tmp_path / "faults", record=lambda *a, **k: None))


def test_the_controller_refuses_a_node_that_was_not_lost_and_the_worker_says_why(tmp_path: Path) -> None:
    (tmp_path / "faults").mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    journal, watchdog = JournalWriter(launcher_journal(tmp_path)), Held()
    agents = FakeAgents([subprocess.Popen([sys.executable, "-c", "pass"]), gone])
    controller = JoinController(tmp_path, agents, journal, watchdog=watchdog)  # type: ignore[arg-type]
    controller.start()
    try:
        with pytest.raises(InjectorError, match="node 1 was not lost for good"):
            injector(tmp_path).inject({"step": 5, "phase": "iteration"})
    finally:
        controller.stop()
        journal.close()
    assert isinstance(controller.error, Exception) and agents.started == [] and watchdog.held == 0
    events = [json.loads(line) for line in launcher_journal(tmp_path).read_text().splitlines()]
    assert [e["event"] for e in events] == ["join_error"] and "not lost for good" in events[0]["error"]


def test_the_controller_brings_the_node_back_and_rank_0_holds_until_its_sigterm(tmp_path: Path) -> None:
    """Rank 0 waits at the fault's point until its agent stops it to re-form the job; the SIGTERM then takes
    the course the process had set for it. The hang watchdog is held until rank 0's next process starts."""
    faults = tmp_path / "faults"
    faults.mkdir()
    lost_marker(faults, 1).touch()
    start_event(tmp_path, 0, 111, 2)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    journal, watchdog = JournalWriter(launcher_journal(tmp_path)), Held()
    agents = FakeAgents([subprocess.Popen([sys.executable, "-c", "pass"]), gone])
    controller = JoinController(tmp_path, agents, journal, watchdog=watchdog)  # type: ignore[arg-type]
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: got.append(s))

    seen: list[tuple[int, int]] = []

    def reform() -> None:  # what the agent does once the joined node waits: SIGTERM to its workers
        while not ack_path(request_path(faults, 1)).exists():
            time.sleep(0.01)
        time.sleep(0.2)
        seen.append((watchdog.held, len(got)))  # checked below: rank 0 still holds, the watchdog held
        os.kill(os.getpid(), signal.SIGTERM)

    controller.start()
    agent = threading.Thread(target=reform)
    agent.start()
    try:
        t0 = time.monotonic()
        injector(tmp_path).inject({"step": 5, "phase": "iteration"})
        assert time.monotonic() - t0 >= 0.2
        agent.join()
        assert seen == [(1, 0)]
        assert got == [signal.SIGTERM]  # delivered to the handler the process had
        assert signal.getsignal(signal.SIGTERM) is not None and not lost_marker(faults, 1).exists()
        assert agents.exits == [(1, {"reason": "lost"})] and agents.started == [(1, {"reason": "joined", "fault": 1})]
        assert watchdog.held == 1
        start_event(tmp_path, 0, 222, 4)  # the re-formed job's rank 0
        deadline = time.monotonic() + 5
        while watchdog.held:
            assert time.monotonic() < deadline, "the watchdog stayed held"
            time.sleep(0.02)
    finally:
        signal.signal(signal.SIGTERM, previous)
        controller.stop()
        journal.close()
    assert controller.error is None
    (ev,) = [json.loads(line) for line in launcher_journal(tmp_path).read_text().splitlines()]
    assert ev["event"] == "node_join" and (ev["node"], ev["fault"], ev["step"]) == ("node1", 1, 5)


# --- incarnations --------------------------------------------------------------------------------------------

@st.composite
def histories(draw: st.DrawFn) -> tuple[list[set[int]], dict[int, list[dict[str, Any]]]]:
    """A job's formings (rank 0 in each; the others away in some) and the start events their ranks wrote,
    each forming's within a second of its beginning, in any order across ranks."""
    ranks = draw(st.integers(1, 5))
    members = [set(range(ranks))] + draw(st.lists(
        st.sets(st.integers(1, ranks - 1)).map(lambda s: s | {0}) if ranks > 1 else st.just({0}), max_size=5))
    gaps = draw(st.lists(st.floats(1.0, 10.0), min_size=len(members), max_size=len(members)))
    begins = [sum(gaps[:g]) for g in range(len(members))]
    sized = draw(st.booleans())  # older journals' starts do not say their world size
    journals: dict[int, list[dict[str, Any]]] = {}
    for g, m in enumerate(members):
        for r in sorted(m):
            start = {"event": "start", "t": begins[g] + draw(st.floats(0, 0.45)), "rank": r, "truth": g}
            if sized:
                start["world_size"] = 2 * len(m)
            journals.setdefault(r, []).append(start)
            journals[r].append({"event": "step", "t": begins[g] + 0.5, "step": g})
    return members, journals


@settings(max_examples=200, deadline=None)
@given(histories())
def test_every_start_lands_in_the_forming_it_belonged_to(history: tuple[list[set[int]], dict[int, list]]) -> None:
    members, journals = history
    _number_incarnations(journals)
    for evs in journals.values():
        truth = None
        for e in evs:
            truth = e.get("truth", truth)
            sized = "world_size" in evs[0]
            assert e["incarnation"] == truth and e["world"] == (2 * len(members[truth]) if sized else None)
            assert e.get("resized", False) == (sized and any(len(members[g]) != len(members[0])
                                                             for g in range(truth + 1)))


def test_ranks_restarted_together_count_alike_whatever_the_order_of_their_times() -> None:
    """Every rank started as often as rank 0: its k-th start is the k-th incarnation (journals written one rank
    after another, as hand-made ones are, have no common clock to go by)."""
    journals = {r: [{"event": "start", "t": 10 * r + k, "world_size": 2} for k in range(3)] for r in range(2)}
    _number_incarnations(journals)
    assert [[e["incarnation"] for e in evs] for evs in journals.values()] == [[0, 1, 2], [0, 1, 2]]


def write(root: Path, rank: int, worlds: list[int], digest: str) -> None:
    w = JournalWriter(rank_journal(root, rank), rank=rank, attempt=0)
    for k, world in enumerate(worlds):
        w.write("start", node="node0", world_size=world)
        w.write("state", step=k, digests={"model": {"w": digest if k else "w0"}})
    w.close()


def test_records_after_the_world_changed_and_came_back_are_not_compared_bit_for_bit(tmp_path: Path) -> None:
    """The state after a shrink and a grow went through other arithmetic: the loss curve judges it."""
    write(tmp_path / "ref", 0, [2, 2, 2], "w")
    write(tmp_path / "run", 0, [2, 1, 2], "other")
    run = Journal.load(tmp_path / "run")
    assert run.world_sizes() == [2, 1, 2]
    c = compare(Journal.load(tmp_path / "ref"), run)
    assert c.equal and c.states_compared == 1 and c.resized == 2


def test_the_world_sizes_gone_through_read_back_and_an_older_file_without_them_reads_as_before() -> None:
    from analysis.verdict import WorldSize
    grown = WorldSize(reference=4, final=4, sizes=[4, 2, 4])
    assert grown.changed and grown.path == "4 -> 2 -> 4" and grown.first_change == "the first resize"
    assert WorldSize.from_json(json.loads(json.dumps(grown.to_json()))) == grown
    older = WorldSize.from_json({"reference": 4, "final": 2})  # written before the sizes were
    assert older.sizes == [] and older.changed and older.path == "4 -> 2" and older.first_change == "the resize"
    assert not WorldSize(reference=2, final=2, sizes=[2]).changed
