"""A simulated device: the CPU stand-in of baft's CUDA path (:class:`baft.device.streams.Streams`).

Faithful where the device path's bugs live:

- each stream is a FIFO of work that runs only when the device is let run (:meth:`FakeStreams.step`,
  :meth:`~FakeStreams.run`, :meth:`~FakeStreams.synchronize`), so a copy is not in its destination when
  it is issued; with ``autorun`` the device runs, when an event is queried, the work issued at least
  ``latency`` seconds before (a query right after the copies were issued says "not yet"; one a window
  later sees them done), as a real device finishes some time later, never at once;
- registration can be refused (``refuse_register``), and memory can be registered once only;
- with ``strict_pinned``, a copy whose host side is neither a pinned buffer nor registered memory is
  *pageable*: CUDA makes the host wait for it, so the stand-in runs the device up to it at once and logs
  ``("pageable", stream, tag)``;
- events recorded with ``timing`` carry the device's clock (:meth:`~FakeStreams.elapsed`).

With ``autorun`` (a whole run on a CPU) the host computes at once rather than on the compute stream, so a copy
reads its source when issued (what a device that orders the next kernels after it reads when it runs); the
order of waits and events is checked by the tests that step the device by hand.

Plug it into a whole run with :func:`baft.device.streams.simulate` (:func:`simulated_device`).
"""
from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from baft.device import streams as device_streams


@dataclass(eq=False)
class FakeEvent:
    """An event of :class:`FakeStreams`: complete once its stream ran past it."""

    id: int
    stream: str
    done: bool = False
    time: float = 0.0  # when it completed (the device's clock), for timers
    timing: bool = False


