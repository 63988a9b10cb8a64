"""When a fault fires: at a step and phase, at a time, periodically, or at random with an MTBF.

Two shapes of fault share these triggers:

* a **point** fault happens at a moment (a kill, a hang, a corrupted file). It
  fires at ``at_step`` (in ``phase``), again every ``every`` steps, or at
  ``at_time`` seconds after the job started, again every ``every_seconds``, or
  at random moments whose gaps are exponential with mean ``mtbf`` seconds,
  drawn from ``seed`` (so a run can be replayed exactly). ``times`` bounds how
  often a periodic or random fault fires. Each firing is an *occurrence*,
  numbered from 0.
* a **window** fault holds for a while (a throttled link, a jittery loader, a
  straggler): from ``from_step`` (or ``from_time`` seconds) to ``to_step``
  (exclusive; or for ``duration`` seconds), to the end of the run if no end is
  given.

Time is measured from the moment the harness launched the job, so a restarted
worker sees the same clock as the one it replaced.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from baft.events import PHASES, RESTORE_PHASES

from .base import FaultConfig, RunShape
from .errors import FaultConfigError


@dataclass(kw_only=True, slots=True)
class PointFault(FaultConfig):
    """A fault that happens at a moment; exactly one of ``at_step``, ``at_time``, ``mtbf`` is set."""

    phases: ClassVar[tuple[str, ...]] = ("iteration",)
    """The phases this kind of fault can fire in."""

    at_step: int | None = None
    """0-based iteration at which it fires (that many steps have completed)."""
    at_restore: int | None = None
    """Instead: in the restore of the rank's N-th restarted process (N >= 1; the first process restores nothing),
    at ``phase`` ``restore`` or one of the restore's steps: ``restore_locate``, ``restore_pull``,
    ``restore_load``. A second failure while the job recovers from a first (which caused restart N)."""
    phase: str = "iteration"
    """Where in the iteration: ``iteration`` (its start), ``forward`` / ``backward`` (first
    microbatch), ``backward_weight`` (the first weight-gradient pass, on a zero-bubble schedule),
    ``optimizer`` (before the optimizer step), or a checkpoint phase —
    ``snapshot``, ``replicate``, ``persist``, ``restore`` (``step`` is then the version)."""
    every: int | None = None
    """With ``at_step``: fire again every this many steps (up to ``times`` in all)."""
    at_time: float | None = None
    """Seconds after the job started; fires at the first ``phase`` event after that."""
    every_seconds: float | None = None
    """With ``at_time``: fire again every this many seconds (up to ``times`` in all)."""
    mtbf: float | None = None
    """Mean seconds between failures: fires at random moments (exponential gaps), up to ``times``."""
    seed: int = 0
    """Seed of the random moments (``mtbf``); journaled so a run can be replayed."""
    times: int = 1
    """How many occurrences at most (periodic or random triggers)."""
    microbatch: int = 0
    """With ``phase`` ``data``, ``forward`` or ``backward``: the step's micro-batch (0-based) at which it fires; in
    an unmodified script the step's N-th batch fetch (a kill in the middle of an accumulated step)."""

    def check(self, run: RunShape) -> None:
        FaultConfig.check(self, run)
        if isinstance(self.microbatch, bool) or not isinstance(self.microbatch, int) or self.microbatch < 0:
            raise FaultConfigError("microbatch", "an integer >= 0", self.microbatch)
        if self.microbatch and self.phase not in ("data", "forward", "backward"):
            raise FaultConfigError("microbatch", f"0 with phase {self.phase} (a micro-batch is a data, forward or "
                                   "backward phase's)", self.microbatch)
        given = [n for n in ("at_step", "at_time", "mtbf", "at_restore") if getattr(self, n) is not None]
        if len(given) != 1:
            raise FaultConfigError("at_step", "exactly one trigger: at_step, at_time, mtbf or at_restore",
                                   "<" + (", ".join(given) or "none of them") + ">")
        if self.at_restore is not None and (isinstance(self.at_restore, bool) or not isinstance(self.at_restore, int)
                                            or self.at_restore < 1):
            raise FaultConfigError("at_restore", "an integer >= 1 (the rank's N-th restarted process)", self.at_restore)
        if self.at_restore is not None and self.phase not in RESTORE_PHASES:
            raise FaultConfigError("phase", "with at_restore, restore or a step of it: " + ", ".join(RESTORE_PHASES),
                                   self.phase)
        if self.at_restore is None and self.phase in RESTORE_PHASES[1:]:
            raise FaultConfigError("phase", f"with a step of the restore ({self.phase}), the trigger at_restore (the "
                                   "restore has no training step)", self.phase)
        if self.phase not in self.phases:
            raise FaultConfigError("phase", f"a phase of {self.kind}: " + ", ".join(self.phases), self.phase)
        if self.at_step is not None and not 0 <= self.at_step < run.steps:
            raise FaultConfigError("at_step", f"a step in 0..{run.steps - 1}", self.at_step)
        if self.every is not None and (self.every < 1 or self.at_step is None):
            raise FaultConfigError("every", "an integer >= 1, together with at_step", self.every)
        if self.at_time is not None and self.at_time < 0:
            raise FaultConfigError("at_time", "seconds >= 0", self.at_time)
        if self.every_seconds is not None and (self.every_seconds <= 0 or self.at_time is None):
            raise FaultConfigError("every_seconds", "a number > 0, together with at_time", self.every_seconds)
        if self.mtbf is not None and self.mtbf <= 0:
            raise FaultConfigError("mtbf", "seconds > 0", self.mtbf)
        if self.times < 1:
            raise FaultConfigError("times", "an integer >= 1", self.times)
        if self.times > 1 and self.every is None and self.every_seconds is None and self.mtbf is None:
            raise FaultConfigError("times", "1 unless every, every_seconds or mtbf repeats the fault", self.times)

    # -- occurrences ----------------------------------------------------------------------
    def step_occurrences(self, steps: int) -> list[int]:
        """The steps of a step trigger that fall inside a run of ``steps`` steps."""
        if self.at_step is None:
            return []
        every = self.every or 0
        out = [self.at_step + k * every for k in range(self.times if every else 1)]
        return [s for s in out if s < steps]

    def time_occurrences(self) -> list[float]:
        """Seconds after the job start of each occurrence of a time or random trigger."""
        if self.at_time is not None:
            gap = self.every_seconds or 0.0
            return [self.at_time + k * gap for k in range(self.times if gap else 1)]
        if self.mtbf is not None:
            rng, t, out = random.Random(self.seed), 0.0, []
            for _ in range(self.times):
                t += rng.expovariate(1.0 / self.mtbf)
                out.append(t)
            return out
        return []

    def expected_occurrences(self, steps: int) -> int | None:
        """How many times it fires in a run of ``steps`` steps; None when that depends on timing (or, with
        ``at_restore``, on the restarts)."""
        return len(self.step_occurrences(steps)) if self.at_step is not None else None

    def due(self, step: int, phase: str, elapsed: float, fired: set[int], restart: int = 0) -> int | None:
        """The occurrence that fires at this ``(step, phase)`` event, ``elapsed`` seconds after the
        job started, in the rank's ``restart``-th restarted process, given the occurrences already ``fired``;
        None if none."""
        if phase != self.phase:
            return None
        if self.at_restore is not None:
            return 0 if restart == self.at_restore and 0 not in fired else None
        if self.at_step is not None:
            every = self.every or 0
            k = 0 if not every else (step - self.at_step) // every
            hit = step == self.at_step + k * every and 0 <= k < (self.times if every else 1)
            return k if hit and k not in fired else None
        for k, t in enumerate(self.time_occurrences()):
            if k not in fired:
                return k if elapsed >= t else None
        return None


