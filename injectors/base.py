"""What every fault shares: a config validated before anything starts, where it runs, and how it is undone.

A fault is described by a config dataclass (one per kind, registered in
:data:`injectors.FAULTS` under its YAML key) that says *what* to do and *when*
(a trigger from :mod:`injectors.trigger`). Before anything starts the harness
calls :meth:`FaultConfig.check` with the run's shape, and
:meth:`FaultConfig.preflight` for what the host must provide (root, ``tc``).

Every injector has the same life cycle — ``inject`` when its trigger fires,
``rollback`` when the fault's window ends or the run stops, always (the
harness and the workers call it in a ``finally``) — and journals both with
timestamps. Two sites run injectors:

* **in the worker** (:mod:`injectors.worker`): faults keyed by rank and step
  (kill, hang, jitter, straggler, storage) subscribe to ``baft.events`` and
  act inside the training process at the exact step and phase;
* **in the harness** (:mod:`injectors.link`): faults on the infrastructure
  (links between node namespaces) follow the job's progress from its journal.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

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
    site: ClassVar[Literal["worker", "harness"]] = "worker"
    """Where the injector runs."""
    fatal: ClassVar[bool] = False
    """Whether firing it takes workers down (the harness then expects a recovery)."""

    def check(self, run: RunShape) -> None:
        """Raise :class:`FaultConfigError` for values impossible in this run."""
        rank = getattr(self, "rank", None)
        if rank is not None and not 0 <= rank < run.world_size:
            raise FaultConfigError("rank", f"a rank in 0..{run.world_size - 1}", rank)
        node = getattr(self, "node", None)
        if node is not None and not 0 <= node < run.nodes:
            raise FaultConfigError("node", f"a node in 0..{run.nodes - 1}", node)

    def preflight(self) -> None:
        """Raise :class:`~injectors.errors.InjectorError` naming what the host lacks (root, a tool)."""

    def targets(self, rank: int, node: int, local_rank: int) -> bool:
        """Whether the worker with this rank (on this node) injects the fault."""
        return rank == getattr(self, "rank", None)


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
    started_at: float = 0.0
    """``time.time()`` when the harness launched the job: the origin of time triggers."""
    checkpoint_dir: Path | None = None
    """The persistent checkpoint tier (storage faults act on it)."""
    restart: int = 0
    """How many processes of this rank ran before this one (0 in the first; a fault ``at_restore: N`` fires in
    the N-th restart's restore)."""
