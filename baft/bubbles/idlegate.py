"""When the persister thread may run Python: while the training thread waits in a long enough bubble.

The persister thread of a rank shares the interpreter lock with training. Its Python (building the
state dict of a version, the writer's request, the report exchange, the commit: 4-7 ms per persist
measured on the reference pipeline) taken while the training thread computes stalls it twice: the
training thread waits for the lock, and on busy cores for a core. Inside a pipeline wait neither
happens: the training thread has let the lock go and its core is idle. So the persister passes this
gate before each step of a persist, and the gate is open only while the training thread is inside a
wait whose window the profiler expects to last at least ``min_window`` seconds (a short wait would
end mid-step, and the training thread would then wait for the lock).

The gate never holds a persist for long: each pass waits at most ``MAX_WAIT`` seconds and never past
the persist's deadline (the strategy gives half the time until the next persist is due: a persist that
waited longer would make the next one wait for it, with training stalled), and it is
open whenever no window that long is expected (no pipeline, or only short waits: nothing to wait
for) or the training thread itself waits for the persist (:meth:`IdleGate.held_open`: the
back-pressure of the next persist, a drain, the close).
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

#: Seconds a pass waits for a long enough window before it goes anyway.
MAX_WAIT = 0.1


class IdleGate:
    """``expected()``: the profiler's expected windows of an iteration, seconds each, by wait index (None
    or empty: not known yet); ``min_window``: the shortest window (seconds) that opens the gate (0: any
    wait; below 0: the gate is always open)."""

    def __init__(self, min_window: float, expected: Callable[[], list[float] | None]) -> None:
        self.min_window = min_window
        self.expected = expected
        self._open = threading.Event()
        self._held = 0
        self._inside = False  # the training thread is in a window that opened the gate
        self._lock = threading.Lock()
        self.waited = 0.0
        """Seconds the passes have waited so far."""

    def listener(self, entering: bool, window: int) -> None:
        """The profiler's wait listener (the training thread, at each wait's start and end)."""
        if entering:
            exp = self.expected()
            if exp is None or window >= len(exp) or exp[window] >= self.min_window:
                self._inside = True
                self._open.set()
        elif self._inside:
            self._inside = False
            if not self._held:
                self._open.clear()

    def _long_windows(self) -> bool:
        exp = self.expected()
        return bool(exp) and max(exp or [0.0]) >= self.min_window

    def wait(self, timeout: float = MAX_WAIT, until: float | None = None) -> float:
        """Block the persister until the gate opens, at most ``timeout`` seconds and not past ``until``
        (``time.perf_counter()``); the seconds waited."""
        if self.min_window < 0 or self._open.is_set() or not self._long_windows():
            return 0.0
        t0 = time.perf_counter()
        if until is not None:
            timeout = min(timeout, until - t0)
        if timeout <= 0:
            return 0.0
        self._open.wait(timeout)
        dt = time.perf_counter() - t0
        self.waited += dt
        return dt

    @contextlib.contextmanager
    def held_open(self) -> Iterator[None]:
        """Keep the gate open while the training thread waits for the persister."""
        with self._lock:
            self._held += 1
            self._open.set()
        try:
            yield
        finally:
            with self._lock:
                self._held -= 1
                if not self._held and not self._inside:
                    self._open.clear()  # the training thread computes again
