"""Why a resume went wrong: the likely cause, named from the journals' evidence.

The comparison says *where* a resumed run first differs; this module says *why*, from the same journals.
For each restart it locates every rank's first state after the restore in the reference's history
(:func:`analysis.resume.locate`: per component, and for a component that moved, per key, the reference
steps it equals), then reads the pattern against the causes that account for most failed resumes:

=================================  =============================================================================
code                               evidence
=================================  =============================================================================
``corrupt-restore``                the restored model (or some of the model's or optimizer's tensors while the
                                   rest equal step k) equals no step of the reference
``torn-checkpoint``                model and optimizer (or an RNG) restored from different steps
``optimizer-not-restored``         the optimizer equals the start (or no step) while the model equals step k
``scheduler-stepped-after-load``   the scheduler equals step k + 1 (or later): stepped again after loading
``scheduler-not-restored``         the scheduler equals the start (or no step)
``rng-not-restored``               an RNG equals the start: what seeding gave, never set from the checkpoint
``rng-drawn-after-restore``        an RNG equals no step: restored, then drawn from before the step began (a
                                   new DataLoader iterator draws its base seed from it); one that equals
                                   another step came from another save (``torn-checkpoint``)
``data-position-not-restored``     the data position equals another step: the epoch or its order started over
``scaler-not-restored``            the loss scaler equals the start (or no step)
``accumulated-gradient-lost``      resumed mid-step, every component equal, the state after that step differs
``nondeterministic-job``           every component equal at the resume, a later step differs, and two
                                   uninterrupted runs differ too
``state-outside-fingerprints``     every component equal at the resume, a later step differs, two
                                   uninterrupted runs agree: something the probe does not see differs
``older-checkpoint-restored``      the restore used a checkpoint older than the newest one committed before
                                   the fault (or none at all)
=================================  =============================================================================

Each :class:`Cause` carries the code, one line, the evidence (components, keys and steps) and what usually
fixes it. Where the evidence fits no known cause, :func:`diagnose` says so (``unexplained``) instead of
guessing; a run that resumed right gets none.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .compare import Comparison
from .journal import Journal
from .record import Record
from .resume import IGNORED, ResumePoint, locate

#: What each cause is, in one line, and what usually fixes it.
CAUSES: dict[str, tuple[str, str | None]] = {
    "corrupt-restore": ("restored tensors equal no step of the reference: their bytes changed between save and "
                        "load (a damaged file loaded without a checksum), or they came from another run",
                        "verify each file's checksum on load and fall back to an older checkpoint when one fails"),
    "torn-checkpoint": ("the checkpoint's parts come from different steps: they were written one by one, with no "
                        "commit of the whole",
                        "write every part, then commit the checkpoint with one atomic rename (or a marker written "
                        "last), and restore only committed checkpoints"),
    "optimizer-not-restored": ("the optimizer's state (moments, step counts) was not loaded",
                               "load the optimizer's state dict together with the model's"),
    "scheduler-stepped-after-load": ("the LR scheduler is a step ahead: it was stepped again after its state was "
                                     "loaded (or saved after its step, restored before it)",
                                     "save and restore the scheduler at the same point of the step as the optimizer; "
                                     "do not step it while resuming"),
    "scheduler-not-restored": ("the LR scheduler's state was not loaded: its schedule starts over",
                               "save the scheduler's state dict and load it on resume"),
    "rng-not-restored": ("a random number generator was not restored: it is where seeding left it at the start",
                         "save every RNG the step draws from (torch, CUDA, numpy, python, a DataLoader's generator) "
                         "and set it on resume"),
    "rng-drawn-after-restore": ("a random number generator was restored, then drawn from before the step began (a new "
                                "DataLoader iterator draws its base seed from the global torch RNG)",
                                "give the DataLoader a torch.Generator of its own (saved and restored), or restore "
                                "the RNG after the iterator is made"),
    "data-position-not-restored": ("the data position came back wrong: the resumed epoch started over, or in another "
                                   "epoch's order",
                                   "save the sampler's epoch and position (or the batches seen) and skip them on "
                                   "resume; call sampler.set_epoch before each epoch"),
    "scaler-not-restored": ("the mixed-precision loss scaler's state (scale, growth tracker) was not loaded",
                            "save and load the GradScaler's state dict"),
    "accumulated-gradient-lost": ("resumed between two micro-batches of a step with every component equal, but the "
                                  "state after that step differs: the gradient accumulated before the save was lost",
                                  "save the accumulated gradients with a mid-step checkpoint, or save only at "
                                  "optimizer-step boundaries"),
    "nondeterministic-job": ("every component equals the reference where it resumed, yet a later step differs, and "
                             "two uninterrupted runs differ as well: the job is not deterministic",
                             "torch.use_deterministic_algorithms(True), fixed seeds, one intra-op thread count; "
                             "judge by the loss curve until then"),
    "state-outside-fingerprints": ("every component equals the reference where it resumed, yet a later step differs "
                                   "while two uninterrupted runs agree: state the probe does not fingerprint differs "
                                   "after the restart",
                                   "fingerprint the missing state (TrainState's extras) to see which"),
    "older-checkpoint-restored": ("the restore used an older checkpoint than the newest one committed before the "
                                  "fault",
                                  "restore the newest committed checkpoint: resolve 'latest' only after it is "
                                  "durable, and prefer the persistent copy when a replica is older"),
    "unexplained": ("the evidence fits no known cause", None),
}
@dataclass(frozen=True, slots=True)
class Cause(Record):
    """One likely cause of a failed resume (``verdict.json`` ``diagnosis``)."""

    code: str
    """Stable: a key of :data:`CAUSES`."""
    summary: str
    """One line: what it is."""
    evidence: list[str] = field(default_factory=list)
    """What in the journals shows it: components, keys, steps, ranks."""
    fix: str | None = None
    """What usually fixes it (None: not known)."""
    incarnation: int | None = None
    """The restart it concerns (None: the run as a whole)."""

    def describe(self) -> str:
        return f"[{self.code}] {self.summary}"


#: Components of many tensors, where a few keys that match no step mean changed bytes, not a part left behind
#: (an RNG that was drawn from after its restore also matches no step, in the key of that generator).
TENSOR_STATE = ("model", "optimizer")


def cause(code: str, evidence: list[str], incarnation: int | None = None) -> Cause:
    summary, fix = CAUSES[code]
    return Cause(code=code, summary=summary, evidence=evidence, fix=fix, incarnation=incarnation)


def _states(journal: Journal, rank: int) -> list[dict[str, Any]]:
    return [e for e in journal.events("state", rank) if isinstance(e.get("digests"), dict)]


def first_states(run: Journal) -> dict[int, dict[int, dict[str, Any]]]:
    """incarnation -> rank -> the first ``state`` event of that rank in that restart (incarnations > 0)."""
    out: dict[int, dict[int, dict[str, Any]]] = {}
    for rank in run.ranks:
        for e in _states(run, rank):
            inc = int(e.get("incarnation", 0))
            if inc > 0:
                out.setdefault(inc, {}).setdefault(rank, e)
    return out


def _key_steps(first: Mapping[str, Mapping[str, str]], component: str,
               history: Mapping[int, Mapping[str, Mapping[str, str]]]) -> dict[str, list[int]]:
    """Per key of ``component``, the reference steps whose value of that key it equals."""
    keys = first.get(component, {})
    return {k: sorted(s for s, ref in history.items() if ref.get(component, {}).get(k) == v) for k, v in keys.items()}


def _at(steps: list[int]) -> str:
    return "no step" if not steps else (f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}..{steps[-1]}"
                                        if steps == list(range(steps[0], steps[-1] + 1)) else
                                        "steps " + ", ".join(map(str, steps[:6])) + ("…" if len(steps) > 6 else ""))


def _restart_causes(inc: int, rank: int, point: ResumePoint, first: Mapping[str, Mapping[str, str]],
                    history: Mapping[int, Mapping[str, Mapping[str, str]]]) -> list[tuple[str, str]]:
    """(code, evidence) of one rank's first state after restart ``inc``."""
    eq, who = point.equal_at, f"rank {rank}"
    start = min(history, default=0)
    if point.step is None:
        anchor = next((c for c in ("model", "optimizer") if c in eq), None)
        if anchor is None:
            return [("unexplained", f"{who}: no model or optimizer fingerprinted to place restart {inc}'s state")]
        keys = _key_steps(first, anchor, history)
        near = max((s for ss in keys.values() for s in ss), default=None)
        return [("corrupt-restore", f"{who}: {anchor} equals no step of the reference after restart {inc}"
                 + (f" ({sum(1 for ss in keys.values() if not ss)} of its {len(keys)} keys equal no step; the others "
                    f"equal step {near})" if near is not None else ""))]
    k = point.step
    out: list[Any] = []
    if point.exact:
        return out
    for comp, steps in eq.items():
        if comp in IGNORED or k in steps:
            continue
        keys = _key_steps(first, comp, history)
        nowhere = sorted(key for key, s in keys.items() if not s)
        if comp in TENSOR_STATE and nowhere and len(nowhere) < len(keys) \
                and all(k in s for key, s in keys.items() if key not in nowhere):
            # the rest of the component came back from step k: a few values changed, not a part left behind
            out.append(("corrupt-restore", f"{who}: {comp}/{nowhere[0]}" + (f" and {len(nowhere) - 1} more keys"
                        if len(nowhere) > 1 else "") + f" equal no step of the reference while the other "
                        f"{len(keys) - len(nowhere)} keys of {comp} equal step {k}"))
            continue
        text = f"{who}: model equals step {k}, {comp} equals {_at(steps)}"
        moved_keys = [key for key, s in keys.items() if k not in s]
        same_keys = set(keys) == set(history.get(k, {}).get(comp, {}))  # a fresh optimizer has no state.* keys
        if comp == "optimizer" and same_keys and moved_keys and all(key.startswith("param_groups")
                                                                    for key in moved_keys):
            # only the learning rate and its kin moved: the scheduler wrote them (its own cause names it)
            if "scheduler" not in eq or k in eq["scheduler"]:
                out.append(("unexplained", f"{text}: only its param_groups ({moved_keys[0]}) differ"))
            continue
        if comp in ("optimizer",) and steps and start not in steps:
            out.append(("torn-checkpoint", text))
        elif comp == "optimizer":
            out.append(("optimizer-not-restored", text))
        elif comp == "scheduler":
            ahead = [s for s in steps if s > k]
            out.append(("scheduler-stepped-after-load" if ahead and not (start in steps and k > start)
                        else "scheduler-not-restored" if not steps or start in steps else "torn-checkpoint", text))
        elif comp == "rng":
            moved = {key: s for key, s in keys.items() if k not in s}
            if not moved:  # the same values, other keys: a generator one side has and the other not
                out.append(("unexplained", f"{text}: its keys differ from the reference's"))
                continue
            detail = "; ".join(f"rng/{key} equals {_at(s)}" for key, s in moved.items())
            if any(start in s and k > start for s in moved.values()):
                out.append(("rng-not-restored", f"{who}: model equals step {k}, {detail}"))
            elif any(moved.values()):  # the RNG of another save: the checkpoint's files are of two steps
                out.append(("torn-checkpoint", f"{who}: model equals step {k}, {detail}"))
            else:
                out.append(("rng-drawn-after-restore", f"{who}: model equals step {k}, {detail}"))
        elif comp == "data":
            out.append(("data-position-not-restored", text))
        elif comp == "scaler":
            out.append(("scaler-not-restored", text))
        else:
            out.append(("unexplained", text))
    rng = next((i for i, (code, _) in enumerate(out) if code.startswith("rng-")), None)
    data = next((i for i, (code, ev) in enumerate(out) if code == "data-position-not-restored"
                 and ev.endswith("data equals no step")), None)
    if rng is not None and data is not None:  # an order drawn from that RNG: a consequence, not a cause of its own
        code, ev = out[rng]
        out[rng] = (code, ev + "; so data (its order is drawn from it) equals no step")
        del out[data]
    return out


