"""Recovery metrics read from a faulted run's journal: lost steps and recovery time."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from .journal import Journal
from .record import Record, known


@dataclass(frozen=True, slots=True)
class Recovery(Record):
    """What one fatal fault cost (an entry of ``recoveries`` in ``verdict.json``)."""

    fault: dict[str, Any]
    """The ``fault`` event as journaled (:mod:`analysis.journal`), without its time ``t``."""
    progress_before: int
    """Steps every rank had completed when the fault fired (the work a restore can lose is counted from here:
    one fault gives one number, however far ahead the last stage had run)."""
    restored_step: int
    """The step the job resumed from (0 without a checkpoint)."""
    restored_tier: str | None
    """The tier(s) the ranks restored from (``shm``, ``persistent``, ``a+b`` when they differ); None: none."""
    lost_steps: int
    """Steps executed twice: ``progress_before - restored_step``."""
    recovery_seconds: float | None
    """From the fault to the moment every rank completed its first iteration after the restore;
    None if the job never got that far."""
    restore_seconds: float | None
    """The slowest rank's time to load the checkpoint; None without a restore."""
    detection_seconds: float | None = None
    """For a stall (hang, partition): from the fault to the watchdog's ``hang_detected``."""
    phases: dict[str, float | None] | None = None
    """Where the time to recover went (:data:`RECOVERY_PHASES`), seconds each; None where the
    journal does not tell."""
    caught_up_seconds: float | None = None
    """From the fault until the job had again completed every step it had completed before it."""
    furthest_before: int | None = None
    """The furthest any rank had got (steps completed) when the fault fired, where a rank ran ahead of
    :attr:`progress_before` (a pipeline's last stage entering the next step); written only then."""
    resume: str | None = None
    """An unmodified script's resume, found by matching its first state against the reference
    (:mod:`analysis.resume`): ``resumed from step 10 (every component equals the reference at step 10)``,
    per rank where the ranks differ; None where baft restored (or the journal has no match)."""
    restaged: str | None = None
    """A restore into a pipeline cut into another number of stages: the counts and the state it could not
    carry (``4 -> 2 stages; not carried: rng (why)``); None otherwise."""

    def to_json(self) -> dict[str, Any]:
        """The fields; ``furthest_before`` only where a rank ran ahead (files without it read and write unchanged)."""
        out = Record.to_json(self)
        if out["furthest_before"] is None:
            del out["furthest_before"]
        return out


#: Faults that stall the job rather than end a process: the watchdog detects them.
STALLS = ("hang", "partition")

#: The phases of a recovery, in order, each ending at a journaled moment (the latest rank's):
#: ``detection``  fault -> the watchdog declares the hang (stalls only; a crash is seen at once)
#: ``restart``    -> the new worker processes exist (torchrun stops the survivors, re-rendezvous, spawns)
#: ``startup``    -> the workers begin to form the process group (interpreter and imports)
#: ``rendezvous`` -> the process group is formed (gloo's full mesh)
#: ``restore``    -> the checkpoint is loaded
#: ``first_step`` -> every rank finished its first step after the restore
#: ``catch_up``   -> the step reached before the fault is completed again (the lost work redone)
RECOVERY_PHASES = ("detection", "restart", "startup", "rendezvous", "restore", "first_step", "catch_up")


