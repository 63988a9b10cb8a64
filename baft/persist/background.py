"""One background thread with at most one job in flight (persisting checkpoints).

A new job waits for the previous one, so background writes never pile up and
a failure of one surfaces at the next submit, drain or close instead of being
lost.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


def lower_thread_priority(nice: int) -> None:
    """Raise the calling thread's nice value by ``nice`` (Linux schedules threads one by one: only
    this thread yields to the training threads; raising it needs no privilege)."""
    if nice > 0 and hasattr(os, "setpriority"):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))


class OneInFlight:
    def __init__(self, name: str, nice: int = 0) -> None:
        """``nice``: how much lower than the training's the worker thread's CPU priority is."""
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name,
                                        initializer=lower_thread_priority, initargs=(nice,))
        self._inflight: Future[Any] | None = None
        self.cpu_seconds = 0.0
        """CPU time the worker thread has spent in the jobs so far."""

    @property
    def busy(self) -> bool:
        return self._inflight is not None and not self._inflight.done()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        self.drain()
        self._inflight = self._pool.submit(self._timed, fn, *args)

    def _timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        t = time.thread_time()
        try:
            return fn(*args)
        finally:
            self.cpu_seconds += time.thread_time() - t

    def drain(self) -> None:
        """Wait for the job in flight; re-raise its exception if it failed."""
        if self._inflight is not None:
            fut, self._inflight = self._inflight, None
            fut.result()

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._pool.shutdown(wait=True)
