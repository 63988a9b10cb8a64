"""Why workers ended: the failures torchrun's agents saw (``worker_failed``), placed in the job's history,
the workers that did not end: alive after every rank had finished (``teardown_hang``), ended by the harness,
and the preemptions: what each rank did between SIGTERM and the end of its grace period.

A restart that no fault explains is a failure of the job itself; the verdict names it with what the
agents saw: the rank, the signal or exit code, the first line of its error (an uncaught exception, with
its innermost frame), and where the rank was in its training (during a step, or after it had finished
every step: a crash in the interpreter's teardown).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .journal import Journal
from .record import Record


@dataclass(kw_only=True, slots=True)
class WorkerFailure(Record):
    """One worker that ended badly, as its node's torchrun agent saw it."""

    rank: int
    """Its global rank."""
    node: str
    """The node whose agent saw it."""
    incarnation: int
    """The job's incarnation it belonged to (0: the first start)."""
    exitcode: int
    """Its exit status (negative: the signal's number)."""
    signal: str | None
    """The signal that ended it (SIGKILL, SIGABRT, ...), None when it exited."""
    message: str
    """The first line of its error file (``Type: text`` of an uncaught exception) or torchrun's words."""
    where: str | None
    """The innermost frame of the uncaught exception, when there was one."""
    last_step: int | None
    """The last iteration it journaled in that incarnation (None: none)."""
    finished: bool
    """It had journaled ``finish``: it died after its last step, on the way out."""
    explained: bool
    """A fatal fault fired in that incarnation (the kill itself, or a peer that lost its partner to it)."""

    def describe(self, ranks: list[int] | None = None) -> str:
        """One line for a person; ``ranks``: the ranks that ended alike (default: this one)."""
        ranks = ranks or [self.rank]
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
        how = self.signal or f"exit code {self.exitcode}"
        said = f": {_cut(self.message)}" if self.message and not self.message.startswith("Signal ") else ""
        at = f" ({self.where})" if self.where else ""
        if self.finished:
            when = "after finishing every step (in the process's teardown)"
        elif self.last_step is not None:
            when = f"after step {self.last_step}"
        else:
            when = "before a first step"
        return f"incarnation {self.incarnation}: {who} ended with {how} {when}{said}{at}"


@dataclass(kw_only=True, slots=True)
class TeardownHang(Record):
    """A worker still alive ``seconds`` after it journaled its last step, once every rank had: stuck in its
    process's teardown. The harness ended the job; the run counts as completed (a finding about the job's
    stack, e.g. torch's gloo teardown deadlocking on the GIL, not a fault)."""

    run: str
    """``reference`` or ``faulted``."""
    rank: int
    pid: int
    seconds: float
    """From its ``finish`` to the harness ending it (the run's ``exit_timeout`` and a little)."""
    where: str
    """Its Python stacks (``py-spy dump``) or its threads' kernel waits, as read before it was ended."""

    def describe(self) -> str:
        inner = next((line.strip() for line in self.where.splitlines() if line.strip().startswith(("Thread", "threads"))), "")
        return (f"{self.run} run: rank {self.rank} (pid {self.pid}) still alive {self.seconds:.0f} s after its last "
                f"step: stuck in its teardown, ended by the harness (not a fault; a finding about the job's stack)"
                + (f"; {_cut(inner, 160)}" if inner else ""))


