"""Checkpointing strategies, selected by ``CheckpointConfig.strategy`` and compared by the same harness."""
from __future__ import annotations

from ..events import PHASES
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


def _announced(attribute: str) -> tuple[str, ...]:
    """The phases some strategy lists in ``attribute``, in :data:`baft.events.PHASES` order."""
    return tuple(p for p in PHASES if any(p in getattr(s, attribute) for s in REGISTRY.values()))


#: Every checkpoint phase some strategy announces (``Strategy.phases``).
CHECKPOINT_PHASES = _announced("phases")
#: Those some strategy announces at its steps (``Strategy.step_phases``).
STEP_CHECKPOINT_PHASES = _announced("step_phases")

__all__ = ["CHECKPOINT_PHASES", "REGISTRY", "STEP_CHECKPOINT_PHASES", "AsyncDCPStrategy", "BaftStrategy",
           "CheckFreqStrategy", "Strategy", "SyncStrategy"]
