"""Checkpointing strategies, selected by ``CheckpointConfig.strategy`` and compared by the same harness.

One package per strategy holds the strategy, its config and its helpers (:mod:`baft.strategies.sync`,
:mod:`~baft.strategies.async_dcp`, :mod:`~baft.strategies.checkfreq`, :mod:`~baft.strategies.baft`); the
:mod:`~baft.strategies.registry` (torch-free) names each one. The names below resolve on first use, so importing
the registry or a strategy's config imports no strategy (and no torch).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from baft._lazy import exports

if TYPE_CHECKING:
    from baft.strategies.async_dcp.strategy import AsyncDcpStrategy
    from baft.strategies.baft.strategy import BaftStrategy
    from baft.strategies.base import Strategy
    from baft.strategies.checkfreq.strategy import CheckFreqStrategy
    from baft.strategies.sync.strategy import SyncStrategy

_EXPORTS = {
    "Strategy": "baft.strategies.base",
    "SyncStrategy": "baft.strategies.sync.strategy",
    "AsyncDcpStrategy": "baft.strategies.async_dcp.strategy",
    "CheckFreqStrategy": "baft.strategies.checkfreq.strategy",
    "BaftStrategy": "baft.strategies.baft.strategy",
    "CHECKPOINT_PHASES": "baft.strategies.registry",
    "STEP_CHECKPOINT_PHASES": "baft.strategies.registry",
}

__all__ = ["CHECKPOINT_PHASES", "STEP_CHECKPOINT_PHASES", "AsyncDcpStrategy", "BaftStrategy", "CheckFreqStrategy",
           "Strategy", "SyncStrategy"]

__getattr__, __dir__ = exports(__name__, _EXPORTS)
