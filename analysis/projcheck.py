"""The projection checked against runs we can make: a run's outcome predicted from its own profile.

:mod:`analysis.projection` prices a strategy by the stall of a checkpoint, the
versions each tier holds and when they become durable, and a recovery as
detection, a restart, the retrieval from the newest tier that survived and the
first step. Here the same rules are applied to one measured run, with its own
profile (:mod:`analysis.profile`) as the costs and its own faults (kind, node,
the steps completed when each fired) as the failures:

* **overhead**: the stall share, ``stall_seconds / (interval x iteration)``,
  against the faulted run's mean step-to-step time over the reference's;
* **lost steps**: each tier keeps versions at multiples of its interval, a
  version durable once ``ready`` steps have completed after it (baft's memory
  copy: the step that copies it; a peer copy: that plus the replication lag; a
  background persist: that plus its write; a synchronous save: at once); the
  job resumes from the newest durable version on a tier the fault left (a lost
  node's memory is gone; its peer copies exist where replication ran);
* **recovery time**: detection (a stall waits for the watchdog, a partition
  also for the link to come back; the survivors of a node lost for good wait
  their last call), the relaunch, the retrieval
  (bytes over the tier's measured rate) and a first step as long as the
  reference's. The relaunch (torchrun stopping and restarting the workers, the
  rendezvous, the restore's agreement on a version) is the projection's
  ``restart_seconds``, an input there too: here it is calibrated on the *other*
  runs checked (leave one out, among runs of one node or of several alike),
  or, with none, the run's own first start.

What the model does not know is reported as such, not predicted: a storage fault
that destroys checkpoints, or a window fault that slows the iterations.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from .journal import Journal
from .metrics import Recovery
from .profile import Profile, step_gaps

#: Faults that destroy or refuse checkpoints: which versions exist is then not the model's.
STORAGE_FAULTS = ("corrupt", "disk_full")
#: Faults that slow iterations for a while (the stall share is then not the overhead).
SLOWING_FAULTS = ("jitter", "straggler", "throttle", "slow_storage")
#: Faults the watchdog detects (the job stalls rather than ends).
STALLS = ("hang", "partition")


@dataclass(kw_only=True, slots=True)
class Launch:
    """What the harness's launch adds to a recovery (the scenario's ``run`` section)."""

    hang_timeout: float | None = None
    """Seconds of silence before the watchdog declares a stall."""
    last_call: float = 10.0
    """Seconds the survivors of a node lost for good wait before they go on without it."""


@dataclass(kw_only=True, slots=True)
class TierRule:
    """Which versions one tier holds: multiples of ``every``, each durable once ``ready`` steps completed after it."""

    name: str
    every: int
    ready: float
    retrieval_seconds: float

    def newest(self, progress: float) -> int:
        """The newest durable version with ``progress`` steps completed (a fraction: the part of the next step
        done when the fault fired; 0: none, the job starts over)."""
        if progress - self.ready < 0:
            return 0
        return max(0, math.floor((progress - self.ready) / self.every + 1e-9) * self.every)


def tier_rules(p: Profile) -> dict[str, TierRule]:
    """The tiers of the profiled strategy."""
    it = p.iteration_seconds
    out: dict[str, TierRule] = {}
    state = p.state_bytes_per_rank or 0.0
    if p.strategy == "baft":
        copy = state / (p.copy_gbytes_per_s * 1e9) if p.copy_gbytes_per_s else 0.0
        out["shm"] = TierRule(name="shm", every=p.snapshot_every or 1, ready=1.0, retrieval_seconds=copy)
        if p.replicas and p.replicate_every:
            pull = state / (p.replica_gbytes_per_s * 1e9) if p.replica_gbytes_per_s else 0.0
            out["peer"] = TierRule(name="peer", every=p.replicate_every,
                                   ready=1.0 + (p.replicate_lag_seconds or 0.0) / it, retrieval_seconds=pull)
    if p.persist_every:
        write = p.persist_seconds or 0.0
        ready = 0.0 if p.strategy == "sync" else (1.0 if p.strategy == "baft" else 0.0) + write / it
        out["persistent"] = TierRule(name="persistent", every=p.persist_every, ready=ready, retrieval_seconds=write)
    return out


def predicted_overhead(p: Profile) -> float | None:
    """The stall share of the strategy: what checkpointing adds to an iteration, as a fraction of it."""
    if p.stall_seconds is None:
        return 0.0 if p.strategy == "none" else None
    every = (p.snapshot_every or 1) if p.strategy == "baft" else (p.persist_every or 1)
    return p.stall_seconds / (every * p.iteration_seconds)


def measured_overhead(run: Journal, reference_iteration: float) -> float | None:
    """The faulted run's mean step-to-step time over the reference's, minus 1."""
    gaps = step_gaps(run)
    return statistics.mean(gaps) / reference_iteration - 1 if gaps else None


@dataclass(kw_only=True, slots=True)
class FaultCheck:
    """One recovery: predicted against measured."""

    fault: str
    node: int | None
    progress: int
    """Steps completed when the fault fired (the model's input, as the simulation's failure times are)."""
    predicted_step: int
    predicted_tier: str
    measured_step: int
    measured_tier: str | None
    predicted_recovery: float
    measured_recovery: float | None

    @property
    def predicted_lost(self) -> int:
        return self.progress - self.predicted_step

    @property
    def measured_lost(self) -> int:
        return self.progress - self.measured_step

    def to_json(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self.__slots__},
                "predicted_lost": self.predicted_lost, "measured_lost": self.measured_lost}


@dataclass(kw_only=True, slots=True)
class RunCheck:
    """One run's outcome, predicted from its profile, against what it measured."""

    scenario: str
    strategy: str
    predicted_overhead: float | None
    measured_overhead: float | None
    faults: list[FaultCheck] = field(default_factory=list)
    not_modelled: list[str] = field(default_factory=list)
    """What of this run the model cannot predict, and why (those parts are left out of the errors)."""
    profile: Profile | None = None

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "strategy": self.strategy, "predicted_overhead": self.predicted_overhead,
                "measured_overhead": self.measured_overhead, "faults": [f.to_json() for f in self.faults],
                "not_modelled": self.not_modelled, "profile": self.profile.to_json() if self.profile else None}