def _recovery_phases(run: Journal, t_fault: float, detection: float | None, k: int, world: int,
                     progress: int) -> tuple[dict[str, float | None], float | None]:
    """Seconds per :data:`RECOVERY_PHASES` of the recovery into incarnation ``k``; and the time to catch up."""
    def latest(values: list[float | None]) -> float | None:
        return None if not values or any(v is None for v in values) else max(values)  # type: ignore[type-var]

    found = [next((e for e in run.events("start", r) if e["incarnation"] == k), None) for r in range(world)]
    starts = [e for e in found if e is not None]
    if len(starts) < len(found):
        return {p: None for p in RECOVERY_PHASES}, None
    created = latest([e.get("created") for e in starts])
    init = latest([e["t"] - e["init_seconds"] if e.get("init_seconds") is not None else None for e in starts])
    joined = latest([e["t"] for e in starts])
    restored = latest([next((x["t"] for x in run.events("checkpoint_restored", r) if x["incarnation"] == k), e["t"])
                       for r, e in zip(range(world), starts)])
    first = latest([next((x["t"] for x in run.events("step", r) if x["incarnation"] == k), None) for r in range(world)])
    redone = latest([next((x["t"] for x in run.events("step", r) if x["incarnation"] == k and x["step"] >= progress - 1),
                          None) for r in range(world)])
    if redone is not None and first is not None:
        redone = max(redone, first)
    marks = [t_fault + detection if detection is not None else None, created, init, joined, restored, first, redone]
    phases: dict[str, float | None] = {}
    prev = t_fault
    for name, mark in zip(RECOVERY_PHASES, marks):
        if mark is None:
            phases[name] = None
            continue
        phases[name] = max(0.0, mark - prev)
        prev = max(prev, mark)
    return phases, (redone - t_fault) if redone is not None else None


def _ended_at(run: Journal, fault: dict[str, Any]) -> float:
    """When a fault's processes stopped working: at the fault, or for a preemption at its grace's end (what a
    script trains in its grace and does not save is lost work too)."""
    if fault.get("fault") == "preempt":
        key = (fault.get("id"), fault.get("occurrence", 0))
        for e in run.launcher:
            if e.get("event") == "preempt_end" and (e.get("fault"), e.get("occurrence", 0)) == key:
                return float(e["t"])
    return float(fault["t"])


def _progress_at(run: Journal, inc: int, t_fault: float) -> tuple[int, int]:
    """(the steps every rank of incarnation ``inc`` had completed, the furthest any rank had got) at a fault.

    Each rank's progress is the last step it completed in the newest incarnation up to ``inc`` in which it
    completed any (a rank's journal line may land a moment after the fault's, so no time cut here); the
    furthest is read up to the fault's time. One fault gives one number, however far ahead a pipeline's last
    stage had run."""
    last: dict[int, tuple[int, int]] = {}  # rank -> (incarnation, steps completed)
    furthest = 0
    for e in run.events("step"):
        if e["incarnation"] > inc:
            continue
        k, done = last.get(e["rank"], (-1, 0))
        if e["incarnation"] > k or (e["incarnation"] == k and e["step"] + 1 > done):
            last[e["rank"]] = (e["incarnation"], e["step"] + 1)
        if e["t"] <= t_fault:
            furthest = max(furthest, e["step"] + 1)
    ranks = {e["rank"] for e in run.events("start") if e["incarnation"] == inc} or set(last)
    every = min((last.get(r, (0, 0))[1] for r in ranks), default=0)
    return min(every, furthest), furthest


