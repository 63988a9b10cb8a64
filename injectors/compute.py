"""Compute faults: a straggler rank whose forward and backward passes run ``factor`` times slower."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

from .base import RunShape
from .errors import FaultConfigError
from .trigger import WindowFault
from .worker import WindowInjector


@dataclass(kw_only=True, slots=True)
class StragglerConfig(WindowFault):
    """Slow one rank's compute by a factor (a straggler, a thermally throttled device).

    After each forward or backward pass of a microbatch the rank idles
    ``(factor - 1)`` times what that pass took, so its compute takes ``factor``
    times as long while its communication is untouched; its pipeline
    neighbours see longer waits (and baft re-plans for them).
    """

    kind: ClassVar[str] = "straggler"
    rank: int
    """Global rank to slow down."""
    factor: float = 2.0
    """Slowdown of the rank's compute (> 1)."""

    def check(self, run: RunShape) -> None:
        WindowFault.check(self, run)
        if not self.factor > 1:
            raise FaultConfigError("factor", "a number > 1", self.factor)


class StragglerInjector(WindowInjector):
    """Listens to the workload's ``compute`` events (phase, step, microbatch, seconds)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.added = 0.0

    def _on_event(self, kind: str, fields: dict[str, Any]) -> None:
        WindowInjector._on_event(self, kind, fields)
        if self.on and kind == "compute":
            extra = (self.config.factor - 1.0) * fields.get("seconds", 0.0)
            time.sleep(extra)
            self.added += extra

    def end(self) -> None:
        self.ctx.record("straggler_summary", id=self.fault_id, added_seconds=round(self.added, 4))
