"""Judge a faulted run against its reference and the scenario's expectations: the :class:`Verdict`.

``verdict.json`` is the verdict's serialisation (:meth:`Verdict.to_json`, :func:`load_verdict`);
:func:`analysis.summary.format_summary` shows it on a terminal, :mod:`analysis.report` as a report.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .changes import CheckpointIssue as CheckpointIssue
from .changes import IntervalChange as IntervalChange
from .changes import PlanOverflow as PlanOverflow
from .changes import ReplicationChange as ReplicationChange
from .changes import checkpoint_issues, interval_changes, plan_overflows, replication_changes
from .compare import Comparison, Divergence, PartialStep, compare
from .diagnosis import Cause, diagnose
from .errors import AnalysisError, ConfigFieldError
from .exits import Preemption, TeardownHang, WorkerFailure, preemptions, teardown_hangs, unexplained, worker_failures
from .journal import Journal
from .losscurve import LossExpect, LossVerdict, compare_curves, loss_curve
from .metrics import Efficiency, Recovery, Window, efficiency, final_step, recoveries, windows
from .record import Record, known, optional


@dataclass(kw_only=True, slots=True)
class CaughtExpect(Record):
    """For a run with a planted bug (``workload.mutant``): how the verdict must catch it."""

    component: str | None = None
    """The component the first divergence must name (``rng``, ``data``, ``optimizer``, ...)."""
    key: str | None = None
    """The start of the first divergence's key (e.g. ``generator.loader``), with ``component``."""
    failure: str | None = None
    """Text one of the verdict's failures must contain (e.g. ``lost`` or ``did not complete``)."""
    cause: str | None = None
    """The code the diagnosis must name (``rng-not-restored``, ``torn-checkpoint``, ...: ``analysis.diagnosis``)."""

    def __post_init__(self) -> None:
        if self.component is None and self.failure is None and self.cause is None:
            raise ConfigFieldError("component", "a component, a failure text or a cause (how the bug shows)", None)

    def to_json(self) -> dict[str, Any]:
        out = Record.to_json(self)
        if out["cause"] is None:
            del out["cause"]  # files from before it read and write unchanged
        return out


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
    rng: str = "consumed"
    """How a random number generator that differs after the resume is judged: ``consumed`` fails the run where
    the difference reaches what training uses (another component or a loss differs); a difference confined to
    RNGs, with model, optimizer, data and every loss bit for bit to the end, is a *latent* finding (said with
    its evidence and fix; the run passes). ``strict`` fails on any RNG difference."""

    def __post_init__(self) -> None:
        if self.rng not in ("consumed", "strict"):
            raise ConfigFieldError("rng", "consumed or strict", self.rng)
        if self.max_lost_steps is not None and self.max_lost_steps < 0:
            raise ConfigFieldError("max_lost_steps", "an integer >= 0", self.max_lost_steps)
        if self.max_recovery_seconds is not None and self.max_recovery_seconds <= 0:
            raise ConfigFieldError("max_recovery_seconds", "a number > 0", self.max_recovery_seconds)


@dataclass(kw_only=True, slots=True)
class Caught(Record):
    """For a run with a planted bug: whether the verdict caught it the way the scenario expects."""

    expected: CaughtExpect
    """How it had to show (``expect.caught``)."""
    caught: bool
    """The other expectations failed, naming the component and saying the text expected."""
    evidence: list[str]
    """The failures the other expectations gave (they do not fail the run when the bug is caught)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Caught:
        return cls(**{**known(cls, data), "expected": CaughtExpect.from_json(data["expected"])})


@dataclass(kw_only=True, slots=True)
class WorldSize(Record):
    """The ranks of the reference and of the faulted run as it ended (fewer after an elastic restart)."""

    reference: int
    """Ranks of the reference."""
    final: int
    """Ranks of the faulted run's last incarnation."""
    sizes: list[int] = field(default_factory=list)
    """The world sizes the faulted run went through, in order (a change each), e.g. ``[4, 2, 4]``: a node left
    and joined again."""

    @property
    def changed(self) -> bool:
        """Whether the faulted run ever ran at another size than the reference's."""
        return self.reference != self.final or any(s != self.reference for s in self.sizes)

    @property
    def path(self) -> str:
        """``4 -> 2 -> 4`` (the sizes gone through), or ``4 -> 2``."""
        return " -> ".join(map(str, self.sizes or [self.reference, self.final]))

    @property
    def first_change(self) -> str:
        """How the summary names the change after which records are judged by the loss curve."""
        return "the first resize" if len(self.sizes) > 2 else "the resize"


