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
    """One :class:`Recovery` per fault event, in the order they fired."""
    out = []
    for fault in run.events("fault"):
        t_f, inc = fault["t"], fault["incarnation"]
        done = [e["step"] + 1 for e in run.events("step") if e["incarnation"] <= inc and e["t"] <= t_f]
        progress = max(done, default=0)
        after = inc + 1
        restores = [e for e in run.events("checkpoint_restored") if e["incarnation"] == after]
        restored = min((e["step"] for e in restores), default=0)
        first_steps = []
        for rank in run.ranks:
            steps = [e for e in run.events("step", rank) if e["incarnation"] == after]
            if steps:
                first_steps.append(steps[0]["t"])
        complete = len(first_steps) == len(run.ranks) and first_steps
        out.append(
            Recovery(
                fault=fault,
                progress_before=progress,
                restored_step=restored,
                restored_tier=restores[0]["tier"] if restores else None,
                lost_steps=max(0, progress - restored),
                recovery_seconds=(max(first_steps) - t_f) if complete else None,
                restore_seconds=max((e["seconds"] for e in restores), default=None),
            )
        )
    return out


def final_step(run: Journal) -> dict[int, int]:
    """Per rank, the step its ``finish`` event reports (missing ranks did not finish)."""
    return {rank: evs[-1]["step"] for rank in run.ranks if (evs := run.events("finish", rank))}
