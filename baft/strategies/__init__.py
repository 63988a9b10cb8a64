"""Checkpointing strategies, selected by ``CheckpointConfig.strategy`` and compared by the same harness."""
from __future__ import annotations

from ..traits import CHECKPOINT_PHASES, STEP_CHECKPOINT_PHASES
from .base import Strategy
from .baft import BaftStrategy
from .checkfreq import CheckFreqStrategy
from .dcp import AsyncDCPStrategy
from .sync import SyncStrategy

REGISTRY: dict[str, type[Strategy]] = {
    "none": Strategy,
    "sync": SyncStrategy,
    "async-dcp": AsyncDCPStrategy,
    "checkfreq": CheckFreqStrategy,
    "baft": BaftStrategy,
}

__all__ = ["CHECKPOINT_PHASES", "REGISTRY", "STEP_CHECKPOINT_PHASES", "AsyncDCPStrategy", "BaftStrategy",
           "CheckFreqStrategy", "Strategy", "SyncStrategy"]
