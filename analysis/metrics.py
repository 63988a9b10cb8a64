"""Recovery metrics read from a faulted run's journal: lost steps and recovery time."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .journal import Journal


@dataclass(frozen=True, slots=True)
class Recovery:
    """What one fault cost.

    ``progress_before``: completed steps (the furthest any rank got) when the fault fired.
    ``restored_step``: the step the job resumed from (0 without a checkpoint).
    ``lost_steps``: steps executed twice, ``progress_before - restored_step``.
    ``recovery_seconds``: from the fault to the moment every rank completed its first
    iteration after the restore; ``None`` if the job never got that far.
    """

    fault: dict[str, Any]
    progress_before: int
    restored_step: int
    restored_tier: str | None
    lost_steps: int
    recovery_seconds: float | None
    restore_seconds: float | None
    detection_seconds: float | None = None
    """For a stall (hang, partition): from the fault to the watchdog's ``hang_detected``."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "fault": {k: v for k, v in self.fault.items() if k not in ("t",)},
            "progress_before": self.progress_before,
            "restored_step": self.restored_step,
            "restored_tier": self.restored_tier,
            "lost_steps": self.lost_steps,
            "recovery_seconds": self.recovery_seconds,
            "restore_seconds": self.restore_seconds,
            "detection_seconds": self.detection_seconds,
        }


#: Faults that stall the job rather than end a process: the watchdog detects them.
STALLS = ("hang", "partition")


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
        done = [e["step"] + 1 for e in run.events("step") if e["incarnation"] <= inc and e["t"] <= t_f]
        progress = max(done, default=0)
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
        out.append(
            Recovery(
                fault=fault,
                progress_before=progress,
                restored_step=restored,
                restored_tier="+".join(sorted({e["tier"] for e in restores})) or None,
                lost_steps=max(0, progress - restored),
                recovery_seconds=(max(first_steps) - t_f) if recovered is not None else None,
                restore_seconds=max((e["seconds"] for e in restores), default=None),
                detection_seconds=next((t - t_f for t in hangs if t >= t_f), None) if fault.get("fault") in STALLS else None,
            )
        )
    return out


def final_step(run: Journal) -> dict[int, int]:
    """Per rank, the step its ``finish`` event reports (missing ranks did not finish)."""
    return {rank: evs[-1]["step"] for rank in run.ranks if (evs := run.events("finish", rank))}


#: Events in which a window fault reports what it did, by fault ``id``.
EFFECTS = ("jitter_summary", "straggler_summary", "slow_storage_summary", "fault_effect", "link_measured")
_BOOKKEEPING = {"t", "event", "id", "rank", "attempt", "incarnation"}


def windows(run: Journal) -> list[dict[str, Any]]:
    """One entry per non-fatal fault (a window: jitter, straggler, link): where it began and
    ended and what it did, summed over ranks and restarts."""
    out: dict[Any, dict[str, Any]] = {}
    for e in run.events("fault"):
        if e.get("fatal", True) or ("from_step" not in e and "from_time" not in e):
            continue
        w = out.setdefault(e.get("id"), {"fault": e["fault"], "id": e.get("id"), "target": fault_target(e),
                                         "from_step": e.get("step"), "to_step": None, "effects": {}})
        w["from_step"] = min(w["from_step"], e.get("step", w["from_step"]))
    everything = [ev for evs in run.ranks.values() for ev in evs] + run.launcher
    for e in sorted(everything, key=lambda ev: ev["t"]):
        w = out.get(e.get("id"))
        if w is None:
            continue
        if e["event"] == "fault_rollback":
            w["to_step"] = e.get("step") if w["to_step"] is None else max(w["to_step"], e.get("step", 0))
        elif e["event"] in EFFECTS:
            for k, v in e.items():
                if k not in _BOOKKEEPING and isinstance(v, (int, float)) and not isinstance(v, bool):
                    # summaries add up over ranks and restarts; other effects are states: keep the latest
                    w["effects"][k] = round(w["effects"].get(k, 0) + v, 4) if e["event"].endswith("_summary") else v
    for w in out.values():
        w["effect"] = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in w["effects"].items()) or "no effect journaled"
    return list(out.values())


def fault_target(f: dict[str, Any]) -> str:
    """What a journaled fault hit, in words (``rank 1``, ``node 0``, ``all ranks``, ``link 0-1``)."""
    if f.get("fault") == "node_loss":  # journaled by a worker, so it also carries that worker's rank
        return f"node {f.get('node')}"
    if f.get("ranks") is not None:
        return "all ranks" if f["ranks"] == "all" else "ranks " + ",".join(map(str, f["ranks"]))
    if f.get("link") is not None:
        return "link " + "-".join(map(str, f["link"]))
    if f.get("tier") is not None:
        return f"the {f['tier']} tier"
    if f.get("rank") is not None:
        return f"rank {f['rank']}"
    return f"node {f['node']}" if f.get("node") is not None else str(f.get("tier", ""))
