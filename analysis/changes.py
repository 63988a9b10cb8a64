"""What the checkpointing did besides recovering, from the journals: checkpoints refused or failed, the persist
interval adapting, the stores stopping and resuming replication, baft's planner finding a stage's windows too
small for its state. The verdict lists each (``verdict.json``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .journal import Journal
from .record import Record


@dataclass(kw_only=True, slots=True)
class CheckpointIssue(Record):
    """A checkpoint that was rejected or whose write failed (the first reason any rank gave)."""

    step: int | None
    """The step it was for."""
    tier: str | None
    """The tier (``shm``, ``replica``, ``persistent``)."""
    reason: str | None
    """Why, as journaled."""


@dataclass(kw_only=True, slots=True)
class IntervalChange(Record):
    """The persistent interval adapting (``checkpoint.mtbf_hours``), as every rank journaled it."""

    step: int
    """The persist boundary at which it changed."""
    every: int
    """The new interval, in steps."""
    before: int
    """The interval until then."""
    cost_seconds: float
    """The cost of one persist it was decided for (the largest over the ranks)."""
    why: str
    """The decision in words."""


@dataclass(kw_only=True, slots=True)
class ReplicationChange(Record):
    """A node's store stopping or resuming replication (the link against the persistent tier)."""

    node: str
    """The store's node (``node<N>``)."""
    step: int | None
    """The newest step any rank had journaled by then (None: before the first)."""
    stopped: bool
    """True: replication stopped (``replication_degraded``); False: it resumed."""
    reason: str
    """The store's reason, with the numbers that decided it."""



def checkpoint_issues(evs: list[dict[str, Any]]) -> list[CheckpointIssue]:
    """One entry per (step, tier) with the first reason given (every rank reports its own)."""
    out: dict[tuple[Any, Any], CheckpointIssue] = {}
    for e in evs:
        out.setdefault((e.get("step"), e.get("tier")),
                       CheckpointIssue(step=e.get("step"), tier=e.get("tier"), reason=e.get("reason")))
    return sorted(out.values(), key=lambda c: (c.step is None, c.step))


def interval_changes(evs: list[dict[str, Any]]) -> list[IntervalChange]:
    """One entry per step at which the interval changed (every rank journals the same decision)."""
    out: dict[int, IntervalChange] = {}
    for e in evs:
        out.setdefault(int(e["step"]), IntervalChange(step=int(e["step"]), every=int(e["every"]), before=int(e["before"]),
                                                      cost_seconds=float(e["cost_seconds"]), why=str(e.get("why", ""))))
    return [out[k] for k in sorted(out)]


def replication_changes(run: Journal) -> list[ReplicationChange]:
    """The stores' stops and resumptions, each at the newest step the ranks had journaled by then."""
    marks = sorted((e["t"], int(e["step"])) for evs in run.ranks.values() for e in evs
                   if isinstance(e.get("step"), int) and not isinstance(e.get("step"), bool))
    out = []
    for e in run.stores:
        if e["event"] in ("replication_degraded", "replication_resumed"):
            step = max((s for t, s in marks if t <= e["t"]), default=None)
            out.append(ReplicationChange(node=str(e.get("node")), step=step, stopped=e["event"] == "replication_degraded",
                                         reason=str(e.get("reason", ""))))
    return out


@dataclass(kw_only=True, slots=True)
class PlanOverflow(Record):
    """baft's planner finding a stage's pipeline windows too small for its state, and what it did instead
    (``checkpoint.baft.planner.overflow``): snapshot every ``every`` iterations, or copy the rest at the step
    boundary and stall."""

    rank: int
    """The rank whose windows did not hold its state."""
    step: int | None
    """The step of the plan (the first of the same decision on that rank)."""
    bytes: int
    """The state per snapshot, bytes."""
    overflow_bytes: int
    """What the windows could not hold, bytes."""
    windows: int
    """Windows per iteration the plan used."""
    idle_ms: float
    """Their length in all, ms per iteration."""
    policy: str
    """``every_k`` or ``stall``."""
    every: int
    """Snapshot every this many iterations."""
    stall_ms: float
    """The stall per snapshot (copying what did not fit at the step boundary), ms."""

    def describe(self) -> str:
        held = (self.bytes - self.overflow_bytes) / 1e6
        what = (f"a snapshot every {self.every} iterations (overflow every_k)" if self.policy == "every_k"
                else f"the rest copied at the step boundary, {self.stall_ms:.1f} ms stall per snapshot (overflow stall)")
        since = f" from step {self.step}" if self.step is not None else ""
        return (f"rank {self.rank}{since}: {self.windows} windows, {self.idle_ms:.1f} ms idle, hold "
                f"{held:.2f} of {self.bytes / 1e6:.2f} MB; {what}")


def plan_overflows(run: Journal) -> list[PlanOverflow]:
    """The plans whose windows could not hold the state, per rank each time the decision changed (a replan to the
    same policy and interval is the same decision)."""
    out: list[PlanOverflow] = []
    for rank in sorted(run.ranks):
        last: tuple[str, int] | None = None
        for e in run.events("replan", rank):
            if not e.get("overflow_bytes") or not e.get("windows"):
                last = None  # held; or planned before the profiler measured any window (the warm-up copies)
                continue
            decision = (str(e.get("policy")), int(e.get("every", 1)))
            if decision != last:
                out.append(PlanOverflow(rank=rank, step=e.get("step"), bytes=int(e["bytes"]),
                                        overflow_bytes=int(e["overflow_bytes"]), windows=int(e.get("windows", 0)),
                                        idle_ms=float(e.get("idle_ms", 0.0)), policy=decision[0], every=decision[1],
                                        stall_ms=float(e.get("stall_ms", 0.0))))
            last = decision
    return out
