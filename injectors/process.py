"""Process faults: kill a rank at a step."""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import ClassVar, Literal

from .base import FaultConfig, InWorkerInjector
from .errors import FaultConfigError


@dataclass(kw_only=True, slots=True)
class KillConfig(FaultConfig):
    """Send a signal to one rank when it reaches a step."""

    kind: ClassVar[str] = "kill"
    rank: int
    """Global rank to kill."""
    at_step: int
    """0-based iteration at whose start the signal is sent (that many steps have completed)."""
    phase: Literal["iteration", "optimizer", "snapshot", "persist", "restore"] = "iteration"
    """Where it fires: ``iteration`` at the start of step ``at_step``; ``optimizer`` just before
    its optimizer step; ``snapshot`` when baft starts copying version ``at_step`` (inside the
    bubbles); ``persist`` when baft's background thread starts writing version ``at_step``;
    ``restore`` when a restarted job starts loading step ``at_step``."""
    signal: Literal["SIGKILL", "SIGTERM"] = "SIGKILL"
    """SIGKILL: no cleanup at all; SIGTERM: the process may run its handlers."""

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise FaultConfigError("rank", "a rank >= 0", self.rank)
        if self.at_step < 0:
            raise FaultConfigError("at_step", "a step >= 0", self.at_step)


class KillInjector(InWorkerInjector):
    """Signals its own process: the fault fires at exactly the configured step."""

    def inject(self) -> None:
        os.kill(os.getpid(), getattr(signal, self.config.signal))
