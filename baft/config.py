"""The checkpoint configuration: the ``checkpoint:`` section of a scenario.

:class:`CheckpointConfig` holds what every strategy shares (the strategy, the persistent interval and
where the persistent tier lives) and a section per strategy with settings of its own: ``baft``
(:class:`BaftConfig`: its shared-memory slots, the bubble profiler and planner, replication to peer
nodes, its writer processes) and ``async_dcp`` (:class:`AsyncDcpConfig`). The keys these sections
replaced (``checkpoint.replicas``, ``checkpoint.persist_writer``, ...) still load, with a warning that
names the new path (:data:`RENAMED_KEYS`), for one release.

The strategies are those of :mod:`baft.strategies.registry`; each section's class lives in its strategy's
package (:class:`~baft.strategies.baft.config.BaftConfig`, :class:`~baft.strategies.async_dcp.config.AsyncDcpConfig`)
and is named here too, as the public face has named it.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import baft.strategies.registry as registry
from baft.errors import BaftConfigError, deprecated
from baft.persist.storage import check_url, is_url
from baft.store.config import ReplicationConfig
from baft.strategies.async_dcp.config import AsyncDcpConfig
from baft.strategies.baft.config import BaftConfig

__all__ = ["RENAMED_KEYS", "STRATEGIES", "AsyncDcpConfig", "BaftConfig", "CheckpointConfig", "StrategyName", "nest_renamed"]

StrategyName = Literal["none", "sync", "async-dcp", "checkfreq", "baft"]
"""The built-in strategies' names, for type checkers (``tests/unit/test_strategy_registry.py`` checks it against
:data:`baft.strategies.registry.BUILTIN`); ``CheckpointConfig.strategy`` takes any registered name."""


if TYPE_CHECKING:
    STRATEGIES: tuple[str, ...]
    """Every registered strategy's name (:func:`baft.strategies.registry.names`, read when it is read)."""
else:
    def __getattr__(name: str) -> tuple[str, ...]:
        """``STRATEGIES``: every registered strategy's name, as registered when it is read."""
        if name == "STRATEGIES":
            return registry.names()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The keys the strategies' sections replaced -> their paths now (one release, with a warning).
RENAMED_KEYS: dict[str, str] = {
    "shm_dir": "baft.shm_dir", "replicate_every": "baft.replicate_every", "persist_writer": "baft.writer",
    "writer_priority": "baft.writer_priority", "persist_window_ms": "baft.persist_window_ms",
    "store": "baft.store", "node": "baft.node", "profiler": "baft.profiler", "planner": "baft.planner",
    "replicas": "baft.replication.replicas", "placement": "baft.replication.placement",
    "domain_nodes": "baft.replication.domain_nodes", "replication_rate": "baft.replication.rate",
    "replication_yield": "baft.replication.yield_to_training",
    "replication_max_slowdown": "baft.replication.max_slowdown", "store_priority": "baft.replication.priority",
    "dcp_async": "async_dcp.mode", "dcp_stager": "async_dcp.stager",
}


def nest_renamed(data: Mapping[str, Any], where: str = "checkpoint", source: str = "") -> dict[str, Any]:
    """``data`` (a ``checkpoint:`` mapping) with each key of :data:`RENAMED_KEYS` moved to its path now, in
    nested mappings, after a warning that names both (``where``: the section's path; ``source``: the file it
    came from, for the warning). A key given at both paths is an error: which one was meant?"""
    out = {k: v for k, v in data.items() if k not in RENAMED_KEYS}
    for old in (k for k in data if k in RENAMED_KEYS):
        new = RENAMED_KEYS[old]
        deprecated(f"{source + ': ' if source else ''}{where}.{old}", f"{where}.{new}", stacklevel=4)
        *parents, leaf = new.split(".")
        node = out
        for i, key in enumerate(parents):
            child = node.get(key)
            if child is not None and not isinstance(child, Mapping):
                raise BaftConfigError(".".join(parents[:i + 1]), f"a mapping (it also receives {old})", child)
            node[key] = child = dict(child or {})  # a copy: the caller's mappings stay as given
            node = child
        if leaf in node:
            raise BaftConfigError(new, f"one of {old} (deprecated) and {new}, not both", data[old])
        node[leaf] = data[old]
    return out


