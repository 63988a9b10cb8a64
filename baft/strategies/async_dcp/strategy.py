"""``async-dcp``: ``torch.distributed.checkpoint.async_save`` every ``every`` steps.

DCP stages a copy of the state dict (through its ``DefaultStager`` with cached
buffers unless ``async_dcp.stager`` is off), then writes it in a background thread or
a checkpoint process of its own (``async_dcp.mode``) over a process group of its own
(so its collectives never interleave with training's). Rank 0 commits the directory (checksums,
manifest, ``latest``) once its save has finished, which as DCP's coordinator
means every rank's has. At most one save is in flight: the next waits.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from baft import events
from baft.mesh.collective import rank_world
from baft.mesh.control import own_group
from baft.persist import commits as persist
from baft.persist import dcpformat
from baft.state.dtensor import local_view
from baft.strategies.base import WRITE_ERRORS, Strategy, persist_failed
from baft.strategies.restore import place_map, restore_dcp

log = logging.getLogger("baft")

COMMIT_TIMEOUT = 300.0
"""Seconds a rank other than 0 waits, when it must, for rank 0 to commit a save."""


class AsyncDcpStrategy(Strategy):
    """DCP's own asynchronous checkpointing, as a baseline."""

    name = "async-dcp"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group: Any = None
        self._inflight: tuple[int, Any, float, int] | None = None  # the save's future: a Future or DCP's response
        self._stager: Any = None
        self._mode: Any = None

    def attached(self, stage: Any) -> None:
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        self.group = own_group()
        self.places = self.gather_places()
        process = self.config.async_dcp.mode == "process"
        self._mode = AsyncCheckpointerType.PROCESS if process else AsyncCheckpointerType.THREAD
        if self.config.async_dcp.stager and not stager_works():
            log.warning("baft: async-dcp: torch %s's DefaultStager fails to stage a state dict (KeyError: <class "
                        "'type'> in its deep copy; run under tox -e torch211); staging with async_save's default "
                        "copy instead", torch.__version__)
        elif self.config.async_dcp.stager:
            self._stager = dcp_stager(shared_memory=process)

    def settings(self) -> dict[str, Any]:
        """What this baseline runs with (for a benchmark's record)."""
        return {"async": self.config.async_dcp.mode, "stager": "DefaultStager" if self._stager is not None else "default copy",
                "pinned_memory": bool(self._stager is not None and torch.cuda.is_available()),
                "shared_memory": self.config.async_dcp.mode == "process" and self._stager is not None}

    def restore(self) -> int | None:
        return restore_dcp(self, self.group)

    def after_step(self) -> bool:
        self._poll(block=False)
        step = self.state.step
        if not self.due(step):
            return False
        t_due = time.perf_counter()
        self._poll(block=True)
        self._start_save(step)
        # the training thread's wait (the previous save, staging, async_save's own work); DCP's background
        # thread or process is not ours to measure: its CPU is not charged
        self.interval.charge(time.perf_counter() - t_due)
        return True

    def write_now(self, step: int) -> bool:
        self._start_save(step)
        self._poll(block=True)
        return True

    def _start_save(self, step: int) -> None:
        rank, _ = rank_world()
        t0 = time.perf_counter()
        events.emit("phase", phase="persist", step=step)
        sd = dcpformat.to_state_dict(self.state.capture(local=False), rank,
                                     self.stage_key, shard_key=self.shard_key, param_names=self.state.param_names(),
                                     process_group=self.group)
        kw: dict[str, Any] = {"async_checkpointer_type": self._mode}
        if self._stager is not None:
            kw["async_stager"] = self._stager
        fut = dcp.async_save(sd, storage_writer=dcpformat.writer(self.root, step), process_group=self.group, **kw)
        fut = getattr(fut, "upload_completion", fut)  # an AsyncSaveResponse when the stager stages in a thread
        nbytes = sum(local_view(t).numel() * t.element_size() for t in sd.values())
        self._inflight = (step, fut, t0, nbytes)

    def _poll(self, block: bool) -> None:
        if self._inflight is None:
            return
        step, fut, t0, nbytes = self._inflight
        if not block and not fut.done():
            return
        rank, world = rank_world()
        try:
            fut.result()
        except WRITE_ERRORS as e:
            self._inflight = None
            persist_failed(step, e)
            return
        # Saved only once rank 0 has committed it: rank 0 commits; the others learn it from the
        # checkpoint's directory (without a collective: ranks poll at different steps), waiting for
        # it only when they must (a drain, the next save).
        if rank == 0:
            reason = None
            try:
                dcpformat.commit(self.root, step, world, {"format": "dcp", **place_map(self.places)})
                persist.prune(self.root, self.config.keep)
            except WRITE_ERRORS as e:
                reason = f"rank 0 commit: {type(e).__name__}: {e}"
                persist.write_commit_failure(self.root, step, reason)
        else:
            decided, reason = persist.commit_outcome(self.root, step)
            if not decided:
                if not block:
                    return  # look again after the next step
                reason = persist.wait_commit(self.root, step, COMMIT_TIMEOUT)
        self._inflight = None
        if reason is not None:
            persist_failed(step, reason)
            return
        events.emit("checkpoint_saved", step=step, tier="persistent", bytes=nbytes,
                    seconds=time.perf_counter() - t0, path=str(persist.step_dir(self.root, step)))

    def drain(self) -> None:
        self._poll(block=True)

    def close(self) -> None:
        self._poll(block=True)
        if self._stager is not None:
            self._stager.close()
            self._stager = None


def stager_works() -> bool:
    """Whether this torch's ``DefaultStager`` stages a state dict: torch 2.11's deep copy raises KeyError on a
    class object it meets (seen in ``tox -e torch211``); 2.13's does not."""
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 13)


def dcp_stager(*, shared_memory: bool, async_staging: bool = True) -> Any:
    """DCP's ``DefaultStager`` at its best on this host: cached buffers, pinned memory where CUDA is
    present, shared memory when a checkpoint process reads them."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    cuda = torch.cuda.is_available()
    return DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=shared_memory,
                                        use_async_staging=async_staging, use_non_blocking_copy=cuda))


def staging_step(state: Any) -> Any:
    """``baft bench``'s snapshot-tier step of ``async-dcp`` (run after each iteration beside a ``none``
    checkpointer): DCP's synchronous staging through its ``DefaultStager`` (cached buffers; the staged copy must
    be complete before the next optimizer step, so it is waited for)."""
    stager = dcp_stager(shared_memory=False, async_staging=False)
    return lambda: stager.stage(state.capture())
