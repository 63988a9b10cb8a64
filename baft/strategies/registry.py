"""The checkpointing strategies by name, known without importing them (torch-free).

Each strategy is one :class:`Entry`: its name (``CheckpointConfig.strategy``), the class that runs it and the
class of its own config section as lazy ``"module:Class"`` paths, its :class:`~baft.traits.Traits` (what it
announces and needs), and what the harness derives from it (its bench arms, its projection model, its line in
the docs). The config's validation and :data:`baft.STRATEGIES`, the scenario's checks, the fault phases, the
CLI's choices, ``baft bench``'s arms, ``baft project``'s strategies and the strategy table of
``docs/strategies.md`` all read this table: adding a strategy is one package and one :func:`register` call.

A strategy of one's own registers without editing baft: a module that calls :func:`register`, named in the
environment variable :data:`ENV` (``BAFT_STRATEGIES=mypkg.ckpt``, comma-separated; it reaches torchrun's
workers with the rest of the environment) or by an entry point of the group :data:`GROUP` in its
distribution's metadata. Both are imported at the first look-up (:func:`load_plugins`).
"""
from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from baft.errors import BaftConfigError
from baft.events import PHASES
from baft.traits import Traits

ENV = "BAFT_STRATEGIES"
"""Modules to import for their :func:`register` calls (comma-separated), in every process that looks a name up."""
GROUP = "baft.strategies"
"""The entry-point group of installed strategies: each entry point names a module (imported) or a callable (called)."""

#: The projection models of ``analysis.projection`` (``MODELS``; baft cannot import analysis, a test checks them).
PROJECTIONS = ("none", "blocking", "background", "memory", "bubbles")


@dataclass(frozen=True, slots=True)
class Entry:
    """One strategy, as the library, the harness and the docs know it."""

    name: str
    """Its ``CheckpointConfig.strategy``."""
    strategy: str
    """``"module:Class"`` of its :class:`~baft.strategies.base.Strategy` subclass (imported on first use)."""
    traits: Traits = field(default_factory=Traits)
    """What it announces and needs (read by the harness without importing it)."""
    config: str | None = None
    """``"module:Class"`` of its own section's config, or None (it reads only the shared fields)."""
    section: str | None = None
    """The ``CheckpointConfig`` field that holds that section (``baft``, ``async_dcp``)."""
    summary: str = ""
    """What it does each checkpoint, in a line (the docs' strategy table, ``--help``)."""
    background_persist: bool = False
    """Whether a thread of its own persists in the background, at ``persist_nice`` (the bench records it)."""
    snapshot_arm: str | None = None
    """``baft bench``'s snapshot tier: the suffix of its arm (``NAME:SUFFIX``), None for no arm."""
    snapshot_step: str | None = None
    """With :attr:`snapshot_arm`: ``"module:function"`` of ``f(state) -> step`` that the bench runs after each
    iteration beside a ``none`` checkpointer; None: the arm is the strategy itself, never persisting."""
    snapshot_note: str = ""
    """With :attr:`snapshot_arm`: what its snapshot step does (the arm's settings in ``bench.json``)."""
    projection: str = "blocking"
    """How ``baft project`` models it (one of :data:`PROJECTIONS`): ``none``; ``blocking`` (the training thread
    writes the persistent tier); ``background`` (a copy to host memory on the training thread, persisted in the
    background); ``memory`` (that copy also sent to peers' memory); ``bubbles`` (as ``memory``, the copy inside
    the pipeline bubbles)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "@" in self.name or ":" in self.name:
            raise BaftConfigError("name", "a strategy name without '@' or ':' (the bench's arms use them)", self.name)
        for key in ("strategy", "config", "snapshot_step"):
            value = getattr(self, key)
            if (value is not None or key == "strategy") and (not isinstance(value, str) or value.count(":") != 1):
                raise BaftConfigError(key, "a 'module:attribute' path", value)
        if (self.config is None) != (self.section is None):
            raise BaftConfigError("section", "a section with a config class, neither without the other", self.section)
        if not set(self.traits.phases) <= set(PHASES) or not set(self.traits.step_phases) <= set(self.traits.phases):
            raise BaftConfigError("traits", f"phases among {', '.join(PHASES)}, step_phases among them", self.traits)
        if self.projection not in PROJECTIONS:
            raise BaftConfigError("projection", "one of " + ", ".join(PROJECTIONS), self.projection)
        if self.snapshot_step is not None and self.snapshot_arm is None:
            raise BaftConfigError("snapshot_step", "a snapshot_arm too (the arm it runs in)", self.snapshot_step)

    def load(self) -> Any:
        """The strategy's class (imports it)."""
        return _resolve(self.strategy)

    def config_class(self) -> Any:
        """The class of its own section's config (imports it), or None."""
        return _resolve(self.config) if self.config is not None else None

    def snapshot_factory(self) -> Any:
        """``f(state) -> step`` of :attr:`snapshot_step` (imports it), or None."""
        return _resolve(self.snapshot_step) if self.snapshot_step is not None else None

    @property
    def snapshot_arm_name(self) -> str | None:
        """Its arm in ``baft bench``'s snapshot tier (``baft:snapshot``), or None."""
        return f"{self.name}:{self.snapshot_arm}" if self.snapshot_arm is not None else None


