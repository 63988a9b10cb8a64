"""``checkfreq``: copy the state to memory at the step boundary, persist it in the background.

After CheckFreq (FAST'21): the snapshot (a copy of every tensor into buffers
allocated once) blocks training only for the copy; serialising and writing the
shard, fsync included, runs in a background thread pipelined with the next
iterations. At most one persist is in flight: a snapshot that comes due while
the last one is still being written waits for it. The commit needs no
collective: each rank publishes its shard's record as a file and rank 0's
thread commits when all are there.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from baft import events
from baft.mesh.collective import rank_world
from baft.persist import commits as persist
from baft.persist.background import OneInFlight
from baft.strategies.base import WRITE_ERRORS, Strategy, persist_failed
from baft.strategies.restore import restore_shards

COMMIT_TIMEOUT = 300.0


def copy_into(tree: Any, buffers: Any) -> Any:
    """A copy of ``tree`` whose tensors live in ``buffers`` (same structure) when shapes match."""
    if isinstance(tree, torch.Tensor):
        if isinstance(buffers, torch.Tensor) and buffers.shape == tree.shape and buffers.dtype == tree.dtype:
            return buffers.copy_(tree)
        return tree.detach().clone()
    if isinstance(tree, dict):
        found = buffers if isinstance(buffers, dict) else {}
        return {k: copy_into(v, found.get(k)) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        parts = buffers if isinstance(buffers, (list, tuple)) and len(buffers) == len(tree) else [None] * len(tree)
        out = [copy_into(v, bb) for v, bb in zip(tree, parts)]
        return out if isinstance(tree, list) else tuple(out)
    return tree


class CheckFreqStrategy(Strategy):
    """Snapshot then persist, the persist overlapped with training."""

    name = "checkfreq"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._writer = OneInFlight("checkfreq-persist", self.config.persist_nice)
        self._buffers: Any = None
        self.interval.background = lambda: self._writer.cpu_seconds

    def restore(self) -> int | None:
        return restore_shards(self)

    def after_step(self) -> bool:
        step = self.state.step
        if not self.due(step):
            return False
        t = time.perf_counter()
        self._writer.drain()  # one persist in flight at most; the buffers are reused
        t0 = time.perf_counter()
        snapshot = copy_into(self.state.capture(), self._buffers)
        snap_seconds = time.perf_counter() - t0
        self.interval.charge(time.perf_counter() - t)
        self._buffers = snapshot
        self._writer.submit(self._persist, step, snapshot, t0, snap_seconds)
        return True

    def _persist(self, step: int, snapshot: Any, t0: float, snap_seconds: float) -> None:
        rank, world = rank_world()
        events.emit("phase", phase="persist", step=step)
        data = persist.serialize(snapshot)
        try:
            record = persist.write_shard(self.root, step, rank, data)
            persist.write_record(self.root, step, record)
        except OSError as e:  # e.g. ENOSPC: this checkpoint is lost, the last good one stays
            persist.write_failure(self.root, step, rank, str(e))
            events.emit("checkpoint_failed", step=step, tier="persistent", reason=f"rank {rank}: {e}")
            return
        # Saved only once rank 0 has committed it: rank 0 commits, every other rank waits to see that
        # (or rank 0's word that it could not), through the checkpoint's directory, without a collective.
        if rank == 0:
            reason = self._commit(step, world)
            if reason is not None:
                persist.write_commit_failure(self.root, step, reason)
        else:
            reason = persist.wait_commit(self.root, step, COMMIT_TIMEOUT)
        if reason is not None:
            persist_failed(step, reason)
            return
        events.emit("checkpoint_saved", step=step, tier="persistent", bytes=len(data),
                    seconds=time.perf_counter() - t0, snapshot_seconds=snap_seconds,
                    path=str(persist.step_dir(self.root, step)))

    def _commit(self, step: int, world: int) -> str | None:
        """Rank 0: commit ``step`` once every rank's shard is there; None, or why it could not."""
        records = persist.wait_records(self.root, step, world, COMMIT_TIMEOUT)
        if records is None:
            return f"not every rank's shard of step {step} arrived within {COMMIT_TIMEOUT:.0f} s (or one failed)"
        try:
            persist.commit(self.root, step, records)
            persist.prune(self.root, self.config.keep)
        except WRITE_ERRORS as e:
            return f"rank 0 commit: {type(e).__name__}: {e}"
        return None

    def drain(self) -> None:
        self._writer.drain()

    def write_now(self, step: int) -> bool:
        self._persist(step, self.state.capture(), time.perf_counter(), 0.0)  # on the training thread
        return True

    def close(self) -> None:
        self._writer.close()


def snapshot_step(state: Any) -> Any:
    """``baft bench``'s snapshot-tier step of ``checkfreq`` (run after each iteration beside a ``none``
    checkpointer): CheckFreq's copy into buffers allocated once."""
    held: dict[str, Any] = {"buffers": None}

    def step() -> None:
        held["buffers"] = copy_into(state.capture(), held["buffers"])

    return step
