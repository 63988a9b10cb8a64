"""Loss-curve comparison, for runs that cannot match their reference bit for bit.

After an elastic restart on fewer replicas (or with nondeterministic kernels)
the run follows the same trajectory only approximately. Three checks, each
configurable in ``expect.loss``:

* a tolerance band: over every window of ``window`` consecutive steps, the mean
  loss of the run is within ``atol + rtol * |reference mean|`` of the reference's
  (``window: 1`` compares step by step);
* an equivalence test (with ``margin``): the mean relative difference of the run
  from the reference is shown to lie inside ``±margin`` — the two one-sided tests
  (TOST) at level ``alpha``, done as the inclusion of the ``1 - 2·alpha`` bootstrap
  interval of the mean, resampled in blocks of ``window`` steps because the
  differences of neighbouring steps are correlated;
* both start at ``from_step`` (default: the first step where the run's loss
  differs from the reference's at all, so steps equal bit for bit do not dilute
  the test).

A run's curve takes, for each step, the loss of the last time it was executed
(a step redone after a restore counts as its later execution).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .benchstats import bootstrap_ci
from .errors import ConfigFieldError
from .journal import Journal
from .record import Record, known, optional


@dataclass(kw_only=True, slots=True)
class LossExpect:
    """How close the run's loss curve must stay to the reference's."""

    rtol: float = 1e-3
    """Relative tolerance of each window's mean loss."""
    atol: float = 0.0
    """Absolute tolerance added to the relative one."""
    window: int = 1
    """Steps per window (1: step by step); also the block length of the equivalence bootstrap."""
    margin: float | None = None
    """Equivalence margin on the mean relative difference (null: no equivalence test)."""
    alpha: float = 0.05
    """Level of each one-sided test of the equivalence test."""
    from_step: int | None = None
    """First step judged (null: the first step whose loss differs from the reference at all)."""

    def __post_init__(self) -> None:
        if self.rtol < 0 or self.atol < 0:
            field = "rtol" if self.rtol < 0 else "atol"
            raise ConfigFieldError(field, "a number >= 0", getattr(self, field))
        if self.window < 1:
            raise ConfigFieldError("window", "an integer >= 1", self.window)
        if self.margin is not None and self.margin <= 0:
            raise ConfigFieldError("margin", "a number > 0 (or null)", self.margin)
        if not 0 < self.alpha < 0.5:
            raise ConfigFieldError("alpha", "a number in (0, 0.5)", self.alpha)
        if self.from_step is not None and self.from_step < 0:
            raise ConfigFieldError("from_step", "an integer >= 0 (or null)", self.from_step)


def loss_curve(journal: Journal) -> dict[int, float]:
    """Step -> loss of its last execution: of the incarnation that ran it last, the lowest rank that
    reported a loss for it (the last stages' replicas report the same all-reduced value; an unmodified
    script's ranks each their own, so one rank's is taken, the same one in every run)."""
    best: dict[int, tuple[tuple[int, int, float], float]] = {}
    for e in journal.events("step"):
        if e.get("loss") is None:
            continue
        key = (e["incarnation"], -e["rank"], e["t"])  # a later incarnation, then a lower rank, then later
        prev = best.get(e["step"])
        if prev is None or key >= prev[0]:
            best[e["step"]] = (key, float(e["loss"]))
    return {s: v for s, (_, v) in sorted(best.items())}


@dataclass(kw_only=True, slots=True)
class WorstWindow(Record):
    """The window of steps whose mean loss is furthest off, relative to its tolerance."""

    steps: list[int]
    """Its first and last step."""
    reference: float
    """The reference's mean loss over it."""
    run: float
    """The run's mean loss over it."""
    deviation: float
    """``|run - reference|``."""
    tolerance: float
    """``atol + rtol * |reference|``."""
    score: float
    """Deviation over tolerance (above 1: out of tolerance)."""