def _surviving(rules: dict[str, TierRule], p: Profile, fault: dict[str, Any], progress: int) -> list[TierRule]:
    """The tiers a fault leaves: a node loss takes that node's memory, leaving its peer copies (if its store was
    still replicating), which the whole job's restore then waits for."""
    if fault.get("fault") != "node_loss":
        return [r for n, r in rules.items() if n != "peer"]
    out = []
    stopped = p.replication_stopped.get(f"node{fault.get('node')}")
    if "peer" in rules and (stopped is None or stopped > progress):
        out.append(rules["peer"])
    elif "peer" in rules and stopped is not None:  # the copies it sent before it stopped are still there
        peer = rules["peer"]
        out.append(TierRule(name="peer", every=peer.every, ready=peer.ready + (progress - stopped),
                            retrieval_seconds=peer.retrieval_seconds))
    return out + [r for n, r in rules.items() if n == "persistent"]


def _into_step(run: Journal, fault: dict[str, Any], progress: int, iteration: float) -> float:
    """How much of the step after ``progress`` had run when ``fault`` fired, as a fraction of an iteration."""
    fired = next((e["t"] for e in run.events("fault") if e.get("id") == fault.get("id")
                  and e.get("occurrence") == fault.get("occurrence")), None)
    ended = [e["t"] for e in run.events("step") if e["step"] == progress - 1 and fired is not None and e["t"] <= fired]
    if fired is None or not ended:
        return 0.0
    if any(max(ended) < e["t"] < fired for e in run.events("start")):
        return 0.0  # it fired in a restart (a restore), before any step of it
    return float(min(1.0, max(0.0, (fired - max(ended)) / iteration)))


def measured_relaunch(rec: Recovery, launch: Launch) -> float | None:
    """What relaunching took in one recovery: its restart, startup, rendezvous and restore phases, less the last
    call the survivors of a node lost for good waited (the launch's setting, predicted as such)."""
    phases = rec.phases or {}
    parts = [phases.get(k) for k in ("restart", "startup", "rendezvous", "restore")]
    known = [x for x in parts if x is not None]
    if len(known) < len(parts):
        return None
    lost_for_good = rec.fault.get("fault") == "node_loss" and rec.fault.get("replacement") is False
    return max(0.0, sum(known) - (launch.last_call if lost_for_good else 0.0))