@dataclass(kw_only=True, slots=True)
class WallSeconds(Record):
    """How long the runs took, as the harness timed them."""

    reference: float | None
    """The reference run's seconds (also when it came from the cache: the time it took then); None on
    a cluster, where the reference is a journal the user gave."""
    reference_cached: bool
    """The reference came from the cache."""
    faulted: float
    """Seconds of the faulted run (on a cluster: of following the job)."""


@dataclass(kw_only=True, slots=True)
class ChaosFiring(Record):
    """One occurrence of one fault on a cluster: what the harness did with its Chaos Mesh objects."""

    id: int | None
    """The fault's index in the scenario's ``faults``."""
    fault: str | None
    """The fault's kind."""
    occurrence: int | None
    """Which occurrence of the fault (0: the first)."""
    status: str
    """``injected``, ``not injected`` or ``skipped``."""
    due_step: int | None
    """The step the scenario asked for (None: a time trigger)."""
    step: int | None
    """The job's step when the harness fired it (or skipped it)."""
    injected_step: int | None
    """The job's step once Chaos Mesh confirmed every target injected."""
    inject_seconds: float | None
    """From creating the objects to that confirmation."""
    deleted_step: int | None
    """The job's step when the objects were deleted."""
    recover_seconds: float | None
    """From the delete until Chaos Mesh had undone the fault (the slowest object)."""
    objects: list[str]
    """The names of its Chaos Mesh objects."""
    why: str | None
    """Why it was not injected or was skipped."""