@dataclass(kw_only=True, slots=True)
class Preemption(Record):
    """One preemption: SIGTERM to a node's (or some ranks') processes, what each did in the grace period."""

    fault: int
    """The fault's index in the scenario."""
    occurrence: int = 0
    """Which firing of the fault (a periodic or random trigger fires several)."""
    node: int | None
    """The node preempted (None: the ranks named)."""
    step: int
    """The step (or version, for a checkpoint phase) at which it fired."""
    grace_s: float
    ended: list[int] = field(default_factory=list)
    """Ranks whose process ended within the grace (it exited, or the signal's default action ended it)."""
    end_seconds: float | None = None
    """From the SIGTERM to the last of them ending."""
    exited_0: list[int] = field(default_factory=list)
    """Of :attr:`ended`, the ranks whose script returned normally in the grace (their worker journaled
    ``finish``: exit 0); the others exited with another code or were ended by the signal (143)."""
    exit_codes: dict[str, int] = field(default_factory=dict)
    """Of :attr:`ended`, the ranks (keys: the rank as text, as JSON keeps it) whose script exited in the grace with
    a non-zero code of its own (``sys.exit(143)``: the worker journaled ``exit``), and that code; a rank
    in neither this nor :attr:`exited_0` was ended by the signal (no handler) or by a crash."""
    killed: list[int] = field(default_factory=list)
    """Ranks still alive when the grace ended: SIGKILLed."""
    flush_journaled: bool = False
    """The job journaled its answer to the SIGTERM (the built-in workload does: ``preempt_flush``)."""
    flushed: int | None = None
    """The step it persisted in the grace (None: none newer than its last checkpoint, or not journaled)."""
    flush_seconds: float | None = None
    restart: bool = True
    """Whether the node came back."""

    def to_json(self) -> dict[str, Any]:
        """The fields; ``exited_0`` and ``exit_codes`` only where set (older files read and write unchanged)."""
        out = Record.to_json(self)
        for name in ("exited_0", "exit_codes"):
            if not out[name]:
                del out[name]
        return out

    @property
    def flush_text(self) -> str:
        if not self.flush_journaled:
            return "not journaled by the job"
        if self.flushed is None:
            return "nothing newer than its last checkpoint"
        return f"step {self.flushed} ({self.flush_seconds:.2f} s)"

    def describe(self) -> str:
        ranks = sorted(self.ended + self.killed)
        who = f"node {self.node}" if self.node is not None else (_ranks(ranks) if ranks else "ranks")
        parts = []
        if self.exited_0:
            parts.append(f"{_ranks(self.exited_0)} exited 0 within {self.end_seconds:.2f} s of the SIGTERM")
        by_code: dict[int, list[int]] = {}
        for rank, code in sorted(self.exit_codes.items(), key=lambda kv: int(kv[0])):
            by_code.setdefault(code, []).append(int(rank))
        for code, ranks_with in sorted(by_code.items()):
            parts.append(f"{_ranks(ranks_with)} exited {code} within {self.end_seconds:.2f} s of the SIGTERM")
        coded = {int(r) for r in self.exit_codes}
        if others := [r for r in self.ended if r not in self.exited_0 and r not in coded]:
            parts.append(f"{_ranks(others)} ended within {self.end_seconds:.2f} s of the SIGTERM with no exit of "
                         "their own (the signal's default action, or a crash)")
        if self.killed:
            parts.append(f"{_ranks(self.killed)} still alive at the end of the grace: killed")
        if not ranks:
            parts.append("no worker of it was running")
        if self.flush_journaled:
            parts.append(f"the job persisted step {self.flushed} in {self.flush_seconds:.2f} s" if self.flushed
                         is not None else "the job had nothing newer than its last checkpoint to persist")
        back = "" if self.node is None else ("; the node came back" if self.restart else "; the node stayed gone")
        return f"{who} preempted at step {self.step} (grace {self.grace_s:g} s): " + "; ".join(parts) + back


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def preemptions(run: Journal) -> list[Preemption]:
    """The preemptions of a run's launcher journal, with the workers' answers (``preempt_flush``)."""
    out = []
    flushes = sorted(run.events("preempt_flush"), key=lambda e: e["t"])
    finishes = run.events("finish")
    exits = run.events("exit")
    launcher = run.launcher
    for sig in (e for e in launcher if e.get("event") == "preempt_signal"):
        key = (sig.get("fault"), sig.get("occurrence", 0))
        mine = [e for e in launcher if (e.get("fault"), e.get("occurrence", 0)) == key and e["t"] >= sig["t"]]
        outcomes = [e for e in mine if e.get("event") == "preempt_outcome"]
        end = next((e for e in mine if e.get("event") == "preempt_end"), None)
        until = end["t"] if end is not None else float("inf")
        ended = [e for e in outcomes if e.get("outcome") in ("ended", "exited")]
        answers = [e for e in flushes if sig["t"] <= e["t"] <= until]
        done = [e for e in answers if e.get("persisted") is not None]
        out.append(Preemption(
            fault=int(key[0] or 0), occurrence=int(key[1] or 0), node=sig.get("node"), step=int(sig.get("step", -1)),
            grace_s=float(sig.get("grace_s", 0.0)), ended=sorted(int(e["rank"]) for e in ended),
            end_seconds=max((float(e["seconds"]) for e in ended), default=None),
            exited_0=sorted({int(e["rank"]) for e in finishes if sig["t"] <= e["t"] <= until}
                            & {int(e["rank"]) for e in ended}),
            exit_codes={str(e["rank"]): int(e["code"]) for e in exits if sig["t"] <= e["t"] <= until
                        and int(e["rank"]) in {int(o["rank"]) for o in ended}},
            killed=sorted(int(e["rank"]) for e in outcomes if e.get("outcome") == "killed"),
            flush_journaled=bool(answers), flushed=max((int(e["persisted"]) for e in done), default=None),
            flush_seconds=max((float(e["seconds"]) for e in done), default=None),
            restart=bool(end.get("restart", True)) if end is not None else True))
    return out