def check_run(scenario: str, p: Profile, run: Journal, recoveries: list[Recovery], launch: Launch,
              relaunch_seconds: float | None = None) -> RunCheck:
    """Predict ``run``'s overhead and each recovery from ``p`` and compare (see the module's docstring).
    ``relaunch_seconds``: what a relaunch costs, from elsewhere (None: the run's own first start)."""
    faults = [e for e in run.events("fault")]
    kinds: set[str] = {str(e.get("fault")) for e in faults}
    out = RunCheck(scenario=scenario, strategy=p.strategy, predicted_overhead=predicted_overhead(p),
                   measured_overhead=measured_overhead(run, p.iteration_seconds), profile=p)
    slowing = sorted(kinds & set(SLOWING_FAULTS))
    if slowing:
        out.not_modelled.append(f"overhead: {', '.join(slowing)} slowed the iterations for a while")
    if "preempt" in kinds:
        out.not_modelled.append("recoveries: preempt (what survives is what the job saved in its grace period)")
        return out
    storage = sorted(kinds & set(STORAGE_FAULTS))
    if storage:
        out.not_modelled.append(f"recoveries: {', '.join(storage)} destroyed or refused checkpoints")
        return out
    rules = tier_rules(p)
    previous = 0
    for rec in recoveries:
        fault = rec.fault
        tiers = _surviving(rules, p, fault, rec.progress_before)  # memory first: it serves when it is as new
        at = rec.progress_before + _into_step(run, fault, rec.progress_before, p.iteration_seconds)
        best = max(tiers, key=lambda r: r.newest(at), default=None)
        step = max(best.newest(at), previous) if best else 0
        if step > rec.progress_before:
            step = rec.progress_before
        detect = (launch.hang_timeout or 0.0) if fault.get("fault") in STALLS else 0.0
        if fault.get("fault") == "partition" and fault.get("duration"):
            detect = max(detect, float(fault["duration"]))  # the job re-forms only once the link is back
        if fault.get("fault") == "node_loss" and fault.get("replacement") is False:
            detect += launch.last_call
        retrieval = best.retrieval_seconds if best and step > 0 else 0.0
        relaunch = relaunch_seconds if relaunch_seconds is not None else (p.start_seconds or 0.0)
        recovery = detect + relaunch + retrieval + (p.first_step_seconds or p.iteration_seconds)
        out.faults.append(FaultCheck(
            fault=str(fault.get("fault")), node=fault.get("node"), progress=rec.progress_before,
            predicted_step=step, predicted_tier=best.name if best and step > 0 else "none",
            measured_step=rec.restored_step, measured_tier=rec.restored_tier,
            predicted_recovery=recovery, measured_recovery=rec.recovery_seconds))
        previous = rec.restored_step
    return out


@dataclass(kw_only=True, slots=True)
class CheckSummary:
    """The errors over every modelled part of the runs checked."""

    runs: int
    recoveries: int
    lost_exact: int
    """Recoveries whose lost steps the model predicted exactly."""
    lost_mean_abs_error: float | None
    recovery_median_abs_error: float | None
    """Seconds."""
    recovery_median_rel_error: float | None
    """|predicted - measured| / measured, median."""
    overhead_mean_abs_error: float | None
    """Percentage points of an iteration."""
    overhead_runs: int
    overhead_by_strategy: dict[str, float] = field(default_factory=dict)
    """Strategy -> its runs' mean signed error (predicted - measured), percentage points."""

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def summarize(checks: list[RunCheck]) -> CheckSummary:
    faults = [f for c in checks for f in c.faults]
    timed = [(f.predicted_recovery, f.measured_recovery) for f in faults if f.measured_recovery]
    overheads: list[tuple[float, float]] = []
    by: dict[str, list[float]] = {}
    for c in checks:
        if c.predicted_overhead is None or c.measured_overhead is None or any(n.startswith("overhead")
                                                                                for n in c.not_modelled):
            continue
        overheads.append((c.predicted_overhead, c.measured_overhead))
        by.setdefault(c.strategy, []).append(100 * (c.predicted_overhead - c.measured_overhead))
    return CheckSummary(
        runs=len(checks), recoveries=len(faults),
        lost_exact=sum(f.predicted_lost == f.measured_lost for f in faults),
        lost_mean_abs_error=statistics.mean(abs(f.predicted_lost - f.measured_lost) for f in faults) if faults else None,
        recovery_median_abs_error=statistics.median(abs(p - m) for p, m in timed) if timed else None,
        recovery_median_rel_error=statistics.median(abs(p - m) / m for p, m in timed) if timed else None,
        overhead_mean_abs_error=100 * statistics.mean(abs(a - b) for a, b in overheads) if overheads else None,
        overhead_runs=len(overheads),
        overhead_by_strategy={k: statistics.mean(v) for k, v in sorted(by.items())},
    )
