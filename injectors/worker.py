"""Injectors that act inside a training worker, on ``baft``'s public phase events.

Each worker builds the injectors of every declared fault and arms those that
target it. They listen to ``baft.events`` (``phase`` events carry the step), so
a fault keyed to ``(rank, step, phase)`` acts at exactly that point, before
the work of that phase starts.

A point fault fires each occurrence once per run, even when it kills the
process: before acting it journals the firing durably and leaves a marker file
per occurrence in the run's fault directory, which the restarted worker finds
when it passes the same step again. A window fault is switched on and off as
the steps go by; switching off is its rollback, journaled, and also happens
when the worker disarms it at the end (or on its way out).
"""
from __future__ import annotations

import dataclasses
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from baft import events

from .base import FaultConfig, WorkerContext
from .trigger import PointFault, WindowFault


def describe(config: FaultConfig) -> dict[str, Any]:
    """A fault's fields as plain data for the journal."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}  # type: ignore[arg-type]


class WorkerInjector(ABC):
    """Common plumbing: subscription to phase events, the elapsed-time clock, journaling."""

    def __init__(self, config: Any, fault_id: int, ctx: WorkerContext) -> None:
        self.config, self.fault_id, self.ctx = config, fault_id, ctx
        self._unsubscribe: Callable[[], None] | None = None

    def mine(self) -> bool:
        """Whether this worker is one that injects the fault."""
        return self.config.targets(self.ctx.rank, self.ctx.node, self.ctx.local_rank)

    def elapsed(self) -> float:
        return time.time() - self.ctx.started_at if self.ctx.started_at else 0.0

    def arm(self) -> None:
        if self.mine() and self._unsubscribe is None:
            self._unsubscribe = events.subscribe(self._on_event)

    def disarm(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def journal(self, event: str, **fields: Any) -> None:
        self.ctx.record(event, **{**describe(self.config), "fault": self.config.kind, "id": self.fault_id,
                                  "fatal": self.config.fatal, "elapsed": round(self.elapsed(), 4), **fields})

    @abstractmethod
    def _on_event(self, kind: str, fields: dict[str, Any]) -> None: ...


class InWorkerInjector(WorkerInjector):
    """A point fault fired from inside the worker when its trigger matches a phase event."""

    def marker(self, occurrence: int) -> os.PathLike[str]:
        return self.ctx.fault_dir / f"{self.fault_id}-{self.config.kind}-{occurrence}.fired"

    def fired(self) -> set[int]:
        """Occurrences already fired in this run (by this or an earlier worker)."""
        prefix = f"{self.fault_id}-{self.config.kind}-"
        if not self.ctx.fault_dir.is_dir():
            return set()
        return {int(p.name[len(prefix):-6]) for p in self.ctx.fault_dir.glob(prefix + "*.fired")}

    def _on_event(self, kind: str, fields: dict[str, Any]) -> None:
        if kind != "phase":
            return
        config: PointFault = self.config
        k = config.due(fields.get("step", -1), fields.get("phase", ""), self.elapsed(), self.fired(), self.ctx.restart)
        if k is None or not self.accepts(fields):
            return
        self._mark(k)
        self.journal("fault", occurrence=k, **fields)
        self.inject(fields)

    def accepts(self, fields: dict[str, Any]) -> bool:
        """A further condition on the phase event: the micro-batch asked for (``microbatch``, the first by default);
        for ``backward_weight`` the step's first weight-gradient pass, whichever microbatch it is (a zero-bubble
        schedule such as DualPipeV may run a rank's weight passes only for its last microbatches)."""
        wanted = getattr(self.config, "microbatch", 0)
        return fields.get("phase") == "backward_weight" or fields.get("microbatch", 0) == wanted

    def _mark(self, occurrence: int) -> None:
        self.ctx.fault_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.marker(occurrence), os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @abstractmethod
    def inject(self, fields: dict[str, Any]) -> None:
        """Do the damage. May not return (a kill)."""


class WindowInjector(WorkerInjector):
    """A window fault: ``begin`` when its window opens, ``rollback`` when it closes or the worker stops.

    The window is evaluated at each ``iteration`` phase event; its opening is journaled
    as a ``fault`` (with ``occurrence`` 0), its closing as ``fault_rollback``.
    """

    def __init__(self, config: Any, fault_id: int, ctx: WorkerContext) -> None:
        super().__init__(config, fault_id, ctx)
        self.step = -1
        self.on = False
        self._began_at: float | None = None

    def _on_event(self, kind: str, fields: dict[str, Any]) -> None:
        if kind != "phase" or fields.get("phase") != "iteration":
            return
        config: WindowFault = self.config
        self.step = fields.get("step", -1)
        elapsed = self.elapsed()
        if not self.on and config.active(self.step, elapsed, self._began_at):
            self._began_at = elapsed if self._began_at is None else self._began_at
            self.on = True
            self.journal("fault", occurrence=0, step=self.step, phase="iteration")
            self.begin()
        elif self.on and config.ended(self.step, elapsed, self._began_at):
            self.rollback("window ended")

    def rollback(self, reason: str) -> None:
        if self.on:
            self.on = False
            self.end()
            self.journal("fault_rollback", step=self.step, reason=reason)

    def disarm(self) -> None:
        WorkerInjector.disarm(self)
        self.rollback("run ended")

    def begin(self) -> None:
        """Start the fault (most window faults act on later events while ``self.on``)."""

    def end(self) -> None:
        """Undo the fault."""
