"""Fault injectors. ``FAULTS`` maps each scenario ``faults:`` key to its config and injector."""
from __future__ import annotations

from .base import FaultConfig, InWorkerInjector, RunShape, WorkerContext
from .errors import FaultConfigError, InjectorError
from .process import KillConfig, KillInjector, NodeLossConfig, NodeLossInjector

FAULTS: dict[str, tuple[type[FaultConfig], type[InWorkerInjector]]] = {
    "kill": (KillConfig, KillInjector),
    "node_loss": (NodeLossConfig, NodeLossInjector),
}

__all__ = ["FAULTS", "FaultConfig", "FaultConfigError", "InWorkerInjector", "InjectorError", "RunShape", "WorkerContext"]