@dataclass(kw_only=True, slots=True)
class ClusterFacts(Record):
    """Where a run on a cluster (``baft run --target k8s``) ran and what it did there."""

    namespace: str
    """The job's namespace."""
    run_id: str
    """The id in the objects' names and their ``baft.dev/run`` label."""
    job_dir: str | None
    """The job's run directory on the shared volume (None: steps read from W&B)."""
    wandb_run: str | None
    """The job's W&B run the steps were read from (None: from ``job_dir``)."""
    firings: list[ChaosFiring]
    """Every firing, by fault and occurrence."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterFacts:
        return cls(**{**known(cls, data), "firings": [ChaosFiring.from_json(f) for f in data["firings"]]})


@dataclass(kw_only=True, slots=True)
class Reproducibility(Record):
    """Two uninterrupted runs of the reference, compared (an unmodified script's, ``workload.command``):
    whether a bitwise verdict is possible at all."""

    equal: bool
    """They are equal bit for bit."""
    first_divergence: Divergence | None
    """Where they first differ (None when equal)."""
    statement: str
    """In words, with what the faulted run was judged by instead."""
    loss_rtol: float | None = None
    """When they differ: the relative tolerance the loss curve is judged with (twice the largest
    relative difference of the two runs' losses, at least 1e-3)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Reproducibility:
        return cls(**{**known(cls, data), "first_divergence": optional(Divergence, data.get("first_divergence"))})


def reproducibility(reference: Journal, again: Journal) -> Reproducibility:
    """Compare two uninterrupted runs of the same job."""
    cmp = compare(reference, again)
    if cmp.equal:
        return Reproducibility(equal=True, first_divergence=None,
                               statement="two uninterrupted runs are equal bit for bit: judged bit for bit")
    a, b = loss_curve(reference), loss_curve(again)
    spread = max((abs(b[s] - a[s]) / abs(a[s]) for s in set(a) & set(b) if a[s]), default=0.0)
    rtol = max(1e-3, 2 * spread)
    d = cmp.first
    where = f"at step {d.step} in {d.component} / {d.key} (rank {d.rank})" if d is not None else "in their records"
    return Reproducibility(equal=False, first_divergence=d, loss_rtol=rtol,
                           statement=f"two uninterrupted runs differ {where}: a bitwise verdict is impossible; "
                                     f"judged by the loss curve (rtol {rtol:.3g}, twice what the two runs showed)")


#: Fields written only when set (a run without a failed worker, a local run has no cluster, a cluster run
#: no agents); the value here (their default) means "not there".
_WHEN_SET: dict[str, Any] = {"worker_failures": [], "teardown_hangs": [], "preemptions": [], "diagnosis": [], "latent": [], "partial_steps": [], "target": "local", "wall_seconds": None, "agents_returncodes": None,
                             "cluster": None, "reproducibility": None}
#: Fields a verdict without a comparison (``note``) has besides those.
_UNCOMPARED = ("scenario", "passed", "failures")


@dataclass(kw_only=True, slots=True)
class Verdict(Record):
    """Whether a faulted run held every expectation of its scenario, and the facts it was judged on.

    ``verdict.json`` is its serialisation, a key per field. Fields added over time have defaults, so
    older files still load: what they lack reads as none of it (no windows, no loss curve, no metrics).
    """

    scenario: str = ""
    """The scenario's name."""
    passed: bool
    """Every expectation held (with a planted bug: the bug was caught as expected)."""
    failures: list[str]
    """Why not, one sentence each (empty when passed)."""
    caught: Caught | None = None
    """With a planted bug (``expect.caught``): whether it was caught."""
    bitwise_equal: bool = False
    """Every state and loss record of the run equals the reference's of the same rank and step."""
    first_divergence: Divergence | None = None
    """The earliest record that differs (None: none does)."""
    divergent_records: int = 0
    """Fingerprints (component, key) and losses that differ, over every record."""
    states_compared: int = 0
    """State records compared bit for bit."""
    resized_records: int = 0
    """Records written at another world size than the reference's (the loss curve judges them)."""
    world_size: WorldSize | None = None
    """Ranks of the reference and of the run as it ended."""
    loss_curve: LossVerdict | None = None
    """The loss-curve verdict (with ``expect.loss``)."""
    losses_compared: int = 0
    """Loss records compared bit for bit."""
    lost_steps: int = 0
    """The most steps any one fault made the job execute twice."""
    recovery_seconds: float | None = None
    """The slowest recovery (None: no fault needed one, or none completed)."""
    faults_fired: int = 0
    """Faults of the scenario that fired at least once."""
    fault_occurrences: int = 0
    """Firings: every occurrence of every fault (files from before it: ``faults_fired``)."""
    faults_declared: int = 0
    """Faults the scenario declares."""
    faults_unfired: list[int] = field(default_factory=list)
    """The indices (in the scenario's ``faults``) of those that never fired."""
    completed: bool = False
    """Every rank of the job as it ended finished the scenario's steps."""
    recoveries: list[Recovery] = field(default_factory=list)
    """What each fatal fault cost, in the order they fired."""
    windows: list[Window] = field(default_factory=list)
    """The non-fatal faults: where they were active and what they did."""
    checkpoints_rejected: list[CheckpointIssue] = field(default_factory=list)
    """Checkpoints a tier refused, one per step and tier."""
    checkpoints_failed: list[CheckpointIssue] = field(default_factory=list)
    """Checkpoint writes that failed, one per step and tier."""
    interval_changes: list[IntervalChange] = field(default_factory=list)
    """When and why the persistent interval adapted (``checkpoint.mtbf_hours``), one per step."""
    replication_changes: list[ReplicationChange] = field(default_factory=list)
    """When and why a node's store stopped replicating (its link too slow for a replica to be fresher than
    the persistent tier) or resumed."""
    plan_overflows: list[PlanOverflow] = field(default_factory=list)
    """Where baft's windows could not hold a stage's state and what the planner did instead (a snapshot every k
    iterations, or a stall), per rank and decision."""
    worker_failures: list[WorkerFailure] = field(default_factory=list)
    """Every worker that ended badly (a fault's victims too), as the torchrun agents saw it."""
    partial_steps: list[PartialStep] = field(default_factory=list)
    """Steps a restarted process resumed in the middle of (gradient accumulation across a save): their loss
    records are partial and not compared; the state after them is."""
    teardown_hangs: list[TeardownHang] = field(default_factory=list)
    """Workers of either run still alive ``run.exit_timeout`` after every rank had finished, ended by the
    harness: no failure, a finding about the job's stack."""
    diagnosis: list[Cause] = field(default_factory=list)
    """The likely causes of a failed resume, each with its evidence (:mod:`analysis.diagnosis`); none when
    the run held every expectation."""
    latent: list[Cause] = field(default_factory=list)
    """Findings that did not fail the run: a random number generator not restored that nothing drew from to the
    end (``expect.rng: consumed``), each with its evidence and fix."""
    preemptions: list[Preemption] = field(default_factory=list)
    """The preemptions of the faulted run: what each rank did between SIGTERM and the end of its grace."""
    metrics: Efficiency | None = None
    """Goodput, iteration overhead, checkpoint cost and bubble use (None in files from before them)."""
    target: str = "local"
    """Where the job ran: ``local`` (not written) or ``k8s``."""
    wall_seconds: WallSeconds | None = None
    """How long the runs took (filled in by whoever ran them, not by :func:`judge`)."""
    agents_returncodes: list[int] | None = None
    """A local run: the exit status of each node's torchrun agent."""
    cluster: ClusterFacts | None = None
    """A run on a cluster: where, and each firing of its faults."""
    reproducibility: Reproducibility | None = None
    """An unmodified script's reference run twice, compared (None: not checked)."""
    note: str | None = None
    """Set when nothing was compared (a run on a cluster without a reference): why. The file then holds
    ``"reference": null`` and this note in place of the judgement (``caught`` to ``metrics``)."""

    @property
    def compared(self) -> bool:
        """The run was judged against a reference: the judgement fields tell something."""
        return self.note is None

    def to_json(self) -> dict[str, Any]:
        """The mapping ``verdict.json`` holds."""
        out: dict[str, Any] = {}
        for name, value in Record.to_json(self).items():
            if name in _WHEN_SET:
                if getattr(self, name) != _WHEN_SET[name]:
                    out[name] = value
            elif name in _UNCOMPARED or (self.compared and name != "note"):
                out[name] = value
            if name == "failures" and not self.compared:
                out.update(reference=None, note=self.note)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        """The verdict a ``verdict.json`` of any version holds."""
        return cls(**{
            **known(cls, data),
            "fault_occurrences": data.get("fault_occurrences", data.get("faults_fired", 0)),
            "caught": optional(Caught, data.get("caught")),
            "first_divergence": optional(Divergence, data.get("first_divergence")),
            "world_size": optional(WorldSize, data.get("world_size")),
            "loss_curve": optional(LossVerdict, data.get("loss_curve")),
            "recoveries": [Recovery.from_json(r) for r in data.get("recoveries", [])],
            "windows": [Window.from_json(w) for w in data.get("windows", [])],
            "checkpoints_rejected": [CheckpointIssue.from_json(c) for c in data.get("checkpoints_rejected", [])],
            "checkpoints_failed": [CheckpointIssue.from_json(c) for c in data.get("checkpoints_failed", [])],
            "interval_changes": [IntervalChange.from_json(c) for c in data.get("interval_changes", [])],
            "replication_changes": [ReplicationChange.from_json(c) for c in data.get("replication_changes", [])],
            "plan_overflows": [PlanOverflow.from_json(c) for c in data.get("plan_overflows", [])],
            "worker_failures": [WorkerFailure.from_json(c) for c in data.get("worker_failures", [])],
            "teardown_hangs": [TeardownHang.from_json(c) for c in data.get("teardown_hangs", [])],
            "preemptions": [Preemption.from_json(c) for c in data.get("preemptions", [])],
            "diagnosis": [Cause.from_json(c) for c in data.get("diagnosis", [])],
            "latent": [Cause.from_json(c) for c in data.get("latent", [])],
            "partial_steps": [PartialStep.from_json(c) for c in data.get("partial_steps", [])],
            "metrics": optional(Efficiency, data.get("metrics")),
            "wall_seconds": optional(WallSeconds, data.get("wall_seconds")),
            "cluster": optional(ClusterFacts, data.get("cluster")),
            "reproducibility": optional(Reproducibility, data.get("reproducibility")),
        })

    def write(self, run_dir: Path) -> Path:
        """Write ``run_dir/verdict.json``; returns its path."""
        path = run_dir / "verdict.json"
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return path


def load_verdict(run_dir: Path) -> Verdict:
    """The verdict of a run directory (its ``verdict.json``); :class:`AnalysisError` when it has none."""
    path = Path(run_dir) / "verdict.json"
    if not path.is_file():
        raise AnalysisError(f"{run_dir}: no verdict.json (not a run directory of `baft run`?)")
    try:
        return Verdict.from_json(json.loads(path.read_text()))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise AnalysisError(f"{path}: not a verdict ({type(e).__name__}: {e})") from None


@dataclass(kw_only=True, slots=True)
class NotRun(Record):
    """A scenario of a suite that the harness could not run (the reference failed, a timeout): no verdict."""

    scenario: str
    """The scenario's name."""
    error: str
    """What went wrong."""

    @property
    def passed(self) -> bool:
        """Never: a scenario that did not run did not pass."""
        return False

    def to_json(self) -> dict[str, Any]:
        return {**Record.to_json(self), "passed": False}


def _completion(reference: Journal, run: Journal, finished: dict[int, int], steps: int) -> tuple[bool, list[str]]:
    """Whether every rank of the job as it ended (fewer than the reference's after an elastic restart) took
    ``steps`` steps; what to say when not."""
    expected_ranks = set(range(run.world_size)) if run.world_size != reference.world_size else set(reference.ranks)
    if expected_ranks <= set(finished) and all(finished[r] == steps for r in expected_ranks):
        return True, []
    short = {r: s for r, s in finished.items() if r in expected_ranks and s != steps}
    if short:  # it ended normally, after another number of steps
        ends = ", ".join(f"rank {r} after {s}" for r, s in sorted(short.items()))
        none = " (no optimizer step seen: the harness counts the steps of torch.optim optimizers)" \
            if not any(short.values()) else ""
        return False, [f"run did not complete: it finished {ends} step(s), expected {steps} (workload.steps){none}"]
    return False, [f"run did not complete: finished ranks {sorted(finished)} of {sorted(expected_ranks)}"]


def _diagnosis(reference: Journal, run: Journal, cmp: Comparison, *, failed: bool, recs: list[Recovery],
               repro: Reproducibility | None) -> list[Cause]:
    """The likely causes (:func:`~analysis.diagnosis.diagnose`); a journal it cannot read leaves the verdict
    standing and says so."""
    try:
        return diagnose(reference, run, cmp, failed=failed, recoveries=recs,
                        reproducible=repro.equal if repro is not None else None)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return [Cause(code="unexplained", summary=f"the diagnosis could not read the journals ({type(e).__name__}: "
                      f"{e})", evidence=[])]


def _planted(c: CaughtExpect, first: Divergence | None, failures: list[str],
             diagnosis: list[Cause]) -> tuple[Caught, list[str]]:
    """A planted bug's judgement: caught when the verdict failed where, saying what, and diagnosed as the
    expectation says; the failures become none when caught, one saying what was missed when not."""
    named = c.component is None or (first is not None and first.component == c.component
                                    and (c.key is None or first.key.startswith(c.key)))
    said = c.failure is None or any(c.failure in f for f in failures)
    why = c.cause is None or any(d.code == c.cause for d in diagnosis)
    caught = Caught(expected=c, caught=bool(failures) and named and said and why, evidence=failures)
    if caught.caught:
        return caught, []
    return caught, [
        "the planted bug was not caught as expected (" + (f"first divergence in {c.component}" if c.component else "")
        + (" and " if c.component and c.failure else "") + (f"a failure saying {c.failure!r}" if c.failure else "")
        + (f", the cause diagnosed as {c.cause}" if c.cause else "")
        + "); the verdict said: " + ("; ".join(failures) or "nothing wrong")
        + (" (diagnosed: " + ", ".join(d.code for d in diagnosis) + ")" if diagnosis else "")]


def _judge_loss(reference: Journal, run: Journal, cmp: Comparison, expect: LossExpect | None,
                repro: Reproducibility | None) -> LossVerdict | None:
    """The loss curve's verdict: against ``expect``, or (none asked) against the tolerance a job that is not
    bit for bit reproducible showed between two uninterrupted runs; steps resumed mid-way left out (their
    loss covers part of their micro-batches)."""
    if expect is None and repro is not None and not repro.equal and repro.loss_rtol is not None:
        expect = LossExpect(rtol=repro.loss_rtol)
    if expect is None:
        return None
    partial = {p.step for p in cmp.partial}
    ref_curve, run_curve = ({s: v for s, v in loss_curve(j).items() if s not in partial} for j in (reference, run))
    return compare_curves(ref_curve, run_curve, expect)


def _unexplained_restarts(run: Journal, fault_events: list[dict[str, Any]], exits: list[WorkerFailure]) -> list[str]:
    """A failure when the job restarted more often than its fatal faults explain (a crash of its own)."""
    restarts = max((e["incarnation"] for e in run.events("start")), default=0)
    fatal = sum(1 for e in fault_events if e.get("fatal", True))
    if restarts <= fatal:
        return []
    return [f"{restarts - fatal} restart(s) that no fault explains ({restarts} restarts, {fatal} fatal "
            f"fault firings): {unexplained(exits)}; see the logs/ of the run"]


def _rng_only(cmp: Comparison, bitwise: bool, expect: ExpectConfig) -> bool:
    """An RNG differs while everything it could reach (model, optimizer, data, every loss) stays bit for bit to
    the end: a latent finding, unless the scenario asks ``rng: strict``."""
    return (bitwise and not cmp.equal and not cmp.missing_reference and bool(cmp.divergences)
            and all(d.component == "rng" for d in cmp.divergences) and expect.rng != "strict")


def _recovery_failures(recs: list[Recovery], expect: ExpectConfig) -> tuple[int, float | None, list[str]]:
    """The worst lost steps and recovery seconds, and what of ``expect`` they break."""
    out = []
    lost = max((r.lost_steps for r in recs), default=0)
    if expect.max_lost_steps is not None and lost > expect.max_lost_steps:
        out.append(f"lost {lost} steps, at most {expect.max_lost_steps} allowed")
    rec_secs = [r.recovery_seconds for r in recs]
    if any(s is None for s in rec_secs) and recs:
        out.append("a fault was never recovered from (no completed step after the restart)")
    worst = max((s for s in rec_secs if s is not None), default=None)
    if expect.max_recovery_seconds is not None and worst is not None and worst > expect.max_recovery_seconds:
        out.append(f"recovery took {worst:.2f} s, at most {expect.max_recovery_seconds} s allowed")
    return lost, worst, out


def _divergence(cmp: Comparison) -> list[str]:
    """Where the run first differs from the reference, and records the reference lacks (judged bit for bit)."""
    out = []
    if not cmp.equal and cmp.first is not None:
        f = cmp.first
        out.append(f"diverged at step {f.step}: {f.component} / {f.key} (rank {f.rank})")
    if not cmp.equal and cmp.missing_reference:
        out.append(f"{len(cmp.missing_reference)} records have no reference counterpart")
    return out


def _step_mismatches(run: Journal) -> list[str]:
    """A framework counting other steps than the harness (one line per framework and rank)."""
    return [f"rank {e['rank']}: {e['framework']} counts step {e['framework_step']} where the harness counted "
            f"{e['counted']} optimizer steps (several optimizer steps per training step?)"
            for e in {(e["framework"], e["rank"]): e for e in run.events("step_mismatch")}.values()]


def judge(reference: Journal, run: Journal, expect: ExpectConfig, *, steps: int, faults_declared: int,
          launch_failures: list[str] | None = None, again: Journal | None = None) -> Verdict:
    """The verdict; ``passed`` is True only if every expectation holds. ``launch_failures``: what went
    wrong outside the journals (agents that exited badly, a timeout). ``again``: a second uninterrupted
    run of the reference; when the two differ, the job is not deterministic and is judged by its loss
    curve instead of bit for bit. The scenario's name, the wall times and where it ran are for the
    caller to fill in."""
    repro = reproducibility(reference, again) if again is not None else None
    bitwise = expect.bitwise and (repro is None or repro.equal)
    cmp = compare(reference, run)
    recs = recoveries(run)
    finished = final_step(run)
    failures: list[str] = list(launch_failures or [])
    completed, incomplete = _completion(reference, run, finished, steps)
    failures += incomplete
    if cmp.resized and expect.loss is None:
        failures.append(f"{cmp.resized} records were written at world size {run.world_size} (the reference ran on "
                        f"{reference.world_size}); judging them needs expect.loss")
    loss = _judge_loss(reference, run, cmp, expect.loss, repro)
    if loss is not None:
        failures.extend(f"loss curve: {f}" for f in loss.failures)
    fault_events = run.events("fault")
    fired = len({e.get("id") for e in fault_events})
    missing = sorted(set(range(faults_declared)) - {e.get("id") for e in fault_events})
    if fired < faults_declared:
        failures.append(f"only {fired} of {faults_declared} faults fired (never fired: faults[{'], faults['.join(map(str, missing))}])")
    latent_rng = _rng_only(cmp, bitwise, expect)
    if bitwise and not latent_rng:
        failures += _divergence(cmp)
    failures += _step_mismatches(run)
    exits = worker_failures(run)
    failures += _unexplained_restarts(run, fault_events, exits)
    lost, worst, unmet = _recovery_failures(recs, expect)
    failures += unmet
    first = cmp.first
    # a passing run has nothing to explain (whatever judged it); a latent RNG finding is explained apart
    explain = bool(failures) or latent_rng
    causes = _diagnosis(reference, run, cmp, failed=True, recs=recs, repro=repro) if explain else []
    diagnosis, latent = (causes, []) if failures else ([], causes)
    caught = None
    if expect.caught is not None:
        caught, failures = _planted(expect.caught, first, failures, diagnosis)
    return Verdict(
        passed=not failures,
        failures=failures,
        caught=caught,
        bitwise_equal=cmp.equal,
        first_divergence=first,
        divergent_records=len(cmp.divergences),
        states_compared=cmp.states_compared,
        resized_records=cmp.resized,
        world_size=WorldSize(reference=reference.world_size, final=run.world_size, sizes=run.world_sizes()),
        loss_curve=loss,
        losses_compared=cmp.losses_compared,
        lost_steps=lost,
        recovery_seconds=worst,
        faults_fired=fired, faults_unfired=missing,
        fault_occurrences=len(fault_events),
        faults_declared=faults_declared,
        completed=completed,
        recoveries=recs,
        windows=windows(run),
        checkpoints_rejected=checkpoint_issues(run.events("checkpoint_rejected")),
        checkpoints_failed=checkpoint_issues(run.events("checkpoint_failed")),
        interval_changes=interval_changes(run.events("interval_changed")),
        replication_changes=replication_changes(run),
        plan_overflows=plan_overflows(run),
        worker_failures=exits,
        partial_steps=cmp.partial,
        teardown_hangs=teardown_hangs(reference, "reference") + teardown_hangs(run, "faulted"),
        preemptions=preemptions(run),
        diagnosis=diagnosis,
        latent=latent,
        metrics=efficiency(reference, run, steps),
        reproducibility=repro,
    )