@dataclass(kw_only=True, slots=True)
class WindowFault(FaultConfig):
    """A fault that holds from a start to an end (steps or seconds)."""

    from_step: int | None = None
    """First iteration affected."""
    to_step: int | None = None
    """First iteration no longer affected (default: the end of the run)."""
    from_time: float | None = None
    """Instead of ``from_step``: seconds after the job started."""
    duration: float | None = None
    """With ``from_time`` (or instead of ``to_step``): seconds it lasts."""

    def check(self, run: RunShape) -> None:
        FaultConfig.check(self, run)
        if (self.from_step is None) == (self.from_time is None):
            raise FaultConfigError("from_step", "exactly one start: from_step or from_time",
                                   "<both>" if self.from_step is not None else "<neither>")
        if self.from_step is not None and not 0 <= self.from_step < run.steps:
            raise FaultConfigError("from_step", f"a step in 0..{run.steps - 1}", self.from_step)
        if self.to_step is not None:
            if self.from_step is None or not self.from_step < self.to_step <= run.steps:
                raise FaultConfigError("to_step", f"a step after from_step, at most {run.steps} (needs from_step)",
                                       self.to_step)
            if self.duration is not None:
                raise FaultConfigError("duration", "no duration when to_step is given", self.duration)
        if self.from_time is not None and self.from_time < 0:
            raise FaultConfigError("from_time", "seconds >= 0", self.from_time)
        if self.duration is not None and self.duration <= 0:
            raise FaultConfigError("duration", "seconds > 0", self.duration)

    def starts(self, step: int, elapsed: float) -> bool:
        """Whether the window has begun at ``step`` / ``elapsed`` seconds."""
        if self.from_step is not None:
            return step >= self.from_step
        return self.from_time is not None and elapsed >= self.from_time

    def ended(self, step: int, elapsed: float, began_at: float | None) -> bool:
        """Whether the window is over; ``began_at``: elapsed seconds when it began (for ``duration``)."""
        if self.to_step is not None and step >= self.to_step:
            return True
        return self.duration is not None and began_at is not None and elapsed >= began_at + self.duration

    def active(self, step: int, elapsed: float, began_at: float | None = None) -> bool:
        return self.starts(step, elapsed) and not self.ended(step, elapsed, began_at)


#: The phases the harness's training loop announces: ``iteration`` (the step begins), ``data`` (about to
#: fetch the batch), ``forward``/``backward`` (per microbatch), ``backward_weight`` (per microbatch, on the
#: zero-bubble schedules: the weight-gradient half of a split backward) and ``optimizer``; in an unmodified
#: script (``workload.command``) also ``save`` (``torch.save`` is called: the script writes a checkpoint).
TRAINING_PHASES: tuple[str, ...] = ("iteration", "data", "forward", "backward", "backward_weight", "optimizer", "save")
#: Every phase name a trigger may use: the loop's, then those baft's strategies announce.
ALL_PHASES: tuple[str, ...] = TRAINING_PHASES + PHASES
