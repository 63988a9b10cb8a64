"""Checkpointing strategies, selected by ``CheckpointConfig.strategy`` and compared by the same harness."""
from __future__ import annotations

from baft.strategies.baft import BaftStrategy
from baft.strategies.base import Strategy
from baft.strategies.checkfreq import CheckFreqStrategy
from baft.strategies.dcp import AsyncDCPStrategy
from baft.strategies.sync import SyncStrategy
from baft.traits import CHECKPOINT_PHASES, STEP_CHECKPOINT_PHASES

REGISTRY: dict[str, type[Strategy]] = {
    "none": Strategy,
    "sync": SyncStrategy,
    "async-dcp": AsyncDCPStrategy,
    "checkfreq": CheckFreqStrategy,
    "baft": BaftStrategy,
}

__all__ = ["CHECKPOINT_PHASES", "REGISTRY", "STEP_CHECKPOINT_PHASES", "AsyncDCPStrategy", "BaftStrategy",
           "CheckFreqStrategy", "Strategy", "SyncStrategy"]
