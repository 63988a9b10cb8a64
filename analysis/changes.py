"""What the checkpointing did besides recovering, from the journals: checkpoints refused or failed, the persist
interval adapting, the stores stopping and resuming replication. The verdict lists each (``verdict.json``)."""
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
