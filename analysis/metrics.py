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

    def as_dict(self) -> dict[str, Any]:
        return {
            "fault": {k: v for k, v in self.fault.items() if k not in ("t",)},
            "progress_before": self.progress_before,
            "restored_step": self.restored_step,
            "restored_tier": self.restored_tier,
            "lost_steps": self.lost_steps,
            "recovery_seconds": self.recovery_seconds,
            "restore_seconds": self.restore_seconds,
        }


def recoveries(run: Journal) -> list[Recovery]:
    """One :class:`Recovery` per fault event, in the order they fired.

    The job has recovered from a fault in the first later incarnation in which
    every rank completed a step (a restart can itself be interrupted, e.g. by a
    fault during the restore); the restore of that incarnation is the one that
    counts.
    """
    out = []
    incarnations = sorted({e["incarnation"] for e in run.events("start")})
    for fault in run.events("fault"):
        t_f, inc = fault["t"], fault["incarnation"]
        done = [e["step"] + 1 for e in run.events("step") if e["incarnation"] <= inc and e["t"] <= t_f]
        progress = max(done, default=0)
        recovered, first_steps = None, []
        for k in (i for i in incarnations if i > inc):
            firsts = []
            for rank in run.ranks:
                steps = [e for e in run.events("step", rank) if e["incarnation"] == k]
                if steps:
                    firsts.append(steps[0]["t"])
            if len(firsts) == len(run.ranks):
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
            )
        )
    return out


def final_step(run: Journal) -> dict[int, int]:
    """Per rank, the step its ``finish`` event reports (missing ranks did not finish)."""
    return {rank: evs[-1]["step"] for rank in run.ranks if (evs := run.events("finish", rank))}