def _history(reference: Journal, rank: int) -> dict[int, dict[str, dict[str, str]]]:
    return {int(e["step"]): e["digests"] for e in _states(reference, rank)}


def _usable(digests: Any) -> bool:
    return isinstance(digests, dict) and all(isinstance(v, dict) for v in digests.values())


def diverged_before_restart(reference: Journal, run: Journal) -> tuple[int, int] | None:
    """(rank, step) of the first state the run's first processes (incarnation 0) wrote that differs from the
    reference's: the run had diverged before any restart, so no restore is to blame."""
    for rank in sorted(run.ranks):
        history = _history(reference, rank)
        for e in _states(run, rank):
            if e.get("incarnation", 0) == 0 and int(e["step"]) in history and _usable(e["digests"]) \
                    and {c: dict(v) for c, v in e["digests"].items()} != {c: dict(v) for c, v in
                                                                          history[int(e["step"])].items()}:
                return rank, int(e["step"])
    return None


def diagnose(reference: Journal, run: Journal, cmp: Comparison, *, failed: bool, reproducible: bool | None,
             recoveries: list[Any]) -> list[Cause]:
    """The likely causes of a failed resume (``failed``: a record differs or work was lost beyond the
    expectation), each with its evidence; none when it did not fail. ``reproducible``: whether two
    uninterrupted runs agreed (None: not checked). A restart after one already diagnosed, or after the run had
    diverged, is not diagnosed again: its state descends from the first cause."""
    if not failed:
        return []
    found: dict[tuple[str, int | None], list[str]] = {}

    def add(code: str, evidence: str, inc: int | None) -> None:
        found.setdefault((code, inc), []).append(evidence)

    first = cmp.first
    early = diverged_before_restart(reference, run)
    if early is not None:
        rank, step = early
        where = f"rank {rank}'s state at step {step} differs from the reference's before any restart"
        add("nondeterministic-job" if reproducible is False else "unexplained",
            where + ("; two uninterrupted runs differ too" if reproducible is False else
                     ": not a resume's doing (a fault that changed the computation, or non-determinism)"), None)
        return [cause(code, sorted(set(ev)), inc) for (code, inc), ev in found.items()]
    exact_at: dict[int, dict[int, int]] = {}  # incarnation -> rank -> the step it resumed from exactly
    skipped = 0
    histories: dict[int, dict[int, dict[str, dict[str, str]]]] = {}
    for inc, firsts in sorted(first_states(run).items()):
        if found:
            break  # a later restart descends from the state the first cause left
        for rank, event in sorted(firsts.items()):
            history = histories.setdefault(rank, _history(reference, rank))
            world = event.get("world") or event.get("world_size")
            resized = (world and int(world) != reference.world_size) or event.get("resized")
            if resized or not history or not _usable(event["digests"]):
                skipped += 1  # another world size, now or since a node left (an elastic restart): the loss curve judges it
                continue
            point = locate(event["digests"], history)
            for code, evidence in _restart_causes(inc, rank, point, event["digests"], history):
                add(code, evidence, inc)
            if point.exact and point.step is not None:
                exact_at.setdefault(inc, {})[rank] = point.step
    if first is not None and first.component != "loss" and not found and exact_at:
        # every rank resumed where all its components equal the reference: the divergence comes later
        partial = {(p.rank, p.step) for p in cmp.partial}
        resumed = sorted({s for ranks in exact_at.values() for s in ranks.values()})
        if any((r, s) in partial for r, s in ((first.rank, first.step - 1), (first.rank, first.step))):
            add("accumulated-gradient-lost", f"rank {first.rank} resumed mid-step {first.step - 1}; the state after "
                f"it differs first in {first.component} / {first.key}", None)
        elif first.step >= min(resumed):
            where = f"every component equal at step {', '.join(map(str, resumed))}; first divergence at step " \
                    f"{first.step}, {first.component} / {first.key} (rank {first.rank})"
            if reproducible is False:
                add("nondeterministic-job", where + "; two uninterrupted runs differ too", None)
            else:
                add("state-outside-fingerprints", where + ("; two uninterrupted runs agree" if reproducible
                                                           else "; no reproducibility check was run"), None)
    older = _older_checkpoint(run, recoveries)
    if older:
        add("older-checkpoint-restored", older, None)
    if not found:
        checked = "every restored state the diagnosis could compare matched the reference" + (
            f" ({skipped} at another world size or unfingerprinted, not compared)" if skipped else "")
        add("unexplained", (f"first divergence at step {first.step}, {first.component} / {first.key} (rank "
                            f"{first.rank}); " if first is not None else "") + checked, None)
    return [cause(code, sorted(set(ev)), inc) for (code, inc), ev in found.items()]


def _older_checkpoint(run: Journal, recoveries: list[Any]) -> str | None:
    """Evidence that a recovery restored an older checkpoint than the newest committed before its fault."""
    for rec in recoveries:
        inc = rec.fault.get("incarnation") if isinstance(rec.fault, dict) else None
        if inc is None or rec.recovery_seconds is None:
            continue  # journaled by the launcher, or never recovered: no restore to judge
        # committed by the processes that ran until the fault (those of its incarnation died with it)
        committed = [int(e["step"]) for e in run.events("checkpoint_saved")
                     if e.get("tier") == "persistent" and e["incarnation"] <= inc and isinstance(e.get("step"), int)]
        rejected = {e.get("step") for e in run.events("checkpoint_rejected") if e.get("tier") == "persistent"}
        newest = max((s for s in committed if s not in rejected), default=None)  # a rejected one was rightly passed over
        if newest is not None and rec.restored_step < newest:
            tier = rec.restored_tier or "nothing (a start from scratch)"
            return (f"fault at step {rec.progress_before}: step {newest} was committed to the persistent tier before "
                    f"it, the restore took step {rec.restored_step} from {tier}")
    return None
