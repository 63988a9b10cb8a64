"""Judge a faulted run against its reference and the scenario's expectations."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .compare import compare
from .errors import ConfigFieldError
from .journal import Journal
from .losscurve import LossExpect, compare_curves, loss_curve
from .metrics import efficiency, final_step, recoveries, windows


@dataclass(kw_only=True, slots=True)
class CaughtExpect:
    """For a run with a planted bug (``workload.mutant``): how the verdict must catch it."""

    component: str | None = None
    """The component the first divergence must name (``rng``, ``data``, ``optimizer``, ...)."""
    key: str | None = None
    """The start of the first divergence's key (e.g. ``generator.loader``), with ``component``."""
    failure: str | None = None
    """Text one of the verdict's failures must contain (e.g. ``lost`` or ``did not complete``)."""

    def __post_init__(self) -> None:
        if self.component is None and self.failure is None:
            raise ConfigFieldError("component", "a component or a failure text (how the bug shows)", None)


@dataclass(kw_only=True, slots=True)
class ExpectConfig:
    """What must hold for a scenario to pass."""

    bitwise: bool = True
    """Every state and loss record (before the fault and after recovery) equals the reference bit for bit."""
    max_lost_steps: int | None = None
    """At most this many steps executed twice because of each fault."""
    max_recovery_seconds: float | None = None
    """At most this long from a fault to every rank completing its first step after the restore."""
    caught: CaughtExpect | None = None
    """The run carries a planted bug: it passes only if the other expectations fail the way given
    here (the harness caught the bug and named it)."""
    loss: LossExpect | None = None
    """A loss-curve tolerance (``analysis.losscurve``), for records that cannot be equal bit for
    bit (after an elastic restart on fewer replicas): ``{rtol, atol, window, margin, alpha, from_step}``."""

    def __post_init__(self) -> None:
        if self.max_lost_steps is not None and self.max_lost_steps < 0:
            raise ConfigFieldError("max_lost_steps", "an integer >= 0", self.max_lost_steps)
        if self.max_recovery_seconds is not None and self.max_recovery_seconds <= 0:
            raise ConfigFieldError("max_recovery_seconds", "a number > 0", self.max_recovery_seconds)


def judge(reference: Journal, run: Journal, expect: ExpectConfig, *, steps: int, faults_declared: int,
          launch_failures: list[str] | None = None) -> dict[str, Any]:
    """The verdict as a JSON-ready dict; ``passed`` is True only if every expectation holds.
    ``launch_failures``: what went wrong outside the journals (agents that exited badly, a timeout)."""
    cmp = compare(reference, run)
    recs = recoveries(run)
    finished = final_step(run)
    failures: list[str] = list(launch_failures or [])
    # Every rank of the job as it ended (fewer than the reference's after an elastic restart).
    expected_ranks = set(range(run.world_size)) if run.world_size != reference.world_size else set(reference.ranks)
    completed = expected_ranks <= set(finished) and all(finished[r] == steps for r in expected_ranks)
    if not completed:
        failures.append(f"run did not complete: finished ranks {sorted(finished)} of {sorted(expected_ranks)}")
    if cmp.resized and expect.loss is None:
        failures.append(f"{cmp.resized} records were written at world size {run.world_size} (the reference ran on "
                        f"{reference.world_size}); judging them needs expect.loss")
    loss = compare_curves(loss_curve(reference), loss_curve(run), expect.loss) if expect.loss is not None else None
    if loss is not None:
        failures.extend(f"loss curve: {f}" for f in loss["failures"])
    fault_events = run.events("fault")
    fired = len({e.get("id") for e in fault_events})
    if fired < faults_declared:
        missing = sorted(set(range(faults_declared)) - {e.get("id") for e in fault_events})
        failures.append(f"only {fired} of {faults_declared} faults fired (never fired: faults[{'], faults['.join(map(str, missing))}])")
    if expect.bitwise and not cmp.equal:
        first = cmp.first
        if first is not None:
            failures.append(f"diverged at step {first.step}: {first.component} / {first.key} (rank {first.rank})")
        if cmp.missing_reference:
            failures.append(f"{len(cmp.missing_reference)} records have no reference counterpart")
    lost = max((r.lost_steps for r in recs), default=0)
    if expect.max_lost_steps is not None and lost > expect.max_lost_steps:
        failures.append(f"lost {lost} steps, at most {expect.max_lost_steps} allowed")
    rec_secs = [r.recovery_seconds for r in recs]
    if any(s is None for s in rec_secs) and recs:
        failures.append("a fault was never recovered from (no completed step after the restart)")
    worst = max((s for s in rec_secs if s is not None), default=None)
    if expect.max_recovery_seconds is not None and worst is not None and worst > expect.max_recovery_seconds:
        failures.append(f"recovery took {worst:.2f} s, at most {expect.max_recovery_seconds} s allowed")
    first = cmp.first
    caught = None
    if expect.caught is not None:
        c = expect.caught
        named = c.component is None or (first is not None and first.component == c.component
                                        and (c.key is None or first.key.startswith(c.key)))
        said = c.failure is None or any(c.failure in f for f in failures)
        caught = {"expected": {"component": c.component, "key": c.key, "failure": c.failure},
                  "caught": bool(failures) and named and said,
                  "evidence": failures}
        failures = [] if caught["caught"] else [
            "the planted bug was not caught as expected (" + (f"first divergence in {c.component}" if c.component else "")
            + (" and " if c.component and c.failure else "") + (f"a failure saying {c.failure!r}" if c.failure else "")
            + "); the verdict said: " + ("; ".join(failures) or "nothing wrong")]
    return {
        "passed": not failures,
        "failures": failures,
        "caught": caught,
        "bitwise_equal": cmp.equal,
        "first_divergence": None if first is None else first.as_dict(),
        "divergent_records": len(cmp.divergences),
        "states_compared": cmp.states_compared,
        "resized_records": cmp.resized,
        "world_size": {"reference": reference.world_size, "final": run.world_size},
        "loss_curve": loss,
        "losses_compared": cmp.losses_compared,
        "lost_steps": lost,
        "recovery_seconds": worst,
        "faults_fired": fired,
        "fault_occurrences": len(fault_events),
        "faults_declared": faults_declared,
        "completed": completed,
        "recoveries": [r.as_dict() for r in recs],
        "windows": windows(run),
        "checkpoints_rejected": _by_step(run.events("checkpoint_rejected")),
        "checkpoints_failed": _by_step(run.events("checkpoint_failed")),
        "metrics": efficiency(reference, run, steps),
    }


def _by_step(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (step, tier) with the first reason given (every rank reports its own)."""
    out: dict[tuple[Any, Any], dict[str, Any]] = {}
    for e in evs:
        out.setdefault((e.get("step"), e.get("tier")), {"step": e.get("step"), "tier": e.get("tier"), "reason": e.get("reason")})
    return sorted(out.values(), key=lambda d: (d["step"] is None, d["step"]))
