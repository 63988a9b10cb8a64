"""The order of a version's copies between a CUDA device and its shared-memory slot.

On CUDA the bubbles' copies leave the compute stream: each version's device→host chunks are issued
on a copy stream of their own, ``non_blocking``, into the slot (registered as page-locked memory so the
copy engine reads and writes it directly) or, where registration is refused, through a bounded ring of
pinned staging buffers. The host never waits for the device on this path; the order is kept by events:

``ready``   recorded on the compute stream at the version's boundary (after its optimizer step was
            issued); the copy stream waits on it before its first chunk.
``done``    recorded on the copy stream after each batch of chunks (one batch per window, one for the
            rest at the next optimizer step).
before the next optimizer step
            every chunk not yet issued is issued, and the compute stream waits on the last ``done``
            (unless it already completed): the step's kernels wait only for copies not yet done.
sealed      only once the last ``done`` completed (a query, never a wait on the training stream;
            :meth:`VersionCopy.sealable`), checked at later points; at close a host wait is allowed.

Restore runs the same order the other way (:class:`DeviceRestore`). The order itself is
device-independent: it speaks to a :class:`Streams` (the CUDA one, :class:`CudaStreams`, or
:class:`FakeStreams`, a simulated device that records every operation and runs the streams' work in
whatever order a test chooses, so the order can be checked on CPU).
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from baft.bubbles.copier import CopyJob
from baft.bubbles.devicetimer import CudaTimingEvents, DeviceTimer
from baft.bubbles.profiler import BubbleProfiler, SpanTimer
from baft.snapshot.slotfile import slot_of
from baft.snapshot.slots import Slot, SnapshotBuffer
from baft.state.dtensor import local_view


class Streams(Protocol):
    """What the copy order needs from a device."""

    def on_device(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lives on this device (else a copy of it is the host's own)."""

    def current(self) -> Any:
        """The compute stream (the stream the training's kernels run on now)."""

    def side(self) -> Any:
        """A new stream for copies."""

    def record(self, stream: Any) -> Any:
        """Record an event on ``stream``; returns it."""

    def wait(self, stream: Any, event: Any) -> None:
        """Make ``stream``'s later work wait for ``event`` (the host does not wait)."""

    def query(self, event: Any) -> bool:
        """Whether ``event`` completed (never blocks)."""

    def synchronize(self, event: Any) -> None:
        """The host waits for ``event`` (one event of a copy stream; only at close or drain)."""

    def copy(self, stream: Any, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Issue ``dst.copy_(src, non_blocking=True)`` on ``stream``."""

    def pinned(self, nbytes: int) -> torch.Tensor:
        """A page-locked host buffer of ``nbytes`` uint8."""

    def register(self, ptr: int, nbytes: int) -> bool:
        """Page-lock host memory in place (False: refused)."""

    def unregister(self, ptr: int) -> None:
        """Undo :meth:`register`."""


class CudaStreams:
    """:class:`Streams` of one CUDA device (the current one)."""

    def __init__(self, device: int | None = None) -> None:
        self.device = torch.device("cuda", torch.cuda.current_device() if device is None else device)

    def on_device(self, t: torch.Tensor) -> bool:
        return bool(t.is_cuda)

    def current(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def side(self) -> Any:
        return torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]

    def record(self, stream: Any) -> Any:
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(stream)
        return event

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def query(self, event: Any) -> bool:
        return bool(event.query())

    def synchronize(self, event: Any) -> None:
        event.synchronize()

    def copy(self, stream: Any, dst: torch.Tensor, src: torch.Tensor) -> None:
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
        for t in (src, dst):  # the caching allocator must not reuse a block while the copy stream uses it
            if t.is_cuda:
                t.record_stream(stream)

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def register(self, ptr: int, nbytes: int) -> bool:
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        ok = int(cudart.cudaHostRegister(ptr, nbytes, 0)) == 0
        if not ok:  # the failed call leaves its error as the last one: clear it, or torch's next check raises it
            clear = getattr(cudart, "cudaGetLastError", None)
            if clear is not None:
                clear()
        return ok

    def unregister(self, ptr: int) -> None:
        torch.cuda.cudart().cudaHostUnregister(ptr)  # type: ignore[no-untyped-call]


# -- the simulated device ----------------------------------------------------------------------
@dataclass(eq=False)
class FakeEvent:
    """An event of :class:`FakeStreams`: complete once its stream ran past it."""

    id: int
    stream: str
    done: bool = False
    time: float = 0.0  # when it completed (the device's clock), for timers


@dataclass
class FakeStreams:
    """A simulated device: each stream a FIFO of work that runs only when :meth:`step`, :meth:`run` or
    :meth:`synchronize` lets it (a wait runs once its event completed), every call logged in order.

    Log entries: ``("record", stream, event_id)``, ``("wait", stream, event_id)``, ``("copy", stream,
    tag)`` (at issue), ``("ran", stream, what)`` (when the device runs it), ``("query", event_id,
    result)``, ``("sync", event_id)``, ``("kernel", stream, name)``. ``tag(src)`` names a copy's source."""

    refuse_register: bool = False
    device_tensors: bool = True  # every tensor counts as the device's (False: every one is the host's)
    tag: Callable[[torch.Tensor], Any] = field(default=lambda src: src.data_ptr())
    log: list[tuple[Any, ...]] = field(default_factory=list)
    queues: dict[str, deque[tuple[Any, ...]]] = field(default_factory=lambda: {"compute": deque()})
    registered: dict[int, int] = field(default_factory=dict)
    clock: float = 0.0
    _events: int = 0
    _sides: int = 0

    def on_device(self, t: torch.Tensor) -> bool:
        return self.device_tensors

    def current(self) -> str:
        return "compute"

    def side(self) -> str:
        self._sides += 1
        name = f"copy{self._sides}"
        self.queues[name] = deque()
        return name

    def record(self, stream: str) -> FakeEvent:
        self._events += 1
        event = FakeEvent(self._events, stream)
        self.queues[stream].append(("record", event))
        self.log.append(("record", stream, event.id))
        return event

    def wait(self, stream: str, event: FakeEvent) -> None:
        self.queues[stream].append(("wait", event))
        self.log.append(("wait", stream, event.id))

    def query(self, event: FakeEvent) -> bool:
        self.log.append(("query", event.id, event.done))
        return event.done

    def synchronize(self, event: FakeEvent) -> None:
        self.log.append(("sync", event.id))
        while not event.done:
            if not any(self.step(s) for s in list(self.queues)):
                raise RuntimeError(f"event {event.id} can never complete: the device is stuck")

    def copy(self, stream: str, dst: torch.Tensor, src: torch.Tensor) -> None:
        tag = self.tag(src)
        self.queues[stream].append(("copy", dst, src, tag))
        self.log.append(("copy", stream, tag))

    def kernel(self, stream: str, name: str, fn: Callable[[], None]) -> None:
        """Launch a 'kernel' (``fn``, run when the device reaches it) on ``stream``."""
        self.queues[stream].append(("kernel", fn, name))
        self.log.append(("kernel", stream, name))

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def register(self, ptr: int, nbytes: int) -> bool:
        if self.refuse_register:
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


# -- pinned slot memory ------------------------------------------------------------------------
class PinnedRegions:
    """Host memory page-locked in place (the slots' data): all of it, or none (then staging is used)."""

    def __init__(self, streams: Streams) -> None:
        self.streams = streams
        self.regions: dict[int, int] = {}  # address -> bytes

    def register(self, regions: Iterable[tuple[int, int]]) -> bool:
        """Page-lock every ``(address, nbytes)``; if any is refused, none stays locked: False."""
        self.release()
        for ptr, nbytes in regions:
            if nbytes == 0:
                continue
            if not self.streams.register(ptr, nbytes):
                self.release()
                return False
            self.regions[ptr] = nbytes
        return True

    def forget(self, ptr: int) -> None:
        """Unlock the region at ``ptr`` (its memory is about to be unmapped)."""
        if self.regions.pop(ptr, None) is not None:
            self.streams.unregister(ptr)

    def release(self) -> None:
        for ptr in list(self.regions):
            self.forget(ptr)


class StagingRing:
    """At most ``count`` pinned buffers of ``nbytes`` each (made on first use), lent one per chunk to the
    versions in flight; a chunk's bytes move from its buffer into the slot once its batch completed
    (:meth:`poll`). When all are lent, the host waits for the oldest batch: the copy stream's event,
    never the compute stream."""

    def __init__(self, streams: Streams, count: int, nbytes: int) -> None:
        if count < 1:
            raise ValueError("a staging ring needs at least one buffer")
        self.streams, self.count, self.nbytes = streams, count, nbytes
        self.free: list[torch.Tensor] = []
        self.made = 0
        self.waits = 0
        self.staged: deque[_Staged] = deque()
        self._lock = threading.RLock()

    def lend(self, n: int) -> torch.Tensor:
        """A free buffer for a chunk of ``n`` bytes (waits for the oldest staged batch if none is)."""
        if n > self.nbytes:
            raise ValueError(f"a chunk of {n} bytes does not fit the staging buffers ({self.nbytes})")
        with self._lock:
            self.poll()
            buf = self._take()
            if buf is None:
                head = self.staged[0]
                head.owner._flush()  # its batch may still be open (the version issuing now)
                self.waits += 1
                self.streams.synchronize(head.owner.dones[head.batch])
                self.poll()
                buf = self._take()
                assert buf is not None
            return buf

    def _take(self) -> torch.Tensor | None:
        if self.free:
            return self.free.pop()
        if self.made < self.count:
            self.made += 1
            return self.streams.pinned(self.nbytes)
        return None

    def stage(self, owner: VersionCopy, buf: torch.Tensor, dst: torch.Tensor) -> None:
        """``buf`` is being filled for ``dst`` in ``owner``'s open batch."""
        with self._lock:
            self.staged.append(_Staged(owner, len(owner.dones), buf, dst))
            owner.staging += 1

    def poll(self) -> None:
        """Move every staged chunk whose batch completed into the slot, oldest first (never blocks)."""
        with self._lock:
            while self.staged:
                s = self.staged[0]
                if s.batch >= len(s.owner.dones) or not self.streams.query(s.owner.dones[s.batch]):
                    return
                self.staged.popleft()
                s.dst.copy_(s.buf[: s.dst.numel()])
                self.free.append(s.buf)
                s.owner.staging -= 1

    @property
    def lent(self) -> int:
        return self.made - len(self.free)


# -- device -> host: one version -----------------------------------------------------------------
@dataclass(eq=False, slots=True)
class _Staged:
    owner: VersionCopy
    batch: int  # index into owner.dones: the event after which the buffer holds the chunk
    buf: torch.Tensor  # the whole ring buffer (the chunk fills its start)
    dst: torch.Tensor


class VersionCopy:
    """The device→host copies of one version (see the module's docstring for the order).

    Made at the boundary (records ``ready``); :meth:`copy` issues one chunk (a :class:`CopyJob`; a job
    whose source is on the host is copied at once), :meth:`flush` ends a batch (records ``done``);
    :meth:`before_optimizer_step` issues the rest and orders the compute stream after them;
    :meth:`sealable` says when every byte is in the slot. With a ``ring`` the chunks go through its
    pinned buffers."""

    def __init__(self, streams: Streams, copy_stream: Any, version: int, ring: StagingRing | None = None) -> None:
        self.streams, self.stream, self.version, self.ring = streams, copy_stream, version, ring
        self.ready = streams.record(streams.current())
        self.dones: list[Any] = []
        self.issued = 0
        self.host_copies = 0
        self.staging = 0  # chunks in the ring's buffers, not yet in the slot
        self.closed = False
        self._waited = False
        self._unflushed = 0
        self._lock = threading.RLock()  # the copier thread issues while the training thread may flush

    def copy(self, job: CopyJob) -> None:
        with self._lock:
            if self.closed:
                raise RuntimeError(f"version {self.version}: a copy after the optimizer step")
            if not self.streams.on_device(job.src):  # a host tensor: the host's own copy, ordered by the training thread
                job.dst.copy_(job.src)
                self.host_copies += 1
                return
            if not self._waited:
                self.streams.wait(self.stream, self.ready)
                self._waited = True
            if self.ring is None:
                self.streams.copy(self.stream, job.dst, job.src)
            else:
                n = job.src.numel()
                buf = self.ring.lend(n)
                self.streams.copy(self.stream, buf[:n], job.src)
                self.ring.stage(self, buf, job.dst)
            self.issued += 1
            self._unflushed += 1

    def flush(self) -> None:
        """End the current batch: a ``done`` event after its chunks (nothing if none was issued)."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            if self._unflushed:
                self.dones.append(self.streams.record(self.stream))
                self._unflushed = 0

    def before_optimizer_step(self, rest: Iterable[CopyJob] = ()) -> None:
        """Issue ``rest`` and end the last batch; the compute stream waits on its ``done`` unless it
        already completed. Nothing may be copied afterwards."""
        for job in rest:
            self.copy(job)
        with self._lock:
            self._flush()
            self.closed = True
            if self.dones and not self.streams.query(self.dones[-1]):
                self.streams.wait(self.streams.current(), self.dones[-1])

    def sealable(self) -> bool:
        """Whether every byte of the version is in the slot: all issued, the last ``done`` completed
        (a query) and no chunk left in a staging buffer. Only after :meth:`before_optimizer_step`."""
        with self._lock:
            if not self.closed or (self.dones and not self.streams.query(self.dones[-1])):
                return False
        if self.ring is not None:
            self.ring.poll()
        return self.staging == 0

    def wait(self) -> None:
        """The host waits for the last ``done`` (at close, or when the slot is needed again)."""
        with self._lock:
            if self.dones:
                self.streams.synchronize(self.dones[-1])
        if self.ring is not None:
            self.ring.poll()


# -- the snapshotter's device path ------------------------------------------------------------------
class _Snapshotter(Protocol):
    profiler: BubbleProfiler
    buffer: SnapshotBuffer



RING_BUFFERS = 16
"""Staging buffers (of one chunk each) when the slots cannot be page-locked in place."""


class DeviceCopies:
    """The device path of :class:`baft.strategies.snapshotter.BubbleSnapshotter`: one copy stream, the
    slots' memory page-locked (else a staging ring), and the versions in flight between their optimizer
    step and their seal, sealed in order by :meth:`settle` (each pipeline wait, each boundary and each
    iteration's end; at close a host wait)."""

    def __init__(self, streams: Streams, ring_buffers: int = RING_BUFFERS) -> None:
        self.streams = streams
        self.stream = streams.side()
        self.pinned = PinnedRegions(streams)
        self.ring_buffers = ring_buffers
        self.ring: StagingRing | None = None
        self.inflight: deque[tuple[int, VersionCopy, Callable[[], None]]] = deque()
        self.slot_waits = 0
        self._sealing = False

    @classmethod
    def cuda_if(cls, tensors: Iterable[Any], snapshotter: _Snapshotter) -> DeviceCopies | None:
        """The CUDA path, attached to ``snapshotter``, if any of ``tensors`` (its state's; DTensors by
        their local shards) lives on CUDA; else None (the host's path)."""
        if not any(isinstance(t, torch.Tensor) and local_view(t).is_cuda for t in tensors):
            return None
        device = cls(CudaStreams())
        device.attach(snapshotter.profiler, snapshotter.buffer, DeviceTimer(CudaTimingEvents()))
        return device

    def attach(self, profiler: BubbleProfiler, buffer: SnapshotBuffer, timer: SpanTimer | None = None) -> None:
        """Seal in ``profiler``'s waits and time them with ``timer``; before any of ``buffer``'s slots is
        unmapped (remapped, closed), seal what is in flight (a host wait) and unlock its pages."""
        profiler.listeners.append(self.on_wait)
        if timer is not None:
            profiler.use_device(timer)
        buffer.on_unmap = self._unmapping
        for slot in buffer.slots.values():
            slot.on_unmap = self._unmapping

    def _unmapping(self, slot: Slot) -> None:
        if not self._sealing:  # (a seal that grows a slot's metadata remaps it: that version's copies are done)
            self.settle(block=True)
        self.pinned.forget(slot.data().data_ptr())

    @property
    def path(self) -> str:
        """``registered`` (the slots page-locked in place) or ``staging`` (through the ring)."""
        return "staging" if self.ring is not None else "registered"

    def layout(self, buffer: SnapshotBuffer, chunk_bytes: int) -> str:
        """``buffer``'s slots' data as mapped now: page-lock it, unless it is what is locked already;
        refused: the staging ring (of ``chunk_bytes`` buffers). Returns the path chosen."""
        wanted = {s.data().data_ptr(): s.data_len for s in buffer.slots.values() if s.data_len}
        if wanted != self.pinned.regions or (self.ring is not None and self.ring.nbytes < chunk_bytes):
            self.settle(block=True)  # nothing in flight into memory that changes hands
            ok = self.pinned.register(wanted.items())
            self.ring = None if ok else StagingRing(self.streams, self.ring_buffers, chunk_bytes)
        return self.path

    def begin(self, version: int) -> VersionCopy:
        """At ``version``'s boundary (its optimizer step issued): its copies, ``ready`` recorded now.
        A version still in flight into the same slot is waited for first (the copy stream's event)."""
        self.settle()
        slot = slot_of(version)
        if any(k == slot for k, _, _ in self.inflight):
            self.slot_waits += 1
            while self.inflight:
                k = self.inflight[0][0]
                self._seal_head(block=True)
                if k == slot:
                    break
        return VersionCopy(self.streams, self.stream, version, self.ring)

    def defer(self, copies: VersionCopy | None, seal: Callable[[], None]) -> bool:
        """Before the optimizer step, every chunk of ``copies`` issued (the engine ran what the windows
        left): order the step after them; ``seal`` runs once they all completed. False: no copies (the
        version was begun on the host's path), seal now."""
        if copies is None:
            return False
        copies.before_optimizer_step()
        self.inflight.append((slot_of(copies.version), copies, seal))
        self.settle()
        return True

    def settle(self, block: bool = False) -> None:
        """Seal the versions in flight whose copies completed, oldest first (all of them with ``block``)."""
        while self.inflight and (block or self.inflight[0][1].sealable()):
            self._seal_head(block)

    def _seal_head(self, block: bool) -> None:
        _, copies, seal = self.inflight[0]
        if block:
            copies.wait()
            if not copies.sealable():
                raise RuntimeError(f"version {copies.version}: copies completed but not in the slot")
        self.inflight.popleft()
        self._sealing = True
        try:
            seal()
        finally:
            self._sealing = False

    def on_wait(self, entering: bool, _window: int) -> None:
        """Profiler wait listener: a window is a moment to seal what completed."""
        if entering and self.inflight:
            self.settle()

    def close(self) -> None:
        try:
            self.settle(block=True)
        finally:
            self.pinned.release()


# -- host -> device: restore ---------------------------------------------------------------------
class DeviceRestore:
    """Copy a restored slot's bytes into the live CUDA tensors on a side stream.

    :meth:`run` records ``start`` on the compute stream (the live tensors' last use before the
    restore), makes the copy stream wait on it, issues every job (``dst`` a view of a live CUDA
    tensor, ``src`` a view of the slot, page-locked) and records ``done``; the compute stream waits on
    ``done``, so training continues after the copies without the host waiting. The slot must stay
    mapped and unchanged until :meth:`finished` (or :meth:`wait`)."""

    def __init__(self, streams: Streams, copy_stream: Any) -> None:
        self.streams, self.stream = streams, copy_stream
        self.done: Any = None

    def run(self, jobs: Iterable[CopyJob]) -> None:
        s = self.streams
        start = s.record(s.current())
        s.wait(self.stream, start)
        n = 0
        for job in jobs:
            s.copy(self.stream, job.dst, job.src)
            n += 1
        if n:
            self.done = s.record(self.stream)
            s.wait(s.current(), self.done)

    def finished(self) -> bool:
        return self.done is None or self.streams.query(self.done)

    def wait(self) -> None:
        if self.done is not None:
            self.streams.synchronize(self.done)
