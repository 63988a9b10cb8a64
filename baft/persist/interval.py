"""How often to persist while a job runs: Daly's optimum interval for the measured cost of a persist.

The model is the one ``baft advise`` applies to a finished run (``analysis/advisor.py``, which
documents it: the waste of checkpointing every ``tau`` seconds, Young's and Daly's optimum). The
two floors import nothing of each other, so each holds the formula it uses; a test keeps the two
in agreement (``tests/unit/test_interval.py``).

:class:`AdaptiveInterval` applies it while the job runs (``CheckpointConfig.mtbf_hours``): at each
persist boundary the ranks agree on the largest cost per persist any of them measured since the
last one and the slowest median iteration; the cost is smoothed (:data:`SMOOTHING`; the first
persists of a process, which start what later ones reuse, are not counted), and the interval
becomes Daly's in whole iterations, within ``every_min`` and ``every_max``, when it differs from
the current one by more than :data:`HYSTERESIS`; an ``interval_changed`` event says when, to what
and why. A persist's cost is what
the strategy reports of it: the seconds the training thread waited for it (a blocking save, a
snapshot copy, back-pressure) plus the CPU seconds its background work used (threads, baft's
writer process) — on a machine whose cores all train, each such second is taken from training;
with idle cores it is an upper bound.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from baft import events
from baft.mesh.collective import all_max

SMOOTHING = 0.3
"""Weight of the newest measurement in the smoothed cost per persist (an exponential moving average)."""
HYSTERESIS = 0.25
"""The interval changes only when Daly's differs from it by more than this share (or hits a bound)."""


def daly(cost: float, mtbf: float) -> float:
    if cost >= 2 * mtbf:
        return mtbf
    r = cost / (2 * mtbf)
    return math.sqrt(2 * cost * mtbf) * (1 + math.sqrt(r) / 3 + r / 9) - cost


def every_for(cost: float, mtbf: float, iteration: float, lo: int = 1, hi: int | None = None) -> int:
    """Daly's interval for ``cost`` and ``mtbf`` in whole iterations of ``iteration`` seconds, within
    [``lo``, ``hi``] (a checkpoint that costs nothing: every iteration, ``lo``)."""
    steps = max(lo, round(daly(cost, mtbf) / iteration) if cost > 0 else 1)
    return steps if hi is None else min(hi, steps)


class AdaptiveInterval:
    """When a strategy persists: every ``config.every`` steps, or, with ``config.mtbf_hours``, at an
    interval re-decided at each persist boundary from what the persists cost.

    Deciding is collective (one all-reduce over ``group`` at a boundary, a gloo group or a function that
    gives it): every rank must persist at the same steps, and the boundaries are the same on all of them,
    so all take part."""

    def __init__(self, config: Any, group: Any = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.config = config
        self.group = group
        self._clock = clock
        self.every = config.every
        self.anchor = 0  # the boundary the current interval counts from
        self.background: Callable[[], float] = lambda: 0.0
        """CPU seconds the strategy's background work has used so far (set by the strategy)."""
        self._blocked = 0.0
        self._persists = 0
        self._background_at = 0.0
        self._last_end: float | None = None
        self._iterations: list[float] = []
        self._decided: dict[int, bool] = {}
        self._warm = False  # past a process's first measured persists (which start what later ones reuse)
        self._cost: float | None = None  # the smoothed cost per persist (None: none counted yet)

    @property
    def adaptive(self) -> bool:
        return self.config.mtbf_hours is not None

    @property
    def iteration_seconds(self) -> float:
        """The median wall time between the recent step boundaries (0: none measured yet)."""
        return sorted(self._iterations)[len(self._iterations) // 2] if self._iterations else 0.0

    def charge(self, seconds: float) -> None:
        """The training thread waited ``seconds`` for checkpointing."""
        self._blocked += max(0.0, seconds)

    def _tick(self) -> None:
        """A step boundary (the first ask of a step): the wall time since the previous one is an iteration's."""
        now = self._clock()
        if self._last_end is not None:
            self._iterations = (self._iterations + [now - self._last_end])[-64:]
        self._last_end = now

    def due(self, step: int) -> bool:
        if step in self._decided:  # asked twice for one step: one decision (and one collective)
            return self._decided[step]
        self._tick()
        hit = step > self.anchor and (step - self.anchor) % self.every == 0
        if hit and self.adaptive:
            self._adapt(step)
            self._persists += 1
        self._decided = {step: hit}
        return hit

    def _adapt(self, step: int) -> None:
        """At boundary ``step``: the cost per persist since the last decision and the iteration time,
        the largest over the ranks; the interval Daly's for them."""
        background = self.background()
        cost, iteration = all_max([
            (self._blocked + background - self._background_at) / self._persists if self._persists else -1.0,
            self.iteration_seconds or -1.0], self.group() if callable(self.group) else self.group)
        if cost < 0 or iteration <= 0:  # no persist or no iteration measured yet (on some rank)
            return
        self._blocked, self._persists, self._background_at = 0.0, 0, background
        if not self._warm:  # the first persists of a process start what later ones reuse (a writer
            self._warm = True  # process, the file templates): not what a persist costs
            return
        cost = self._cost = cost if self._cost is None else SMOOTHING * cost + (1 - SMOOTHING) * self._cost
        mtbf = self.config.mtbf_hours * 3600
        optimum = daly(cost, mtbf) if cost > 0 else 0.0
        every = every_for(cost, mtbf, iteration, self.config.every_min, self.config.every_max)
        bounded = every in (self.config.every_min, self.config.every_max)
        if every == self.every or (abs(every - self.every) <= HYSTERESIS * self.every and not bounded):
            return  # (a change within the noise of the measurement would make it oscillate)
        events.emit("interval_changed", step=step, every=every, before=self.every, cost_seconds=cost,
                    iteration_seconds=iteration, mtbf_seconds=mtbf, daly_seconds=optimum, bounded=bounded,
                    why=f"Daly's interval for {cost * 1e3:.2f} ms per persist and an MTBF of "
                        f"{self.config.mtbf_hours:g} h is {optimum / iteration:.1f} "
                        f"iterations of {iteration * 1e3:.1f} ms; every {every}"
                        + (f" (bounded to [{self.config.every_min}, {self.config.every_max}])"
                           if bounded else ""))
        self.every, self.anchor = every, step
