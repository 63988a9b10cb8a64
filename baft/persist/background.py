"""One background thread with at most one job in flight (persisting checkpoints).

A new job waits for the previous one, so background writes never pile up and
a failure of one surfaces at the next submit, drain or close instead of being
lost.

The thread is a daemon: a process that dies of an exception (a peer lost in the
middle of a step) leaves at once, whatever its persist in flight waits for. A
persist's last steps are collectives with every rank; once a peer is gone such a
job can wait for the process group's timeout (30 minutes by default), and a
joined thread (``concurrent.futures``' are joined at exit) kept the failed
process, its sockets and so its node's other ranks alive that long, where
torchrun could have restarted them. An abandoned persist was never committed:
``latest`` still names the one before. ``close`` (the checkpointer's) finishes
the job in flight on the way out of a run that ended well.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


def lower_thread_priority(nice: int) -> None:
    """Raise the calling thread's nice value by ``nice`` (Linux schedules threads one by one: only
    this thread yields to the training threads; raising it needs no privilege)."""
    if nice > 0 and hasattr(os, "setpriority"):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))


class OneInFlight:
    def __init__(self, name: str, nice: int = 0) -> None:
        """``name``: the thread's; ``nice``: how much lower than the training's its CPU priority is."""
        self._name, self._nice = name, nice
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None  # started with the first job
        self._inflight: Future[Any] | None = None
        self.cpu_seconds = 0.0
        """CPU time the worker thread has spent in the jobs so far."""

    @property
    def busy(self) -> bool:
        return self._inflight is not None and not self._inflight.done()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        self.drain()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        fut: Future[Any] = Future()
        self._inflight = fut
        self._jobs.put((fut, fn, args))

    def _run(self) -> None:
        lower_thread_priority(self._nice)
        while (job := self._jobs.get()) is not None:
            fut, fn, args = job
            fut.set_running_or_notify_cancel()
            t = time.thread_time()
            try:
                result = fn(*args)
            except BaseException as e:  # noqa: BLE001 - surfaced at the next drain
                self.cpu_seconds += time.thread_time() - t
                fut.set_exception(e)
            else:
                self.cpu_seconds += time.thread_time() - t
                fut.set_result(result)

    def drain(self) -> None:
        """Wait for the job in flight; re-raise its exception if it failed."""
        if self._inflight is not None:
            fut, self._inflight = self._inflight, None
            fut.result()

    def close(self) -> None:
        """Wait for the job in flight (re-raising its exception), then end the thread."""
        try:
            self.drain()
        finally:
            if self._thread is not None:
                self._jobs.put(None)
                self._thread.join()
                self._thread = None
