"""``sync``: every rank blocks while it writes its shard with ``torch.save``; rank 0 commits."""
from __future__ import annotations

import time

from baft import events
from baft.mesh.collective import all_gather, rank_world
from baft.persist import commits as persist
from baft.strategies.base import Strategy, commit_agreed
from baft.strategies.restore import restore_shards


class SyncStrategy(Strategy):
    """The baseline: simple, durable, and on the critical path."""

    name = "sync"

    def after_step(self) -> bool:
        if not self.due(self.state.step):
            return False
        t0 = time.perf_counter()
        try:
            self.save(self.state.step)
        finally:
            self.interval.charge(time.perf_counter() - t0)  # all of it on the training thread
        return True

    def save(self, step: int) -> None:
        rank, _ = rank_world()
        t0 = time.perf_counter()
        events.emit("phase", phase="persist", step=step)
        data = persist.serialize(self.state.capture())
        try:
            record: persist.ShardRecord | str = persist.write_shard(self.root, step, rank, data)
        except OSError as e:  # e.g. ENOSPC: this checkpoint is lost, the last good one stays
            record = f"rank {rank}: {e}"
        records = all_gather(record, self.control)
        failed = [r for r in records if isinstance(r, str)]
        if not failed:  # the same on every rank: all saw the same records

            def commit() -> None:
                persist.commit(self.root, step, sorted(records, key=lambda r: r.rank))
                persist.prune(self.root, self.config.keep)

            if (reason := commit_agreed(commit, self.control)) is not None:
                failed = [reason]
        if failed:
            events.emit("checkpoint_failed", step=step, tier="persistent", reason="; ".join(failed))
            return
        events.emit("checkpoint_saved", step=step, tier="persistent", bytes=len(data),
                    seconds=time.perf_counter() - t0, path=str(persist.step_dir(self.root, step)))

    def write_now(self, step: int) -> bool:
        self.save(step)
        return True

    def restore(self) -> int | None:
        return restore_shards(self)
