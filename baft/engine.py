"""The background copier: copies planned chunks only while the training thread waits.

The training thread announces each pipeline wait (through the profiler's wait
listeners); the copier thread copies one chunk at a time while a wait is in
progress and sleeps otherwise, so the copy fills the bubbles and stays out of
compute. A chunk is small (1 MiB by default, ~0.1 ms), so a copy that overruns
the end of a wait delays compute by at most that much. ``torch`` copies release
the GIL, so the copy runs in parallel with the waiting thread.

Measured here: a copier at SCHED_IDLE priority was starved; normal priority works.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class CopyJob:
    """Copy ``src`` (a uint8 view) into ``dst`` (a uint8 view of shared memory)."""

    index: int
    src: torch.Tensor
    dst: torch.Tensor


@dataclass(slots=True)
class CopyStats:
    """What one snapshot's copy did."""

    window_bytes: int = 0
    window_seconds: float = 0.0
    stall_bytes: int = 0
    stall_seconds: float = 0.0
    chunks_by_window: dict[int, int] = field(default_factory=dict)

    @property
    def bandwidth(self) -> float:
        secs = self.window_seconds + self.stall_seconds
        return (self.window_bytes + self.stall_bytes) / secs if secs > 0 else 0.0


class CopyEngine:
    """One copier thread per process, fed a queue of jobs per snapshot."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque[CopyJob] = deque()
        self._idle = False
        self._window = -1
        self._busy = False
        self._closed = False
        self.stats = CopyStats()
        self._thread = threading.Thread(target=self._run, name="baft-copier", daemon=True)
        self._thread.start()

    # Called by the training thread -------------------------------------------------------
    def on_wait(self, entering: bool, window: int) -> None:
        """Profiler wait listener: open the gate while the training thread waits."""
        with self._cond:
            self._idle = entering
            self._window = window
            if entering and self._queue:
                self._cond.notify()

    def start(self, jobs: list[CopyJob]) -> None:
        with self._cond:
            self._queue = deque(jobs)
            self.stats = CopyStats()
            if self._idle and self._queue:
                self._cond.notify()

    def finish(self) -> tuple[list[CopyJob], CopyStats]:
        """Stop copying; returns the jobs not yet done (after any in-flight chunk) and the stats."""
        with self._cond:
            while self._busy:
                self._cond.wait()
            left = list(self._queue)
            self._queue.clear()
            return left, self.stats

    def run_now(self, jobs: list[CopyJob]) -> None:
        """Copy ``jobs`` in the calling thread (the stall), counted as stall time."""
        t = time.perf_counter()
        n = 0
        for job in jobs:
            job.dst.copy_(job.src)
            n += job.src.numel()
        self.stats.stall_bytes += n
        self.stats.stall_seconds += time.perf_counter() - t

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        self._thread.join(timeout=5)

    # The copier thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not (self._idle and self._queue):
                    self._cond.wait()
                if self._closed:
                    return
                job = self._queue.popleft()
                window = self._window
                self._busy = True
            t = time.perf_counter()
            try:
                job.dst.copy_(job.src)
            finally:
                dt = time.perf_counter() - t
                with self._cond:
                    self._busy = False
                    self.stats.window_bytes += job.src.numel()
                    self.stats.window_seconds += dt
                    self.stats.chunks_by_window[window] = self.stats.chunks_by_window.get(window, 0) + 1
                    self._cond.notify_all()
