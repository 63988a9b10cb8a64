"""``baft``'s own settings: the ``checkpoint.baft`` section (torch-free: the harness reads it to validate a
scenario)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from baft.bubbles.planner import PlannerConfig
from baft.bubbles.profiler import ProfilerConfig
from baft.errors import BaftConfigError
from baft.priority import CHOICES, PRIORITIES
from baft.store.config import ReplicationConfig


@dataclass(kw_only=True, slots=True)
class BaftConfig:
    """``baft``'s own settings: the ``checkpoint.baft`` section."""

    shm_dir: str = ""
    """Directory of the shared-memory snapshot slots (default: under /dev/shm, derived from ``dir``)."""
    replicate_every: int = 1
    """Hand every this many versions to the store for replication (1: every one)."""
    writer: Literal["process", "thread", "dcp"] = "process"
    """How the persister writes the DCP checkpoint. ``process``: each rank's file straight from
    its sealed shared-memory slot, by a writer process of the rank's own (stdlib only, at the
    ``persist_nice`` priority: off the training process's interpreter lock; :mod:`baft.persist.writer`),
    and rank 0 writes DCP's metadata from what every rank wrote (one exchange; :mod:`baft.persist.dcpwrite`);
    on an fsspec ``dir`` as ``thread``. ``thread``: the same, written by the persister thread.
    ``dcp``: ``dcp.save`` of a private copy (for comparison). Stock ``dcp.load`` reads each."""
    writer_priority: str = "idle"
    """With ``writer: process``: the writer processes' CPU and I/O class: ``idle``
    (``SCHED_IDLE`` and the idle I/O class: they write while the ranks wait in their bubbles; nice 19 where
    the idle CPU class is refused) or ``normal`` (then ``persist_nice`` applies). Journaled
    (``background_priority``)."""
    persist_window_ms: float = 2.0
    """The persister thread runs each step of a persist (its Python shares the interpreter lock with
    training) only while the training thread waits in a pipeline window the profiler expects to last at least
    this many milliseconds, or 100 ms later at the latest (0: whenever it is ready). Without such windows (no
    pipeline) it never waits. Journaled per persist (``checkpoint_saved`` ``gated_seconds``)."""
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    """How the node stores replicate each version to peer nodes (needs nodes > 1): ``replicas``,
    ``placement``, ``domain_nodes``, ``rate``, ``yield_to_training``, ``max_slowdown``, ``priority``
    (:class:`~baft.store.config.ReplicationConfig`)."""
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    """Idle-window measurement and drift detection."""
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    """Chunking and packing into windows."""
    store: str = ""
    """Host:port of this node's store (set by the harness; empty: no store, no peers)."""
    node: int = 0
    """This node's index (set by the harness)."""

    def __post_init__(self) -> None:
        if isinstance(self.replicate_every, bool) or not isinstance(self.replicate_every, int) or self.replicate_every < 1:
            raise BaftConfigError("replicate_every", "an integer >= 1", self.replicate_every)
        if self.writer not in ("process", "thread", "dcp"):
            raise BaftConfigError("writer", "process, thread or dcp", self.writer)
        if self.writer_priority not in PRIORITIES:
            raise BaftConfigError("writer_priority", CHOICES, self.writer_priority)
        if (isinstance(self.persist_window_ms, bool) or not isinstance(self.persist_window_ms, (int, float))
                or not 0 <= self.persist_window_ms < math.inf):
            raise BaftConfigError("persist_window_ms", "a number of milliseconds >= 0 (0: no gate)", self.persist_window_ms)

    def bench_settings(self, persistent: bool) -> dict[str, Any]:
        """What ``baft bench`` records of this section beside a ``baft`` arm (``persistent``: an arm that
        persists)."""
        out: dict[str, Any] = {"copier": self.planner.copier}
        if persistent:
            out["writer_priority"] = self.writer_priority if self.writer == "process" else None
            out["persist_window_ms"] = self.persist_window_ms
            out["writer"] = {"process": "each rank's DCP file straight from its slot by a writer process",
                             "thread": "each rank's DCP file straight from its slot by the persister thread",
                             "dcp": "dcp.save of a copy"}[self.writer]
        return out
