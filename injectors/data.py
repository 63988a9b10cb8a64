"""Data-loader jitter: delay each batch by a seeded random amount, never change a sample."""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from .base import RunShape
from .errors import FaultConfigError
from .trigger import WindowFault
from .worker import WindowInjector


@dataclass(kw_only=True, slots=True)
class JitterConfig(WindowFault):
    """Delay the data loader of some ranks from a step (or time) on.

    Delays come from a seeded distribution keyed by (seed, rank, step), so a
    replayed or restarted run waits exactly the same; the batches themselves
    are untouched, so the run must stay bitwise equal to the reference. A step
    change of the loader's speed at step S is ``dist: constant, from_step: S``.
    """

    kind: ClassVar[str] = "jitter"
    ranks: list[int] | Literal["all"] = "all"
    """Ranks whose loader is slowed."""
    dist: Literal["constant", "uniform", "lognormal", "periodic"] = "lognormal"
    """``constant``: ``mean_ms`` every batch; ``uniform``: ``mean_ms`` +- ``spread_ms``;
    ``lognormal``: mean ``mean_ms`` with shape ``sigma`` (heavy tail); ``periodic``: a stall
    of ``mean_ms`` every ``period`` steps, nothing in between."""
    mean_ms: float = 10.0
    """Mean delay per batch in milliseconds (the stall length for ``periodic``)."""
    spread_ms: float = 5.0
    """``uniform``: half-width of the interval."""
    sigma: float = 0.5
    """``lognormal``: standard deviation of the log of the delay."""
    period: int = 5
    """``periodic``: steps between stalls."""
    seed: int = 0
    """Seed of the delays (journaled)."""

    def check(self, run: RunShape) -> None:
        WindowFault.check(self, run)
        if self.ranks != "all":
            bad = [r for r in self.ranks if not 0 <= r < run.world_size]
            if bad or not self.ranks:
                raise FaultConfigError("ranks", f"'all' or a non-empty list of ranks in 0..{run.world_size - 1}", self.ranks)
        if self.mean_ms < 0:
            raise FaultConfigError("mean_ms", "milliseconds >= 0", self.mean_ms)
        if self.dist == "uniform" and not 0 <= self.spread_ms <= self.mean_ms:
            raise FaultConfigError("spread_ms", f"milliseconds in 0..mean_ms ({self.mean_ms})", self.spread_ms)
        if self.sigma < 0:
            raise FaultConfigError("sigma", "a number >= 0", self.sigma)
        if self.period < 1:
            raise FaultConfigError("period", "an integer >= 1", self.period)

    def targets(self, rank: int, node: int, local_rank: int) -> bool:
        return self.ranks == "all" or rank in self.ranks

    def delay(self, rank: int, step: int) -> float:
        """Seconds to delay ``rank``'s batch of ``step``; a pure function of the config."""
        rng = random.Random(f"{self.seed}/{rank}/{step}")
        if self.dist == "constant":
            ms = self.mean_ms
        elif self.dist == "uniform":
            ms = rng.uniform(self.mean_ms - self.spread_ms, self.mean_ms + self.spread_ms)
        elif self.dist == "lognormal":
            # E[lognormal(mu, sigma)] = exp(mu + sigma^2/2): choose mu so the mean is mean_ms.
            ms = 0.0 if self.mean_ms == 0 else rng.lognormvariate(math.log(self.mean_ms) - self.sigma**2 / 2, self.sigma)
        else:
            start = self.from_step or 0
            ms = self.mean_ms if (step - start) % self.period == 0 else 0.0
        return max(0.0, ms) / 1e3


class JitterInjector(WindowInjector):
    """Sleeps at the ``data`` phase (just before the loader yields the batch) while the window is open."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.batches = 0
        self.slept = 0.0

    def _on_event(self, kind: str, fields: dict[str, Any]) -> None:
        WindowInjector._on_event(self, kind, fields)
        if self.on and kind == "phase" and fields.get("phase") == "data":
            d = self.config.delay(self.ctx.rank, fields.get("step", 0))
            if d > 0:
                time.sleep(d)
            self.batches += 1
            self.slept += d

    def end(self) -> None:
        self.ctx.record("jitter_summary", id=self.fault_id, batches=self.batches, delay_seconds=round(self.slept, 4))