def recoveries(run: Journal) -> list[Recovery]:
    """One :class:`Recovery` per firing of a fatal fault, in the order they fired.

    Faults that do not take workers down (jitter, a straggler, a throttled link) are
    journaled with ``fatal: false`` and need no recovery.

    The job has recovered from a fault in the first later incarnation in which
    every rank completed a step (a restart can itself be interrupted, e.g. by a
    fault during the restore); the restore of that incarnation is the one that
    counts.
    """
    out = []
    incarnations = sorted({e["incarnation"] for e in run.events("start")})
    hangs = [e["t"] for e in run.launcher if e.get("event") == "hang_detected"]
    for fault in run.events("fault"):
        if not fault.get("fatal", True):
            continue
        t_f = fault["t"]
        # a fault the harness journaled (a link) belongs to the incarnation running at that moment
        inc = fault.get("incarnation", max((e["incarnation"] for e in run.events("start") if e["t"] <= t_f), default=0))
        progress, furthest = _progress_at(run, inc, _ended_at(run, fault))
        recovered, first_steps = None, []
        for k in (i for i in incarnations if i > inc):
            # the ranks of that incarnation's world (fewer after an elastic restart)
            world = max((e.get("world_size") or len(run.ranks) for e in run.events("start") if e["incarnation"] == k),
                        default=len(run.ranks))
            firsts = []
            for rank in range(world):
                steps = [e for e in run.events("step", rank) if e["incarnation"] == k]
                if steps:
                    firsts.append(steps[0]["t"])
            if len(firsts) == world:
                recovered, first_steps = k, firsts
                break
        restores = [e for e in run.events("checkpoint_restored") if e["incarnation"] == recovered]
        restored = min((e["step"] for e in restores), default=0)
        points = [] if restores else [e for e in run.events("resume_point") if e["incarnation"] == recovered]
        if points:
            restored = min((e["step"] for e in points if e["step"] is not None), default=0)
        detection = next((t - t_f for t in hangs if t >= t_f), None) if fault.get("fault") in STALLS else None
        phases, caught_up = (_recovery_phases(run, t_f, detection, recovered, world, furthest) if recovered is not None
                             else (None, None))
        out.append(
            Recovery(
                fault={k: v for k, v in fault.items() if k != "t"},
                progress_before=progress,
                restored_step=restored,
                restored_tier="+".join(sorted({e["tier"] for e in restores})) or ("script" if points else None),
                lost_steps=max(0, progress - restored),
                recovery_seconds=(max(first_steps) - t_f) if recovered is not None else None,
                restore_seconds=max((e["seconds"] for e in restores), default=None),
                detection_seconds=detection,
                phases=phases,
                caught_up_seconds=caught_up,
                furthest_before=furthest if furthest > progress else None,
                resume=describe_resume(points) if points else None,
                restaged=_restaged(restores),
            )
        )
    return out


def _restaged(restores: list[dict[str, Any]]) -> str | None:
    """What the restores into another stage count say of it (:attr:`Recovery.restaged`)."""
    e = next((e for e in restores if e.get("restaged_from") is not None), None)
    if e is None:
        return None
    missing = sorted({c for r in restores for c in r.get("not_carried") or []})
    said = f"not carried: {', '.join(missing)}" + (f" ({e['why']})" if e.get("why") else "") if missing else "all carried"
    return f"{e['restaged_from']} -> {e.get('stages', '?')} stages; {said}"


def final_step(run: Journal) -> dict[int, int]:
    """Per rank, the step its ``finish`` event reports (missing ranks did not finish)."""
    return {rank: evs[-1]["step"] for rank in run.ranks if (evs := run.events("finish", rank))}


#: Events in which a window fault reports what it did, by fault ``id``.
EFFECTS = ("jitter_summary", "straggler_summary", "slow_storage_summary", "fault_effect", "link_measured")
#: Fields of every event that say where it came from, not what a fault did (``incarnation`` and
#: ``world`` are stamped on by the journal's reader).
_BOOKKEEPING = {"t", "event", "id", "rank", "attempt", "incarnation", "world", "resized"}


@dataclass(kw_only=True, slots=True)
class Window(Record):
    """A non-fatal fault (jitter, straggler, a throttled link): where it was active and what it did."""

    fault: str
    """The fault's kind."""
    id: int | None
    """Its index in the scenario's ``faults``."""
    target: str
    """What it hit, in words (:func:`fault_target`)."""
    from_step: int | None
    """The first step it was active in."""
    to_step: int | None
    """The step it was rolled back at (None: active to the end)."""
    effects: dict[str, float] = field(default_factory=dict)
    """The numbers its events journaled (:data:`EFFECTS`): summaries summed over ranks and restarts,
    states the latest."""
    effect: str = "no effect journaled"
    """The effects in words."""


