"""The background copier: runs a snapshot's work only while the training thread waits.

The training thread announces each pipeline wait (through the profiler's wait
listeners); the copier thread works through its queue while a wait is in
progress and sleeps otherwise, so the work fills the bubbles and stays out of
compute. A queue item is either a :class:`CopyJob` (one chunk, 1 MiB by
default, ~0.1 ms) or a :class:`Task`, a Python callable that may return more
items to run next (building the copy jobs, serialising the metadata). Copies
release the GIL; Python work holds it, so ``BubbleSnapshotter`` lowers the
interpreter's switch interval to hand it back quickly when a wait ends.

Measured here: a copier at SCHED_IDLE priority was starved; normal priority works.

On CUDA the copy jobs go to a :class:`Sink` instead (:class:`baft.device.copies.VersionCopy`): it
issues each chunk on a copy stream and returns at once, ends each window's batch with an event
(:meth:`Sink.flush`), and the window's budget is spent by the chunks' estimated copy time, not by the
host's time issuing them.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, Union

import torch


@dataclass(slots=True)
class CopyJob:
    """Copy ``src`` (a uint8 view) into ``dst`` (a uint8 view of shared memory)."""

    index: int
    src: torch.Tensor
    dst: torch.Tensor


@dataclass(slots=True)
class Task:
    """Python work; returns the items to run right after it (or None)."""

    name: str
    fn: Callable[[], "list[Item] | None"]


Item = Union[CopyJob, Task]


@dataclass(slots=True)
class CopyStats:
    """What one snapshot's work did, inside the windows and in the stall."""

    window_bytes: int = 0
    window_seconds: float = 0.0
    stall_bytes: int = 0
    stall_seconds: float = 0.0
    task_seconds: float = 0.0
    chunks_by_window: dict[int, int] = field(default_factory=dict)

    @property
    def bandwidth(self) -> float:
        secs = self.window_seconds + self.stall_seconds
        return (self.window_bytes + self.stall_bytes) / secs if secs > 0 else 0.0


class Sink(Protocol):
    """Where the copy jobs go instead of a copy on the calling thread (the device path)."""

    def copy(self, job: CopyJob) -> None:
        """Issue ``job`` (returns before the bytes moved)."""

    def flush(self) -> None:
        """End a batch of issued jobs (the end of a window's work, or of the stall's)."""


Budget = Callable[[int], float]
"""``budget(window)``: seconds of work the plan allows in the window at that position."""


