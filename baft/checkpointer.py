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

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch.distributed as dist

from . import events, persist
from .bubble import BubbleSnapshotter
from .errors import BaftConfigError, CheckpointCorrupt
from .planner import PlannerConfig
from .profiler import ProfilerConfig
from .state import COMPONENTS, TrainState

Strategy = Literal["none", "sync", "baft"]
STRATEGIES = ("none", "sync", "baft")


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """How and where a job checkpoints."""

    strategy: Strategy = "sync"
    """``none``: never; ``sync``: blocking ``torch.save`` to ``dir`` every ``every`` steps;
    ``baft``: a snapshot of every iteration into shared memory, copied inside the pipeline
    bubbles, plus a persistent checkpoint every ``every`` steps."""
    every: int = 1
    """Checkpoint after every this many completed steps."""
    dir: str = "checkpoints"
    """Directory of the persistent tier (created if missing)."""
    keep: int = 3
    """How many committed checkpoints to keep on disk."""
    shm_dir: str = ""
    """``baft``: directory of the shared-memory snapshot slots (default: under /dev/shm, derived from ``dir``)."""
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    """``baft``: idle-window measurement and drift detection."""
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    """``baft``: chunking and packing into windows."""
    omit: list[str] = field(default_factory=list)
    """Components deliberately left out of every checkpoint. A test knob that
    produces a broken checkpoint so the harness can prove it catches one."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise BaftConfigError("strategy", "one of " + ", ".join(STRATEGIES), self.strategy)
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
        self.bubbles: BubbleSnapshotter | None = None

    @property
    def shm_dir(self) -> Path:
        if self.config.shm_dir:
            return Path(self.config.shm_dir)
        tag = hashlib.blake2b(str(self.root.resolve()).encode(), digest_size=6).hexdigest()
        return Path("/dev/shm") / f"baft-{tag}"

    def attach(self, stage: Any, *, replica: int = 0, replicas: int = 1, replica_group: Any = None) -> None:
        """Give the ``baft`` strategy the pipeline stage to profile (no-op for the others).

        ``replica``/``replicas``/``replica_group``: this stage's position among its
        data-parallel replicas; each copies 1/replicas of the state.
        """
        if self.config.strategy != "baft":
            return
        rank, _ = _rank_world()
        self.bubbles = BubbleSnapshotter(
            self.state, self.shm_dir, rank=rank, replica=replica, replicas=replicas, replica_group=replica_group,
            profiler=self.config.profiler, planner=self.config.planner, omit=tuple(self.config.omit),
        )
        self.bubbles.attach(stage)

    def begin_iteration(self) -> None:
        """At the step boundary, before the iteration's first forward."""
        if self.bubbles is not None:
            self.bubbles.begin(self.state.step)

    def before_optimizer_step(self) -> None:
        """After the backward passes, before ``optimizer.step()``: the last moment this version exists."""
        if self.bubbles is not None:
            self.bubbles.seal()

    def close(self) -> None:
        if self.bubbles is not None:
            self.bubbles.close()
            self.bubbles = None

    def due(self, step: int) -> bool:
        return self.config.strategy != "none" and step > 0 and step % self.config.every == 0

    def after_step(self) -> bool:
        """Save if the current step is due; returns whether a checkpoint was written."""
        if self.bubbles is not None:
            self.bubbles.end()
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
        if self.config.strategy == "baft":
            if self.bubbles is None:
                raise BaftConfigError("strategy", "attach(stage) before restore_latest() with baft", "no stage")
            version = self.bubbles.restore()
            if version is not None:
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
