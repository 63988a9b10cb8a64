"""BAFT: bubble-aware fault-tolerant checkpointing for pipeline-parallel training.

Public API: :class:`Checkpointer` and :class:`CheckpointConfig` (save/restore; its strategies' sections
:class:`BaftConfig` with :class:`ReplicationConfig`, and :class:`AsyncDcpConfig`),
:class:`TrainState` (what a checkpoint holds), :mod:`baft.events` (hooks).

The rooms: :mod:`baft.strategies` (each strategy, baft's snapshotter, the shared restores),
:mod:`baft.bubbles` (profiler, planner, copier), :mod:`baft.snapshot` (the shared-memory slots),
:mod:`baft.store` (the node store, torch-free), :mod:`baft.persist` (the persistent tier),
:mod:`baft.state` (what a checkpoint holds), :mod:`baft.mesh` (where a rank stands).

The names are resolved on first use (PEP 562), so a process that needs only a torch-free part
(the node store ``python -m baft.store``, the harness reading a config) does not import torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from baft._lazy import exports

if TYPE_CHECKING:
    from baft import events
    from baft.checkpointer import Checkpointer
    from baft.components import COMPONENTS
    from baft.config import STRATEGIES, AsyncDcpConfig, BaftConfig, CheckpointConfig
    from baft.errors import BaftConfigError, BaftError, CheckpointCorrupt
    from baft.state.fingerprint import digest_components
    from baft.state.train import TrainState
    from baft.store.config import ReplicationConfig

#: Public name -> the submodule that defines it.
_EXPORTS = {
    "events": "baft.events",
    "Checkpointer": "baft.checkpointer",
    "CheckpointConfig": "baft.config",
    "BaftConfig": "baft.config",
    "AsyncDcpConfig": "baft.config",
    "ReplicationConfig": "baft.store.config",
    "STRATEGIES": "baft.config",
    "BaftConfigError": "baft.errors",
    "BaftError": "baft.errors",
    "CheckpointCorrupt": "baft.errors",
    "COMPONENTS": "baft.components",
    "TrainState": "baft.state.train",
    "digest_components": "baft.state.fingerprint",
}

__all__ = ["COMPONENTS", "STRATEGIES", "AsyncDcpConfig", "BaftConfig", "BaftConfigError", "BaftError", "CheckpointConfig",
           "CheckpointCorrupt", "Checkpointer", "ReplicationConfig", "TrainState", "digest_components", "events"]

__getattr__, __dir__ = exports(__name__, _EXPORTS)
