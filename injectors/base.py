"""What every fault injector shares: a config, validation, a trigger, inject and rollback.

A fault is described by a config dataclass (one per kind, registered in
:data:`injectors.FAULTS` under its YAML key). Before anything starts, the
harness calls :meth:`FaultConfig.check` with the run's world size and step
count. In-worker faults (those keyed by rank and step) are armed inside each
worker process: they subscribe to ``baft.events`` and fire when their trigger
matches, exactly once per run — a marker file in the run's fault directory
survives the restart the fault provokes, so a restored worker passing the same
step does not fire again.
"""
from __future__ import annotations

import dataclasses
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from baft import events

from .errors import FaultConfigError

Recorder = Callable[..., None]
"""``record(event, **fields)``: journal an event durably (the probe's ``record``)."""


@dataclass(kw_only=True, slots=True)
class RunShape:
    """The facts about a run a fault config is validated against."""

    world_size: int
    steps: int
    nodes: int


class FaultConfig:
    """Base of fault config dataclasses; subclasses set ``kind`` and may extend :meth:`check`."""

    kind: ClassVar[str]

    def check(self, run: RunShape) -> None:
        """Raise :class:`FaultConfigError` for values impossible in this run."""
        rank = getattr(self, "rank", None)
        if rank is not None and not 0 <= rank < run.world_size:
            raise FaultConfigError("rank", f"a rank in 0..{run.world_size - 1}", rank)
        node = getattr(self, "node", None)
        if node is not None and not 0 <= node < run.nodes:
            raise FaultConfigError("node", f"a node in 0..{run.nodes - 1}", node)
        at_step = getattr(self, "at_step", None)
        if at_step is not None and not 0 <= at_step < run.steps:
            raise FaultConfigError("at_step", f"a step in 0..{run.steps - 1}", at_step)


@dataclass(kw_only=True, slots=True)
class WorkerContext:
    """Where an in-worker injector runs: this rank, the fault directory, the journal."""

    rank: int
    fault_dir: Path
    record: Recorder
    node: int = 0
    local_rank: int = 0
    node_memory: Path | None = None
    """The node's shared-memory directory (where baft's snapshots and replicas live)."""


class InWorkerInjector(ABC):
    """A fault fired from inside the worker at (rank, step, phase)."""

    def __init__(self, config: Any, fault_id: int, ctx: WorkerContext) -> None:
        self.config, self.fault_id, self.ctx = config, fault_id, ctx
        self._unsubscribe: Callable[[], None] | None = None

    @property
    def marker(self) -> Path:
        return self.ctx.fault_dir / f"{self.fault_id}-{self.config.kind}.fired"

    def fired(self) -> bool:
        return self.marker.exists()

    def mine(self) -> bool:
        """Whether this worker is the one that fires the fault."""
        return self.ctx.rank == self.config.rank

    def arm(self) -> None:
        if self.mine() and not self.fired():
            self._unsubscribe = events.subscribe(self._on_event)

    def disarm(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def _on_event(self, kind: str, fields: dict[str, Any]) -> None:
        if kind == "phase" and self.matches(fields) and not self.fired():
            self.disarm()
            self._mark()
            spec = {f.name: getattr(self.config, f.name) for f in dataclasses.fields(self.config)}
            self.ctx.record("fault", **{**spec, "fault": self.config.kind, "id": self.fault_id, **fields})
            self.inject()

    def matches(self, fields: dict[str, Any]) -> bool:
        return fields.get("step") == self.config.at_step and fields.get("phase") == self.config.phase

    def _mark(self) -> None:
        self.ctx.fault_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.marker, os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @abstractmethod
    def inject(self) -> None:
        """Do the damage. May not return (a kill)."""