@dataclass(kw_only=True, slots=True)
class Equivalence(Record):
    """The equivalence test (TOST as a bootstrap interval) of the mean relative difference."""

    mean_relative_difference: float
    """Mean over the steps judged of ``(run - reference) / |reference|``."""
    interval: list[float]
    """The ``1 - 2·alpha`` block-bootstrap interval of that mean, [low, high]."""
    margin: float
    """The equivalence margin asked for."""
    alpha: float
    """The level of each one-sided test."""
    equivalent: bool
    """The interval lies inside ``±margin``."""


@dataclass(kw_only=True, slots=True)
class LossVerdict(Record):
    """The loss-curve verdict (``loss_curve`` in ``verdict.json``)."""

    from_step: int | None
    """The first step judged (None: the curves never differ)."""
    steps_compared: int
    """Steps of both curves from ``from_step`` on."""
    window: int
    """Steps per window."""
    rtol: float
    """Relative tolerance of a window's mean loss."""
    atol: float
    """Absolute tolerance added to it."""
    missing_steps: list[int]
    """Reference steps the run has no loss for."""
    worst_window: WorstWindow | None
    """The window furthest off (None: no window to judge)."""
    equivalence: Equivalence | None
    """The equivalence test (None: no ``margin`` asked)."""
    failures: list[str]
    """What did not hold, in words."""
    passed: bool
    """Every configured check held."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LossVerdict:
        return cls(**{**known(cls, data), "worst_window": optional(WorstWindow, data["worst_window"]),
                      "equivalence": optional(Equivalence, data["equivalence"])})


def compare_curves(reference: dict[int, float], run: dict[int, float], cfg: LossExpect) -> LossVerdict:
    """The loss verdict; ``passed`` is True when every configured check holds."""
    common = sorted(set(reference) & set(run))
    first_diff = next((s for s in common if run[s] != reference[s]), None)
    start = cfg.from_step if cfg.from_step is not None else first_diff
    steps = [s for s in common if start is not None and s >= start]
    missing = sorted(set(reference) - set(run))
    failures: list[str] = []
    if missing:
        failures.append(f"no loss for {len(missing)} reference steps (first {missing[0]})")
    worst: WorstWindow | None = None
    for i in range(len(steps) - cfg.window + 1):
        win = steps[i : i + cfg.window]
        ref = sum(reference[s] for s in win) / len(win)
        got = sum(run[s] for s in win) / len(win)
        tol = cfg.atol + cfg.rtol * abs(ref)
        dev = abs(got - ref)
        score = dev / tol if tol > 0 else (0.0 if dev == 0 else float("inf"))
        if worst is None or score > worst.score:
            worst = WorstWindow(steps=[win[0], win[-1]], reference=ref, run=got, deviation=dev, tolerance=tol,
                                score=score)
    if worst is not None and worst.score > 1:
        failures.append(f"mean loss of steps {worst.steps[0]}-{worst.steps[1]} is {worst.run:.6g}, reference "
                        f"{worst.reference:.6g}: off by {worst.deviation:.3g}, tolerance {worst.tolerance:.3g}")
    equivalence = None
    if cfg.margin is not None and steps:
        rel = [(run[s] - reference[s]) / abs(reference[s]) if reference[s] else 0.0 for s in steps]
        mean = sum(rel) / len(rel)
        lo, hi = bootstrap_ci(rel, stat=lambda xs: sum(xs) / len(xs), level=1 - 2 * cfg.alpha, block=cfg.window)
        equivalence = Equivalence(mean_relative_difference=mean, interval=[lo, hi], margin=cfg.margin,
                                  alpha=cfg.alpha, equivalent=-cfg.margin < lo and hi < cfg.margin)
        if not equivalence.equivalent:
            failures.append(f"not shown equivalent: the {100 * (1 - 2 * cfg.alpha):.0f}% interval of the mean relative "
                            f"difference [{lo:.2%}, {hi:.2%}] is not inside ±{cfg.margin:.2%}")
    return LossVerdict(from_step=start, steps_compared=len(steps), window=cfg.window, rtol=cfg.rtol, atol=cfg.atol,
                       missing_steps=missing, worst_window=worst, equivalence=equivalence, failures=failures,
                       passed=not failures)
