"""BAFT: bubble-aware fault-tolerant checkpointing for pipeline-parallel training.

Public API: :class:`Checkpointer` and :class:`CheckpointConfig` (save/restore),
:class:`TrainState` (what a checkpoint holds), :mod:`baft.events` (hooks).

The names are resolved on first use (PEP 562), so a process that needs only a torch-free part
(the node store ``python -m baft.store``, the harness reading a config) does not import torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import events
    from .checkpointer import Checkpointer
    from .config import STRATEGIES, CheckpointConfig
    from .components import COMPONENTS
    from .errors import BaftConfigError, BaftError, CheckpointCorrupt
    from .state import TrainState, digest_components

#: Public name -> the submodule that defines it.
_EXPORTS = {
    "events": ".events",
    "Checkpointer": ".checkpointer",
    "CheckpointConfig": ".config",
    "STRATEGIES": ".config",
    "BaftConfigError": ".errors",
    "BaftError": ".errors",
    "CheckpointCorrupt": ".errors",
    "COMPONENTS": ".components",
    "TrainState": ".state",
    "digest_components": ".state",
}

__all__ = ["COMPONENTS", "STRATEGIES", "BaftConfigError", "BaftError", "CheckpointConfig", "CheckpointCorrupt",
           "Checkpointer", "TrainState", "digest_components", "events"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'baft' has no attribute {name!r}")
    mod = importlib.import_module(module, __name__)
    value = mod if name == "events" else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