def windows(run: Journal) -> list[Window]:
    """One :class:`Window` per non-fatal fault that has a start, summed over ranks and restarts."""
    out: dict[Any, Window] = {}
    for e in run.events("fault"):
        if e.get("fatal", True) or ("from_step" not in e and "from_time" not in e):
            continue
        w = out.setdefault(e.get("id"), Window(fault=e["fault"], id=e.get("id"), target=fault_target(e),
                                               from_step=e.get("step"), to_step=None))
        w.from_step = min(w.from_step, e.get("step", w.from_step))  # type: ignore[type-var]
    everything = [ev for evs in run.ranks.values() for ev in evs] + run.launcher
    for e in sorted(everything, key=lambda ev: ev["t"]):
        found = out.get(e.get("id"))
        if found is None:
            continue
        if e["event"] == "fault_rollback":
            found.to_step = e.get("step") if found.to_step is None else max(found.to_step, e.get("step", 0))
        elif e["event"] in EFFECTS:
            for k, v in e.items():
                if k not in _BOOKKEEPING and isinstance(v, (int, float)) and not isinstance(v, bool):
                    # summaries add up over ranks and restarts; other effects are states: keep the latest
                    found.effects[k] = round(found.effects.get(k, 0) + v, 4) if e["event"].endswith("_summary") else v
    for w in out.values():
        w.effect = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in w.effects.items()) or "no effect journaled"
    return list(out.values())


def fault_target(f: dict[str, Any]) -> str:
    """What a journaled fault hit, in words (``rank 1``, ``node 0``, ``all ranks``, ``link 0-1``)."""
    if f.get("fault") in ("node_loss", "preempt", "node_join") and f.get("node") is not None:
        return f"node {f.get('node')}"  # journaled by a worker, so it also carries that worker's rank
    if f.get("fault") in ("kill", "crash", "hang") and f.get("rank") is not None:
        return f"rank {f['rank']}"  # its event also carries the phase event's fields (a restore's tier)
    if f.get("ranks") is not None:
        if f["ranks"] == "all":
            return "all ranks"
        return ("rank " if len(f["ranks"]) == 1 else "ranks ") + ",".join(map(str, f["ranks"]))
    if f.get("link") is not None:
        return "link " + "-".join(map(str, f["link"]))
    if f.get("tier") is not None:
        return f"the {f['tier']} tier"
    if f.get("rank") is not None:
        return f"rank {f['rank']}"
    return f"node {f['node']}" if f.get("node") is not None else str(f.get("tier", ""))


def _wall(journal: Journal) -> float | None:
    """Seconds from the first worker start to the last ``finish``."""
    starts, ends = journal.events("start"), journal.events("finish")
    return (ends[-1]["t"] - starts[0]["t"]) if starts and ends else None


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


@dataclass(kw_only=True, slots=True)
class Paired(Record):
    """One measure of both runs."""

    reference: float | None
    """The reference's (None: its journal does not tell)."""
    faulted: float | None
    """The faulted run's (None: its journal does not tell)."""


@dataclass(kw_only=True, slots=True)
class CheckpointCost(Record):
    """What checkpointing cost the faulted run."""

    persistent_saved: int
    """Persistent checkpoints written."""
    persistent_mean_seconds: float | None
    """Their mean write time (None: none written)."""
    snapshot_stall_ms_per_iteration: float | None
    """baft's snapshot stall on the training thread, per executed iteration (None: no snapshots)."""
    snapshots: int
    """baft snapshots taken (every rank's)."""


@dataclass(kw_only=True, slots=True)
class BubbleUse(Record):
    """One rank's pipeline bubbles and baft's copy inside them, means per iteration."""

    utilisation: float
    """The share of the idle time the copy used."""
    in_window_fraction: float
    """The share of the copied bytes copied inside idle windows."""
    idle_ms: float
    """Idle milliseconds per iteration."""


