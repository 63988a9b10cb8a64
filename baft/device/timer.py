"""A stage's compute spans and pipeline waits timed on its CUDA stream, read back one iteration late.

On CUDA a kernel launch returns at once: the host's clock around ``forward_one_chunk`` or a p2p wait
measures the launches, not the work, and the bubbles the copies should fill are the device's. The
:class:`DeviceTimer` records an event pair on the stage's stream around each span (the profiler's
wrappers call :meth:`DeviceTimer.start` / :meth:`DeviceTimer.stop`) and an origin event at each
iteration's start. Reading an event's time would wait for the device, so an iteration's times are read
only at the end of the next one, and only if its last event completed (a query; otherwise it is read
later still): the training stream is never synchronised. What comes back is the same
:class:`~baft.bubbles.profiler.IterationProfile` the host profiler makes, one iteration late.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from baft.bubbles.profiler import IterationProfile, Span


class TimingEvents(Protocol):
    """Timing events on the current stream."""

    def record(self) -> Any:
        """A timing event recorded on the current stream now."""

    def query(self, event: Any) -> bool:
        """Whether ``event`` completed (never blocks)."""

    def elapsed(self, start: Any, end: Any) -> float:
        """Seconds from ``start`` to ``end`` (both completed)."""


class CudaTimingEvents:
    """:class:`TimingEvents` of the current CUDA stream, reusing the events read back."""

    def __init__(self) -> None:
        self.free: list[Any] = []

    def record(self) -> Any:
        event = self.free.pop() if self.free else torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record()
        return event

    def query(self, event: Any) -> bool:
        return bool(event.query())

    def elapsed(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1e3

    def reuse(self, events: list[Any]) -> None:
        self.free.extend(events)


@dataclass(slots=True)
class _Iteration:
    step: int
    origin: Any
    spans: list[tuple[str, int, Any, Any]] = field(default_factory=list)
    end: Any = None


class DeviceTimer:
    """Event pairs around a stage's spans; :meth:`end_iteration` returns earlier iterations' profiles."""

    def __init__(self, events: TimingEvents) -> None:
        self.events = events
        self._open: _Iteration | None = None
        self._behind: deque[_Iteration] = deque()

    def begin_iteration(self, step: int) -> None:
        self._open = _Iteration(step, self.events.record())

    def start(self) -> Any:
        """Mark a span's start (an event on the stream); give it back to :meth:`stop`."""
        return self.events.record() if self._open is not None else None

    def stop(self, kind: str, index: int, start: Any) -> None:
        if self._open is not None and start is not None:
            self._open.spans.append((kind, index, start, self.events.record()))

    def end_iteration(self) -> list[IterationProfile]:
        """Close the running iteration; returns the profiles of the earlier ones whose events all
        completed, oldest first (normally the previous iteration's alone)."""
        if self._open is not None:
            self._open.end = self.events.record()
            self._behind.append(self._open)
            self._open = None
        out = []
        while len(self._behind) > 1 and self.events.query(self._behind[0].end):
            out.append(self._read(self._behind.popleft()))
        return out

    @property
    def behind(self) -> int:
        """Iterations closed but not yet read back."""
        return len(self._behind)

    def _read(self, it: _Iteration) -> IterationProfile:
        at = self.events.elapsed
        prof = IterationProfile(step=it.step, seconds=at(it.origin, it.end))
        prof.spans = [Span(kind, index, at(it.origin, a), at(it.origin, b)) for kind, index, a, b in it.spans]
        reuse = getattr(self.events, "reuse", None)
        if reuse is not None:
            reuse([it.origin, it.end, *(e for sp in it.spans for e in sp[2:])])
        return prof