def _resolve(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


_WRITES = ("persist", "restore", "restore_load")

_ENTRIES: dict[str, Entry] = {}
_loaded = False


def register(entry: Entry) -> Entry:
    """Add ``entry`` (a strategy by its name). Registering the same entry again does nothing (a module imported
    twice); another entry under a name taken is an error."""
    if not isinstance(entry, Entry):
        raise BaftConfigError("entry", "a baft.strategies.registry.Entry", entry)
    known = _ENTRIES.get(entry.name)
    if known is not None and known != entry:
        raise BaftConfigError("name", f"a name not taken ({entry.name} is {known.strategy})", entry.name)
    _ENTRIES[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove a strategy registered by :func:`register` (tests; the built-in ones stay)."""
    if any(e.name == name for e in BUILTIN):
        raise BaftConfigError("name", "a strategy registered by register(), not a built-in one", name)
    _ENTRIES.pop(name, None)


def load_plugins() -> None:
    """Import the modules :data:`ENV` names and load the entry points of :data:`GROUP`, once per process."""
    global _loaded
    if _loaded:
        return
    _loaded = True  # first: a plugin's register() looks names up too
    for module in filter(None, (m.strip() for m in os.environ.get(ENV, "").split(","))):
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise BaftConfigError(ENV, "modules that import (each registers its strategies)", f"{module} ({e})") from e
    from importlib.metadata import entry_points

    for point in entry_points(group=GROUP):
        loaded = point.load()
        if callable(loaded):
            loaded()


def entries() -> tuple[Entry, ...]:
    """Every strategy, the built-in ones first, in the order registered."""
    load_plugins()
    return tuple(_ENTRIES.values())


def names() -> tuple[str, ...]:
    """Every strategy's name (:data:`baft.STRATEGIES`)."""
    return tuple(e.name for e in entries())


def get(name: str, *, plugins: bool = True) -> Entry:
    """The strategy ``name``; :class:`~baft.errors.BaftConfigError` (at field ``strategy``) for no such one.
    ``plugins=False``: among those registered so far (a strategy's class, defined after its entry, reads its
    traits so while the plugins may still be importing)."""
    if plugins:
        load_plugins()
    entry = _ENTRIES.get(name) if isinstance(name, str) else None
    if entry is None:
        raise BaftConfigError("strategy", "one of " + ", ".join(_ENTRIES) + f" (or one registered: see {ENV})", name)
    return entry


def traits(name: str, *, plugins: bool = True) -> Traits:
    """What the strategy ``name`` announces and needs."""
    return get(name, plugins=plugins).traits


class _Traits(Mapping[str, Traits]):
    """:data:`TRAITS`: each strategy's traits by name, as registered now."""

    def __getitem__(self, name: str) -> Traits:
        load_plugins()
        return _ENTRIES[name].traits

    def __iter__(self) -> Iterator[str]:
        return iter(names())

    def __len__(self) -> int:
        return len(entries())


#: Each strategy's :class:`~baft.traits.Traits` by name (a live view of the registry).
TRAITS: Mapping[str, Traits] = _Traits()

BUILTIN: tuple[Entry, ...] = (
    Entry(name="none", strategy="baft.strategies.base:Strategy", projection="none", summary="nothing"),
    Entry(name="sync", strategy="baft.strategies.sync.strategy:SyncStrategy", traits=Traits(phases=_WRITES),
          summary="every rank blocks in `torch.save` of its shard"),
    Entry(name="async-dcp", strategy="baft.strategies.async_dcp.strategy:AsyncDcpStrategy",
          traits=Traits(phases=_WRITES, elastic=True),  # DCP reshards on load
          config="baft.strategies.async_dcp.config:AsyncDcpConfig", section="async_dcp", projection="background",
          summary="`torch.distributed.checkpoint.async_save`", snapshot_arm="staging",
          snapshot_step="baft.strategies.async_dcp.strategy:staging_step",
          snapshot_note="DefaultStager, synchronous, cached buffers"),
    Entry(name="checkfreq", strategy="baft.strategies.checkfreq.strategy:CheckFreqStrategy",
          traits=Traits(phases=_WRITES), projection="background", background_persist=True,
          summary="a copy into buffers allocated once, persisted by a background thread", snapshot_arm="snapshot",
          snapshot_step="baft.strategies.checkfreq.strategy:snapshot_step",
          snapshot_note="copy into buffers allocated once, at the boundary"),
    # the snapshots record their replica count; a resized restore re-cuts them
    Entry(name="baft", strategy="baft.strategies.baft.strategy:BaftStrategy",
          traits=Traits(phases=("snapshot", "replicate", *_WRITES, "restore_locate", "restore_pull"),
                        step_phases=("snapshot",), elastic=True, node_stores=True),
          config="baft.strategies.baft.config:BaftConfig", section="baft", projection="bubbles",
          background_persist=True, summary="a snapshot every iteration in shared memory, inside the pipeline bubbles",
          snapshot_arm="snapshot", snapshot_note="every iteration, in the bubbles"),
)
"""The strategies baft brings."""
for _entry in BUILTIN:
    register(_entry)


def _announced(attribute: str) -> tuple[str, ...]:
    """The phases some built-in strategy lists in ``attribute``, in :data:`baft.events.PHASES` order."""
    return tuple(p for p in PHASES if any(p in getattr(e.traits, attribute) for e in BUILTIN))


#: Every checkpoint phase a strategy may announce (:attr:`Traits.phases`; the built-in ones announce each).
CHECKPOINT_PHASES = _announced("phases")
#: Those a strategy may announce at its steps (:attr:`Traits.step_phases`).
STEP_CHECKPOINT_PHASES = _announced("step_phases")
