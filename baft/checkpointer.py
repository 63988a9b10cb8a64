"""The small public API a training loop calls: save when due, restore on start.

    ckpt = Checkpointer(CheckpointConfig(strategy="sync", every=5, dir="ckpt"), state)
    start = ckpt.restore_latest()          # every rank, collectively
    for step in range(start, steps):
        train_one_iteration()
        state.step = step + 1
        ckpt.after_step()                  # saves when step % every == 0

Every rank calls both methods collectively (they use ``torch.distributed``
when it is initialised, and work single-process otherwise). Restoring agrees
on the newest checkpoint that every rank can verify, so one damaged shard
makes the whole job fall back together instead of mixing versions.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch.distributed as dist

from . import events, persist
from .errors import BaftConfigError, CheckpointCorrupt
from .state import COMPONENTS, TrainState

Strategy = Literal["none", "sync"]


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """How and where a job checkpoints."""

    strategy: Strategy = "sync"
    """``none``: never; ``sync``: blocking ``torch.save`` to ``dir`` every ``every`` steps."""
    every: int = 1
    """Checkpoint after every this many completed steps."""
    dir: str = "checkpoints"
    """Directory of the persistent tier (created if missing)."""
    keep: int = 3
    """How many committed checkpoints to keep on disk."""
    omit: list[str] = field(default_factory=list)
    """Components deliberately left out of every checkpoint. A test knob that
    produces a broken checkpoint so the harness can prove it catches one."""

    def __post_init__(self) -> None:
        if self.strategy not in ("none", "sync"):
            raise BaftConfigError("strategy", "one of none, sync", self.strategy)
        if not isinstance(self.every, int) or self.every < 1:
            raise BaftConfigError("every", "an integer >= 1", self.every)
        if not isinstance(self.keep, int) or self.keep < 1:
            raise BaftConfigError("keep", "an integer >= 1", self.keep)
        for name in self.omit:
            if name not in COMPONENTS or name in ("model", "step"):
                raise BaftConfigError("omit", f"components among {', '.join(c for c in COMPONENTS if c not in ('model', 'step'))}", name)


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Checkpointer:
    """Saves and restores one rank's :class:`TrainState` according to a config."""

    def __init__(self, config: CheckpointConfig, state: TrainState) -> None:
        self.config = config
        self.state = state
        self.root = Path(config.dir)

    def due(self, step: int) -> bool:
        return self.config.strategy != "none" and step > 0 and step % self.config.every == 0

    def after_step(self) -> bool:
        """Save if the current step is due; returns whether a checkpoint was written."""
        step = self.state.step
        if not self.due(step):
            return False
        self.save(step)
        return True

    def save(self, step: int) -> None:
        rank, world = _rank_world()
        t0 = time.perf_counter()
        data = persist.serialize(self.state.capture(omit=tuple(self.config.omit)))
        record = persist.write_shard(self.root, step, rank, data)
        records = [record]
        if world > 1:
            gathered: list[persist.ShardRecord | None] = [None] * world
            dist.all_gather_object(gathered, record)
            records = [r for r in gathered if r is not None]
        if rank == 0:
            persist.commit(self.root, step, sorted(records, key=lambda r: r.rank), {"omit": list(self.config.omit)})
            persist.prune(self.root, self.config.keep)
        events.emit(
            "checkpoint_saved",
            step=step,
            tier="persistent",
            bytes=len(data),
            seconds=time.perf_counter() - t0,
            path=str(persist.step_dir(self.root, step)),
        )

    def restore_latest(self) -> int:
        """Restore the newest checkpoint valid on every rank; returns the step to resume at.

        Without any usable checkpoint the state is left as it is and its current
        step (0 for a fresh job) is returned.
        """
        if self.config.strategy == "none":
            return self.state.step
        rank, world = _rank_world()
        t0 = time.perf_counter()
        candidates = persist.committed_steps(self.root)
        verified: dict[int, bytes] = {}
        bad: set[int] = set()

        def verify(step: int) -> bool:
            if step in verified:
                return True
            if step in bad:
                return False
            try:
                verified[step] = persist.read_shard(self.root, step, rank, world)
                return True
            except (CheckpointCorrupt, OSError, KeyError, ValueError) as e:
                bad.add(step)
                events.emit("checkpoint_rejected", step=step, tier="persistent", reason=str(e))
                return False

        upper = candidates[0] if candidates else -1
        chosen = -1
        while upper >= 0:
            mine = next((s for s in candidates if s <= upper and verify(s)), -1)
            agreed = _all_min(mine)
            if agreed == -1 or _all_min(int(verify(agreed))) == 1:
                chosen = agreed
                break
            upper = agreed - 1
        if chosen == -1:
            return self.state.step
        self.state.restore(persist.deserialize(verified[chosen]))
        events.emit(
            "checkpoint_restored",
            step=chosen,
            tier="persistent",
            seconds=time.perf_counter() - t0,
            path=str(persist.step_dir(self.root, chosen)),
        )
        return self.state.step


def _all_min(value: int) -> int:
    """The minimum of ``value`` over all ranks (the value itself when single-process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    everyone: list[int | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return min(int(x) for x in everyone if x is not None)