@dataclass(kw_only=True, slots=True)
class Efficiency(Record):
    """What the faults and the checkpointing cost the run as a whole (``metrics`` in ``verdict.json``)."""

    wall_seconds: Paired
    """From the first worker start to the last ``finish``."""
    goodput_steps_per_second: Paired
    """Useful steps per wall second (steps redone after a restore are not useful)."""
    goodput_ratio: float | None
    """The faulted run's goodput over the reference's."""
    iteration_seconds: Paired
    """Median iteration time (every rank's records, steps of fault windows included)."""
    iteration_overhead: float | None
    """Faulted over reference median iteration time, minus 1."""
    checkpoint: CheckpointCost
    """Persistent checkpoints and baft's snapshot stall."""
    bubbles: dict[str, BubbleUse]
    """Per rank (as a string), the bubbles and baft's use of them."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Efficiency:
        return cls(**{**known(cls, data), **{k: Paired.from_json(data[k]) for k in
                                             ("wall_seconds", "goodput_steps_per_second", "iteration_seconds")},
                      "checkpoint": CheckpointCost.from_json(data["checkpoint"]),
                      "bubbles": {r: BubbleUse.from_json(b) for r, b in data["bubbles"].items()}})


def efficiency(reference: Journal, run: Journal, steps: int) -> Efficiency:
    """What the faults and the checkpointing cost the run as a whole (:class:`Efficiency`)."""
    wall_ref, wall_run = _wall(reference), _wall(run)
    good_ref = steps / wall_ref if wall_ref else None
    good_run = steps / wall_run if wall_run else None
    it_ref = _median([e["seconds"] for e in reference.events("step") if e.get("seconds") is not None])
    it_run = _median([e["seconds"] for e in run.events("step") if e.get("seconds") is not None])
    saved = {e["step"]: e for e in run.events("checkpoint_saved") if e.get("tier") == "persistent"}
    snaps = run.events("snapshot")
    executed = len(run.events("step"))
    bubbles: dict[str, BubbleUse] = {}
    for rank in sorted(run.ranks):
        evs = run.events("bubbles", rank)
        if evs:
            bubbles[str(rank)] = BubbleUse(
                utilisation=sum(e["utilisation"] for e in evs) / len(evs),
                in_window_fraction=sum(e["in_window_fraction"] for e in evs) / len(evs),
                idle_ms=1e3 * sum(e["idle_seconds"] for e in evs) / len(evs),
            )
    return Efficiency(
        wall_seconds=Paired(reference=wall_ref, faulted=wall_run),
        goodput_steps_per_second=Paired(reference=good_ref, faulted=good_run),
        goodput_ratio=(good_run / good_ref) if good_ref and good_run else None,
        iteration_seconds=Paired(reference=it_ref, faulted=it_run),
        iteration_overhead=(it_run / it_ref - 1) if it_ref and it_run else None,
        checkpoint=CheckpointCost(
            persistent_saved=len(saved),
            persistent_mean_seconds=(sum(e["seconds"] for e in saved.values()) / len(saved)) if saved else None,
            snapshot_stall_ms_per_iteration=(1e3 * sum(e.get("stall_seconds", 0.0) for e in snaps) / executed)
            if snaps and executed else None,
            snapshots=len(snaps),
        ),
        bubbles=bubbles,
    )


def describe_resume(points: list[dict[str, Any]]) -> str:
    """The ``resume_point`` events of one incarnation (one per rank) in words."""
    def one(e: dict[str, Any]) -> str:
        if e["step"] is None:
            return str(e["description"])
        if e["exact"]:
            return f"resumed from step {e['step']} ({e['description']})"
        text = e["description"]
        return f"resumed at step {e['step']}, {text}" if text.startswith("torn: ") else f"resumed at step {e['step']}: {text}"
    texts = {e["rank"]: one(e) for e in sorted(points, key=lambda e: e["rank"])}
    if len(set(texts.values())) == 1:
        return next(iter(texts.values()))
    return "; ".join(f"rank {r}: {t}" for r, t in texts.items())