class CopyEngine:
    """Runs a snapshot's queue inside the waits, in one of two modes.

    ``inline``: the training thread itself works through the queue when it
    enters a wait, for as long as the plan's budget for that window allows,
    then waits. The transfer it waits for progresses meanwhile in gloo's own
    threads; no second Python thread, no GIL hand-over. The plan's window
    estimates decide how much goes where.

    ``thread``: a copier thread works while the training thread is inside a
    wait and sleeps otherwise; it uses the real window, whatever its length,
    but Python work on it competes for the GIL when the wait ends.
    """

    def __init__(self, mode: str = "inline", budget: Budget | None = None) -> None:
        self.mode = mode
        self.budget = budget or (lambda window: 0.0)
        self._cond = threading.Condition()
        self._queue: deque[Item] = deque()
        self._idle = False
        self._window = -1
        self._busy = False
        self._closed = False
        self._error: BaseException | None = None
        self.stats = CopyStats()
        self._cost: dict[str, float] = {}
        self.bandwidth = 5e9
        self.sink: Sink | None = None
        """Set by :meth:`start` for one snapshot's work: the device path (None: copies on the host)."""
        self._thread: threading.Thread | None = None
        if mode == "thread":
            self._thread = threading.Thread(target=self._run, name="baft-copier", daemon=True)
            self._thread.start()

    # Called by the training thread -------------------------------------------------------
    def on_wait(self, entering: bool, window: int) -> None:
        """Profiler wait listener: work inside the wait (inline) or open the gate (thread)."""
        if self.mode == "inline":
            if entering and self._queue:
                self._run_inline(window, self.budget(window))
            return
        with self._cond:
            self._idle = entering
            self._window = window
            if entering and self._queue:
                self._cond.notify()

    def start(self, items: list[Item], sink: Sink | None = None) -> None:
        with self._cond:
            self.sink = sink
            self._queue = deque(items)
            self.stats = CopyStats()
            self._error = None
            if self._idle and self._queue:
                self._cond.notify()

    def finish(self) -> tuple[list[Item], CopyStats]:
        """Stop; returns the items not yet run (after the one in flight) and the stats.

        Re-raises an exception a background item raised, so a failed snapshot is never sealed.
        """
        with self._cond:
            while self._busy:
                self._cond.wait()
            left = list(self._queue)
            self._queue.clear()
            if self._error is not None:
                err, self._error = self._error, None
                raise err
            return left, self.stats

    def run_now(self, items: list[Item]) -> None:
        """Run ``items`` (and whatever they spawn) in the calling thread: the stall."""
        t = time.perf_counter()
        pending = deque(items)
        n = 0
        sink = self.sink
        while pending:
            item = pending.popleft()
            if isinstance(item, CopyJob):
                if sink is None:
                    item.dst.copy_(item.src)
                else:
                    sink.copy(item)
                n += item.src.numel()
            else:
                more = item.fn()
                if more:
                    pending.extendleft(reversed(more))
        self.stats.stall_bytes += n
        if sink is None:
            self.stats.stall_seconds += time.perf_counter() - t
        else:  # issued, not copied: the host's time says nothing of the copy's
            sink.flush()

    def _estimate(self, item: Item) -> float:
        if isinstance(item, CopyJob):
            return item.src.numel() / self.bandwidth
        return self._cost.get(item.name, 1e-3)

    def _run_inline(self, window: int, budget: float) -> None:
        """Work through the queue while the next item still fits in ``budget`` seconds."""
        if self.sink is not None:
            self._issue_inline(self.sink, window, budget)
            return
        start = time.perf_counter()
        stats = self.stats
        while self._queue:
            item = self._queue[0]
            if time.perf_counter() - start + self._estimate(item) > budget:
                return
            self._queue.popleft()
            t = time.perf_counter()
            if isinstance(item, CopyJob):
                item.dst.copy_(item.src)
                dt = time.perf_counter() - t
                n = item.src.numel()
                stats.window_bytes += n
                stats.window_seconds += dt
                stats.chunks_by_window[window] = stats.chunks_by_window.get(window, 0) + 1
                if dt > 0 and n >= 1 << 16:
                    self.bandwidth = 0.8 * self.bandwidth + 0.2 * (n / dt)
            else:
                more = item.fn()
                dt = time.perf_counter() - t
                stats.task_seconds += dt
                self._cost[item.name] = 0.5 * self._cost.get(item.name, dt) + 0.5 * dt
                if more:
                    self._queue.extendleft(reversed(more))

    def _issue_inline(self, sink: Sink, window: int, budget: float) -> None:
        """:meth:`_run_inline` on the device path: copies are issued, and count by their estimated
        device time (the bandwidth is not learnt from the host's time); Python work by the host's."""
        spent = 0.0
        stats = self.stats
        try:
            while self._queue:
                item = self._queue[0]
                cost = self._estimate(item)
                if spent + cost > budget:
                    return
                self._queue.popleft()
                if isinstance(item, CopyJob):
                    sink.copy(item)
                    spent += cost
                    stats.window_bytes += item.src.numel()
                    stats.chunks_by_window[window] = stats.chunks_by_window.get(window, 0) + 1
                else:
                    t = time.perf_counter()
                    more = item.fn()
                    dt = time.perf_counter() - t
                    spent += dt
                    stats.task_seconds += dt
                    self._cost[item.name] = 0.5 * self._cost.get(item.name, dt) + 0.5 * dt
                    if more:
                        self._queue.extendleft(reversed(more))
        finally:
            sink.flush()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # The copier thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not (self._idle and self._queue):
                    if self.sink is not None:  # the window closed or the queue ran dry: end the batch
                        self.sink.flush()
                    self._cond.wait()
                if self._closed:
                    return
                item = self._queue.popleft()
                window = self._window
                self._busy = True
            t = time.perf_counter()
            more: list[Item] | None = None
            sink = self.sink
            try:
                if isinstance(item, CopyJob):
                    if sink is None:
                        item.dst.copy_(item.src)
                    else:
                        sink.copy(item)
                else:
                    more = item.fn()
            except BaseException as e:  # surfaced by finish() on the training thread
                with self._cond:
                    self._error = e
                    self._queue.clear()
            finally:
                dt = time.perf_counter() - t
                with self._cond:
                    self._busy = False
                    if isinstance(item, CopyJob):
                        self.stats.window_bytes += item.src.numel()
                        if sink is None:
                            self.stats.window_seconds += dt
                        self.stats.chunks_by_window[window] = self.stats.chunks_by_window.get(window, 0) + 1
                    else:
                        self.stats.task_seconds += dt
                    if more:
                        self._queue.extendleft(reversed(more))
                    self._cond.notify_all()