@dataclass
class FakeStreams:
    """A simulated device: each stream a FIFO of work that runs only when :meth:`step`, :meth:`run` or
    :meth:`synchronize` lets it (a wait runs once its event completed), every call logged in order.

    Log entries: ``("record", stream, event_id)``, ``("wait", stream, event_id)``, ``("copy", stream,
    tag)`` (at issue), ``("ran", stream, what)`` (when the device runs it), ``("query", event_id,
    result)``, ``("sync", event_id)``, ``("kernel", stream, name)``. ``tag(src)`` names a copy's source."""

    refuse_register: bool = False
    device_tensors: bool | Callable[[torch.Tensor], bool] = True
    """Every tensor counts as the device's (False: every one is the host's; a callable decides per tensor)."""
    autorun: bool = False
    latency: float = 0.002
    """With ``autorun``: how long after it was issued a piece of work is done (seen by a later query)."""
    strict_pinned: bool = False
    seconds_per_tick: float = 1e-4
    """Device time per piece of work (:meth:`elapsed`)."""
    tag: Callable[[torch.Tensor], Any] = field(default=lambda src: src.data_ptr())
    log: list[tuple[Any, ...]] = field(default_factory=list)
    queues: dict[str, deque[tuple[Any, ...]]] = field(default_factory=lambda: {"compute": deque()})
    registered: dict[int, int] = field(default_factory=dict)
    clock: float = 0.0
    _events: int = 0
    _sides: int = 0
    _pinned: list[torch.Tensor] = field(default_factory=list)

    def on_device(self, t: torch.Tensor) -> bool:
        return self.device_tensors(t) if callable(self.device_tensors) else self.device_tensors

    def current(self) -> str:
        return "compute"

    def side(self) -> str:
        self._sides += 1
        name = f"copy{self._sides}"
        self.queues[name] = deque()
        return name

    def record(self, stream: str, timing: bool = False) -> FakeEvent:
        self._events += 1
        event = FakeEvent(self._events, stream, timing=timing)
        self.queues[stream].append(("record", event, time.perf_counter()))
        self.log.append(("record", stream, event.id))
        return event

    def wait(self, stream: str, event: FakeEvent) -> None:
        self.queues[stream].append(("wait", event, time.perf_counter()))
        self.log.append(("wait", stream, event.id))

    def query(self, event: FakeEvent) -> bool:
        if self.autorun:  # the device ran whatever was issued long enough ago
            self.advance()
        self.log.append(("query", event.id, event.done))
        return event.done

    def advance(self) -> None:
        """Run, in each stream's order, the work issued at least ``latency`` seconds ago (``autorun``)."""
        due = time.perf_counter() - self.latency
        progressed = True
        while progressed:
            progressed = False
            for s, q in self.queues.items():
                if q and q[0][-1] <= due and self.step(s):
                    progressed = True

    def elapsed(self, start: FakeEvent, end: FakeEvent) -> float | None:
        if not (start.timing and end.timing):
            raise RuntimeError("elapsed() between events recorded without timing")
        if not (start.done and end.done):
            raise RuntimeError("elapsed() before both events completed")
        return (end.time - start.time) * self.seconds_per_tick

    def synchronize(self, event: FakeEvent) -> None:
        self.log.append(("sync", event.id))
        while not event.done:
            if not any(self.step(s) for s in list(self.queues)):
                raise RuntimeError(f"event {event.id} can never complete: the device is stuck")

    def copy(self, stream: str, dst: torch.Tensor, src: torch.Tensor) -> None:
        tag = self.tag(src)
        # A whole run on a CPU (autorun) computes on the host at once, not on the compute stream: the kernels
        # that the device would order after this copy (the optimizer step, after its wait on the copies) run
        # before it here. What the copy reads is therefore taken now, as the device would read it then.
        source = src.clone() if self.autorun else src
        self.queues[stream].append(("copy", dst, source, tag, time.perf_counter()))
        self.log.append(("copy", stream, tag))
        if self.strict_pinned and any(not self.on_device(t) and not self.page_locked(t) for t in (dst, src)):
            self.log.append(("pageable", stream, tag))  # CUDA makes the host wait for such a copy
            while self.queues[stream]:
                if not self.step(stream) and not any(self.step(s) for s in list(self.queues) if s != stream):
                    raise RuntimeError("a pageable copy can never run: the device is stuck")

    def page_locked(self, t: torch.Tensor) -> bool:
        """Whether host tensor ``t`` lies in a pinned buffer or registered memory."""
        ptr = t.data_ptr()
        regions = [*self.registered.items(), *((p.data_ptr(), p.numel()) for p in self._pinned)]
        return any(start <= ptr and ptr + t.numel() * t.element_size() <= start + n for start, n in regions)

    def kernel(self, stream: str, name: str, fn: Callable[[], None]) -> None:
        """Launch a 'kernel' (``fn``, run when the device reaches it) on ``stream``."""
        self.queues[stream].append(("kernel", fn, name, time.perf_counter()))
        self.log.append(("kernel", stream, name))

    def pinned(self, nbytes: int) -> torch.Tensor:
        buf = torch.empty(nbytes, dtype=torch.uint8)
        self._pinned.append(buf)
        return buf

    def register(self, ptr: int, nbytes: int) -> bool:
        if self.refuse_register or ptr in self.registered:  # CUDA refuses a second registration too
            return False
        self.registered[ptr] = nbytes
        return True

    def unregister(self, ptr: int) -> None:
        del self.registered[ptr]

    # the device's side -------------------------------------------------------------------------
    def step(self, stream: str) -> bool:
        """Run the next piece of ``stream``'s work if it can run now; whether it ran."""
        q = self.queues[stream]
        if not q:
            return False
        op = q[0]
        if op[0] == "wait" and not op[1].done:
            return False
        q.popleft()
        self.clock += 1.0
        if op[0] == "record":
            op[1].done, op[1].time = True, self.clock
            self.log.append(("ran", stream, ("record", op[1].id)))
        elif op[0] == "wait":
            self.log.append(("ran", stream, ("wait", op[1].id)))
        elif op[0] == "copy":
            op[1].copy_(op[2])
            self.log.append(("ran", stream, ("copy", op[3])))
        else:
            op[1]()
            self.log.append(("ran", stream, ("kernel", op[2])))
        return True

    def run(self, choose: Callable[[list[str]], int], steps: int) -> None:
        """Up to ``steps`` pieces of work, each on the stream ``choose(runnable streams)`` picks."""
        for _ in range(steps):
            runnable = [s for s, q in self.queues.items() if q and (q[0][0] != "wait" or q[0][1].done)]
            if not runnable:
                return
            self.step(runnable[choose(runnable) % len(runnable)])

    def drain(self) -> None:
        """Run everything that can run."""
        while any(self.step(s) for s in list(self.queues)):
            pass




@contextlib.contextmanager
def simulated_device(**options: Any) -> Iterator[list[FakeStreams]]:
    """baft's device path on :class:`FakeStreams` (``autorun`` unless said) for the block, whatever the tensors'
    device; yields the list of every simulated device made meanwhile."""
    made: list[FakeStreams] = []

    def factory() -> FakeStreams:
        made.append(FakeStreams(**{"autorun": True, **options}))
        return made[-1]

    device_streams.simulate(factory)
    try:
        yield made
    finally:
        device_streams.simulate(None)


def rehearsal_device() -> FakeStreams:
    """The simulated device of ``scripts/device-check --cpu-rehearsal`` (``--simulate-device
    tests.fakes.streams:rehearsal_device``): copies complete 5 ms after they were issued (longer than the
    rehearsal's waits of 2 ms), so a version is sealed a window or more after its last copy was issued."""
    return FakeStreams(autorun=True, latency=0.005)
