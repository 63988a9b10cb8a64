"""The checkpoint configuration: the ``checkpoint:`` section of a scenario."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from baft.bubbles.planner import PlannerConfig
from baft.bubbles.profiler import ProfilerConfig
from baft.errors import BaftConfigError
from baft.persist.storage import check_url, is_url
from baft.priority import PRIORITIES
from baft.store.config import ReplicationConfig

StrategyName = Literal["none", "sync", "async-dcp", "checkfreq", "baft"]
STRATEGIES: tuple[str, ...] = ("none", "sync", "async-dcp", "checkfreq", "baft")
#: The section's replication keys -> the fields of the stores' :class:`~baft.store.config.ReplicationConfig`.
REPLICATION_KEYS = {"replicas": "replicas", "replication_rate": "rate", "replication_yield": "yield_to_training",
                    "placement": "placement", "domain_nodes": "domain_nodes",
                    "replication_max_slowdown": "max_slowdown", "store_priority": "priority"}
_REPLICATION = ReplicationConfig()  # whose defaults the section's replication keys take


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """How and where a job checkpoints."""

    strategy: StrategyName = "sync"
    """``none``: never. ``sync``: blocking ``torch.save`` of every rank's shard.
    ``async-dcp``: ``torch.distributed.checkpoint.async_save``. ``checkfreq``: copy the
    state to memory at the boundary, persist it in the background while training goes on.
    ``baft``: a snapshot of every iteration in shared memory, copied inside the pipeline
    bubbles; persisted in DCP format in the background every ``every`` steps."""
    every: int = 1
    """Write a persistent checkpoint after every this many completed steps (with ``mtbf_hours``: at first)."""
    mtbf_hours: float | None = None
    """The job's mean time between failures. Set, the persistent interval adapts: at each persist
    boundary the ranks agree on the measured cost of a persist and the iteration time, and the interval
    becomes Daly's optimum for them in whole iterations, within ``every_min``..``every_max``
    (:mod:`baft.persist.interval`; an ``interval_changed`` event says when and why). Unset: every ``every``."""
    every_min: int = 1
    """With ``mtbf_hours``: the shortest interval it may adapt to, in steps."""
    every_max: int = 10_000
    """With ``mtbf_hours``: the longest interval it may adapt to, in steps (the most work a failure can cost)."""
    dir: str = "checkpoints"
    """Where the persistent tier lives: a local directory (created if missing; files
    fsynced and renamed into place) or an fsspec URL such as ``s3://bucket/prefix``,
    ``file:///abs/path`` or ``memory://name`` (needs ``pip install 'baft-harness[fsspec]'``
    and the protocol's backend, e.g. s3fs; each object written whole, the manifest and
    ``latest`` only after every data file is stored and checksummed)."""
    keep: int = 3
    """How many committed persistent checkpoints to keep."""
    persist_nice: int = 0
    """``baft``, ``checkfreq``: how much lower than training's the CPU priority of the thread that persists
    in the background is (a nice increment, 0-19): with a higher one it runs mostly on CPU that training
    leaves idle, and a persist takes longer."""
    persist_writer: Literal["process", "thread", "dcp"] = "process"
    """``baft``: how the persister writes the DCP checkpoint. ``process``: each rank's file straight from
    its sealed shared-memory slot, by a writer process of the rank's own (stdlib only, at the
    ``persist_nice`` priority: off the training process's interpreter lock; :mod:`baft.persist.writer`),
    and rank 0 writes DCP's metadata from what every rank wrote (one exchange; :mod:`baft.persist.dcpwrite`);
    on an fsspec ``dir`` as ``thread``. ``thread``: the same, written by the persister thread.
    ``dcp``: ``dcp.save`` of a private copy (for comparison). Stock ``dcp.load`` reads each."""
    dcp_async: Literal["thread", "process"] = "thread"
    """``async-dcp``: where DCP writes in the background: a thread of the training process, or a
    checkpoint process of DCP's own per rank (``AsyncCheckpointerType.PROCESS``; it is spawned, so the
    training script's entry point must be guarded by ``if __name__ == "__main__"``)."""
    dcp_stager: bool = True
    """``async-dcp``: stage through DCP's ``DefaultStager`` (buffers cached across saves, the copy in a
    staging thread; shared memory in process mode, pinned memory where CUDA is present) instead of
    ``async_save``'s default copy into fresh memory each time."""
    shm_dir: str = ""
    """``baft``: directory of the shared-memory snapshot slots (default: under /dev/shm, derived from ``dir``)."""
    replicas: int = _REPLICATION.replicas
    """``baft``: peer nodes that keep a copy of each snapshot (needs nodes > 1)."""
    placement: str = _REPLICATION.placement
    """``baft``: which peers: ``ring`` (the next ``replicas`` nodes) or ``group`` (groups of
    ``replicas + 1`` nodes replicating inside the group, Gemini's placement: fewer losses of k
    nodes at once lose a state; :mod:`baft.store.placement`)."""
    domain_nodes: int = _REPLICATION.domain_nodes
    """``baft``: nodes per failure domain (rack), consecutive node indices sharing one; replicas then go
    to other domains first, so a rack's loss leaves its nodes' copies in peer memory (0: no domains)."""
    replicate_every: int = 1
    """``baft``: hand every this many versions to the store for replication (1: every one)."""
    replication_rate: float = _REPLICATION.rate
    """``baft``: replication rate limit per node in bytes/s (0: none). When the link cannot
    carry a replica per iteration, older versions are skipped and the skips journaled; when it
    cannot deliver a replica before the persistent tier saves a newer version, replication
    stops (journaled ``replication_degraded``) and is probed again after 30 s, then less often."""
    replication_yield: bool = _REPLICATION.yield_to_training
    """``baft``: the store sends replica data only while no rank of its node has pipeline
    traffic in flight (a whole replica, or each 64 KiB piece on a slow link, waits at most 20 ms)."""
    replication_max_slowdown: float = _REPLICATION.max_slowdown
    """``baft``: the share by which replication may slow training (0.25: 25%; 0, the default: no limit),
    measured by each node's store (versions timed while it sends and while it does not); beyond it,
    once a persistent checkpoint exists, the store stops replicating, journals why
    (``replication_degraded``) and probes again later."""
    store_priority: str = _REPLICATION.priority
    """``baft``: the node stores' CPU and I/O class: ``idle`` (they run on what the ranks leave idle) or
    ``normal``; journaled by each store (``store_start``)."""
    writer_priority: str = "idle"
    """``baft`` with ``persist_writer: process``: the writer processes' CPU and I/O class: ``idle``
    (``SCHED_IDLE`` and the idle I/O class: they write while the ranks wait in their bubbles; nice 19 where
    the idle CPU class is refused) or ``normal`` (then ``persist_nice`` applies). Journaled
    (``background_priority``)."""
    persist_window_ms: float = 2.0
    """``baft``: the persister thread runs each step of a persist (its Python shares the interpreter lock with
    training) only while the training thread waits in a pipeline window the profiler expects to last at least
    this many milliseconds, or 100 ms later at the latest (0: whenever it is ready). Without such windows (no
    pipeline) it never waits. Journaled per persist (``checkpoint_saved`` ``gated_seconds``)."""
    store: str = ""
    """``baft``: host:port of this node's store (set by the harness; empty: no store, no peers)."""
    node: int = 0
    """``baft``: this node's index (set by the harness)."""
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    """``baft``: idle-window measurement and drift detection."""
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    """``baft``: chunking and packing into windows."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise BaftConfigError("strategy", "one of " + ", ".join(STRATEGIES), self.strategy)
        if not isinstance(self.every, int) or self.every < 1:
            raise BaftConfigError("every", "an integer >= 1", self.every)
        if self.mtbf_hours is not None and (isinstance(self.mtbf_hours, bool) or not isinstance(self.mtbf_hours, (int, float))
                                            or not 0 < self.mtbf_hours < math.inf):
            raise BaftConfigError("mtbf_hours", "a number of hours > 0, or unset (a fixed interval)", self.mtbf_hours)
        for key in ("every_min", "every_max"):
            if isinstance(getattr(self, key), bool) or not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise BaftConfigError(key, "an integer >= 1", getattr(self, key))
        if self.every_max < self.every_min:
            raise BaftConfigError("every_max", f"an integer >= every_min ({self.every_min})", self.every_max)
        if self.mtbf_hours is not None and not self.every_min <= self.every <= self.every_max:
            raise BaftConfigError("every", f"an integer from every_min to every_max ({self.every_min}-{self.every_max}) "
                                  "when the interval adapts (mtbf_hours)", self.every)
        if not isinstance(self.keep, int) or self.keep < 1:
            raise BaftConfigError("keep", "an integer >= 1", self.keep)
        if not isinstance(self.persist_nice, int) or not 0 <= self.persist_nice <= 19:
            raise BaftConfigError("persist_nice", "an integer from 0 to 19", self.persist_nice)
        if (isinstance(self.persist_window_ms, bool) or not isinstance(self.persist_window_ms, (int, float))
                or not 0 <= self.persist_window_ms < math.inf):
            raise BaftConfigError("persist_window_ms", "a number of milliseconds >= 0 (0: no gate)", self.persist_window_ms)
        if self.writer_priority not in PRIORITIES:
            raise BaftConfigError("writer_priority", " or ".join(PRIORITIES), self.writer_priority)
        if self.persist_writer not in ("process", "thread", "dcp"):
            raise BaftConfigError("persist_writer", "process, thread or dcp", self.persist_writer)
        if self.dcp_async not in ("thread", "process"):
            raise BaftConfigError("dcp_async", "thread or process", self.dcp_async)
        if not isinstance(self.dcp_stager, bool):
            raise BaftConfigError("dcp_stager", "true or false", self.dcp_stager)
        if not isinstance(self.dir, str) or not self.dir:
            raise BaftConfigError("dir", "a directory or an fsspec URL", self.dir)
        if is_url(self.dir):
            check_url(self.dir)
        try:
            self.replication  # validated as the stores' own config
        except BaftConfigError as e:  # named by the section's key
            raise BaftConfigError(next(k for k, v in REPLICATION_KEYS.items() if v == e.field), e.expected, e.found) from None
        if self.replicate_every < 1:
            raise BaftConfigError("replicate_every", "an integer >= 1", self.replicate_every)

    @property
    def replication(self) -> ReplicationConfig:
        """``baft``: how the node stores replicate (``replicas``, ``placement``, ``domain_nodes``, ``replication_rate``,
        ``replication_yield``, ``replication_max_slowdown``, ``store_priority``)."""
        return ReplicationConfig(**{field: getattr(self, key) for key, field in REPLICATION_KEYS.items()})