def teardown_hangs(journal: Journal, run: str) -> list[TeardownHang]:
    """The ``teardown_hang`` events of one run's launcher journal."""
    return [TeardownHang(run=run, rank=int(e["rank"]), pid=int(e.get("pid", 0)), seconds=float(e.get("seconds", 0.0)),
                         where=str(e.get("where") or "")) for e in journal.launcher if e.get("event") == "teardown_hang"]


def _cut(text: str, limit: int = 240) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def worker_failures(run: Journal) -> list[WorkerFailure]:
    """Every failure the agents journaled, in order, each placed in the incarnation running at that moment."""
    starts = sorted((e["t"], e["incarnation"]) for e in run.events("start"))
    fatal = {_incarnation(starts, f) for f in run.events("fault") if f.get("fatal", True)}
    fatal |= {_incarnation(starts, e) for e in run.launcher if e.get("event") == "hang_detected"}
    out = []
    for e in run.events("worker_failed"):
        rank = int(e["rank"])
        # The rank's own events of the same torchrun attempt place it (an agent whose workers restart because
        # another node failed keeps its count, so the newest incarnation started by then); a worker that
        # journaled nothing is placed by time among every rank's starts.
        same = [x for x in run.ranks.get(rank, []) if x.get("attempt") == e.get("attempt") and x["t"] <= e["t"]]
        inc = max((x["incarnation"] for x in same), default=None)
        if inc is None:
            inc = _incarnation(starts, e)
        mine = [x for x in same if x["incarnation"] == inc]
        steps = [x["step"] for x in mine if x["event"] == "step"]
        out.append(WorkerFailure(
            rank=rank, node=str(e.get("node", "")), incarnation=inc, exitcode=int(e.get("exitcode", 0)),
            signal=e.get("signal"), message=str(e.get("message") or ""), where=e.get("where"),
            last_step=max(steps) if steps else None, finished=any(x["event"] == "finish" for x in mine),
            explained=inc in fatal))
    return out


def _incarnation(starts: list[tuple[float, int]], event: dict[str, Any]) -> int:
    """The incarnation an event belongs to: its own (a rank's event), else (the launcher's, an agent's) the
    newest started by then."""
    if "incarnation" in event:
        return int(event["incarnation"])
    return max((inc for t, inc in starts if t <= event["t"]), default=0)


def unexplained(failures: list[WorkerFailure]) -> str:
    """The failures no fault explains, one clause per incarnation and way of ending (the ranks that ended
    alike named together), or the old advice when the agents saw none. Where a worker of an incarnation
    ended otherwise, the SIGTERMs are left out: torchrun sends them to the rest of the group once one fails."""
    alike: dict[tuple[Any, ...], list[WorkerFailure]] = {}
    for f in failures:
        if not f.explained:
            key = (f.incarnation, f.signal, f.exitcode, f.message, f.where, f.last_step, f.finished)
            alike.setdefault(key, []).append(f)
    causes = {inc for (inc, sig, *_) in alike if sig != "SIGTERM"}
    return ("; ".join(fs[0].describe(sorted(f.rank for f in fs)) for (inc, sig, *_), fs in alike.items()
                      if sig != "SIGTERM" or inc not in causes)
            or "the job itself crashed, hung or timed out")