def _with(value: Any, cls: type, changes: Mapping[str, Any]) -> Any:
    """``value`` (an instance of dataclass ``cls``, or None: its defaults) with ``changes`` (nested mappings
    for nested dataclass fields) applied."""
    base = value if value is not None else cls()
    defaults = cls()
    updates = {}
    for key, v in changes.items():
        if key not in {f.name for f in dataclasses.fields(cls)}:
            raise BaftConfigError(key, "a field of " + cls.__name__, v)
        inner = getattr(base, key)
        if isinstance(v, Mapping) and dataclasses.is_dataclass(inner):
            v = _with(inner, type(inner), v)
        elif inner != getattr(defaults, key) and inner != v:  # the section given sets it too, otherwise
            raise BaftConfigError(key, f"one value: the deprecated key and {cls.__name__}({key}=...) differ", v)
        updates[key] = v
    return dataclasses.replace(base, **updates)


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """How and where a job checkpoints."""

    strategy: str = "sync"
    """One of :data:`STRATEGIES` (:mod:`baft.strategies.registry`; a strategy of one's own registers there). ``none``: never. ``sync``: blocking ``torch.save`` of every rank's shard.
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
    baft: BaftConfig = field(default_factory=BaftConfig)
    """``baft``'s own settings (read by that strategy only): its slots, replication, profiler, planner, writers."""
    async_dcp: AsyncDcpConfig = field(default_factory=AsyncDcpConfig)
    """``async-dcp``'s own settings (read by that strategy only): where DCP writes, how it stages."""

    def __post_init__(self) -> None:
        registry.get(self.strategy)  # a registered strategy, or BaftConfigError at ``strategy``
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
        if not isinstance(self.dir, str) or not self.dir:
            raise BaftConfigError("dir", "a directory or an fsspec URL", self.dir)
        if is_url(self.dir):
            check_url(self.dir)

    @property
    def replication(self) -> ReplicationConfig:
        """``baft``: how the node stores replicate (``baft.replication``)."""
        return self.baft.replication

    def with_baft(self, **changes: Any) -> CheckpointConfig:
        """This config with ``changes`` to its ``baft`` section (``cfg.with_baft(shm_dir=...)``)."""
        return dataclasses.replace(self, baft=dataclasses.replace(self.baft, **changes))

    @staticmethod
    def nest_renamed(data: Mapping[str, Any], where: str, source: str) -> dict[str, Any]:
        """How a loader of the ``checkpoint:`` section takes the keys the strategies' sections replaced
        (:func:`nest_renamed`)."""
        return nest_renamed(data, where, source)

    if not TYPE_CHECKING:
        def __getattr__(self, name: str) -> Any:
            """A key the strategies' sections replaced, read where it lives now (with a warning)."""
            new = RENAMED_KEYS.get(name)
            if new is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            deprecated(f"CheckpointConfig.{name}", f"CheckpointConfig.{new}")
            value: Any = self
            for part in new.split("."):
                value = getattr(value, part)
            return value


_generated_init = CheckpointConfig.__init__


def _sections() -> dict[str, type]:
    """Each strategy's own section of :class:`CheckpointConfig` -> its config class (from the registry)."""
    fields = {f.name for f in dataclasses.fields(CheckpointConfig)}
    out: dict[str, type] = {}
    for e in registry.entries():
        cls = e.config_class()
        if e.section in fields and cls is not None:
            out[e.section] = cls
    return out


@functools.wraps(_generated_init)
def _init(self: CheckpointConfig, **kwargs: Any) -> None:
    """The dataclass's ``__init__``, taking the keys the strategies' sections replaced too (with a warning):
    ``CheckpointConfig(strategy="baft", replicas=1)`` is ``CheckpointConfig(strategy="baft",
    baft=BaftConfig(replication=ReplicationConfig(replicas=1)))``."""
    if any(k in RENAMED_KEYS for k in kwargs):
        own = _sections()
        sections = {s: kwargs.pop(s) for s in own if dataclasses.is_dataclass(kwargs.get(s))}
        nested = nest_renamed(kwargs, "CheckpointConfig")
        for section, cls in own.items():
            changes = nested.get(section)
            if isinstance(changes, Mapping):  # old keys into the section given, or into its defaults
                nested[section] = _with(sections.get(section), cls, changes)
            elif section in sections:
                nested[section] = sections[section]
        kwargs = nested
    _generated_init(self, **kwargs)


CheckpointConfig.__init__ = _init  # type: ignore[method-assign]

#: Deprecated: the checkpoint section's old replication keys -> the fields of
#: :class:`~baft.store.config.ReplicationConfig` (they are ``baft.replication.<field>`` now).
REPLICATION_KEYS = {k: v.rsplit(".", 1)[1] for k, v in RENAMED_KEYS.items() if v.startswith("baft.replication.")}
