"""BAFT: bubble-aware fault-tolerant checkpointing for pipeline-parallel training.

Public API: :class:`Checkpointer` and :class:`CheckpointConfig` (save/restore),
:class:`TrainState` (what a checkpoint holds), :mod:`baft.events` (hooks).
"""
from . import events
from .checkpointer import Checkpointer
from .config import STRATEGIES, CheckpointConfig
from .errors import BaftConfigError, BaftError, CheckpointCorrupt
from .state import COMPONENTS, TrainState, digest_components

__all__ = [
    "COMPONENTS",
    "STRATEGIES",
    "BaftConfigError",
    "BaftError",
    "CheckpointConfig",
    "CheckpointCorrupt",
    "Checkpointer",
    "TrainState",
    "digest_components",
    "events",
]
