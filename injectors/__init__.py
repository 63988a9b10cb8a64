"""Fault injectors. ``FAULTS`` maps each scenario ``faults:`` key to its config and injector."""
from __future__ import annotations

from typing import Any

from .base import FaultConfig, RunShape, WorkerContext
from .clock import ClockSkewConfig, ClockSkewInjector
from .compute import StragglerConfig, StragglerInjector
from .data import JitterConfig, JitterInjector
from .errors import FaultConfigError, HostUnsupported, InjectorError
from .join import NodeJoinConfig, NodeJoinInjector
from .link import DelayConfig, LinkInjector, PartitionConfig, ThrottleConfig
from .preempt import PreemptConfig, PreemptInjector
from .process import (
                      CrashConfig,
                      CrashInjector,
                      HangConfig,
                      HangInjector,
                      KillConfig,
                      KillInjector,
                      NodeLossConfig,
                      NodeLossInjector,
)
from .storage import (
                      CorruptConfig,
                      CorruptInjector,
                      DiskFullConfig,
                      DiskFullInjector,
                      SlowStorageConfig,
                      SlowStorageInjector,
)
from .trigger import PointFault, WindowFault
from .worker import InWorkerInjector, WindowInjector, WorkerInjector

FAULTS: dict[str, tuple[type[FaultConfig], type[Any]]] = {
    "kill": (KillConfig, KillInjector),
    "crash": (CrashConfig, CrashInjector),
    "hang": (HangConfig, HangInjector),
    "node_loss": (NodeLossConfig, NodeLossInjector),
    "preempt": (PreemptConfig, PreemptInjector),
    "node_join": (NodeJoinConfig, NodeJoinInjector),
    "jitter": (JitterConfig, JitterInjector),
    "straggler": (StragglerConfig, StragglerInjector),
    "corrupt": (CorruptConfig, CorruptInjector),
    "disk_full": (DiskFullConfig, DiskFullInjector),
    "slow_storage": (SlowStorageConfig, SlowStorageInjector),
    "throttle": (ThrottleConfig, LinkInjector),
    "partition": (PartitionConfig, LinkInjector),
    "delay": (DelayConfig, LinkInjector),
    "clock_skew": (ClockSkewConfig, ClockSkewInjector),
}

__all__ = ["FAULTS", "FaultConfig", "FaultConfigError", "HostUnsupported", "InWorkerInjector", "InjectorError",
           "PointFault", "RunShape", "WindowFault", "WindowInjector", "WorkerContext", "WorkerInjector"]
