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

Each batch is timed on the device (a timing event before its first chunk and its ``done``), so a
sealed version says how long its copies took on the copy stream (:meth:`VersionCopy.batch_seconds`).

Restore runs the same order the other way (:mod:`baft.device.restore`). The order itself is
device-independent: it speaks to a :class:`~baft.device.streams.Streams` (CUDA's, or a simulated device
that runs the streams' work in whatever order a test chooses, so the order is checked on a CPU).
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from baft.bubbles.copier import CopyJob
from baft.bubbles.profiler import BubbleProfiler, SpanTimer
from baft.device.streams import CudaStreams, Streams, for_tensors
from baft.device.timer import CudaTimingEvents, DeviceTimer
from baft.snapshot.slotfile import slot_of
from baft.snapshot.slots import Slot, SnapshotBuffer


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
        self.starts: list[Any] = []  # a timing event on the copy stream before each batch's first chunk
        self.batch_bytes: list[int] = []
        self._batch_bytes = 0
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
            if not self._unflushed:  # a batch begins: its device time runs from here to its `done`
                self.starts.append(self.streams.record(self.stream, timing=True))
            self._batch_bytes += job.src.numel()
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
                self.dones.append(self.streams.record(self.stream, timing=True))
                self.batch_bytes.append(self._batch_bytes)
                self._unflushed = self._batch_bytes = 0

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

    def batch_seconds(self) -> list[float] | None:
        """Each batch's device time on the copy stream, from before its first chunk to its ``done`` (only once
        :meth:`sealable`); None where the device cannot time its events."""
        out: list[float] = []
        for start, done in zip(self.starts, self.dones):
            dt = self.streams.elapsed(start, done)
            if dt is None:
                return None
            out.append(max(dt, 0.0))
        return out

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
    """The device path of :class:`baft.strategies.baft.snapshotter.BubbleSnapshotter`: one copy stream, the
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
    def for_state(cls, tensors: Iterable[Any], snapshotter: _Snapshotter) -> DeviceCopies | None:
        """The device path, attached to ``snapshotter``, if any of ``tensors`` (its state's; DTensors by their
        local shards) lives on CUDA (on that tensor's device) or a simulated device is plugged in
        (:func:`baft.device.streams.simulate`); else None (the host's path)."""
        streams = for_tensors(tensors)
        if streams is None:
            return None
        device = cls(streams)
        timer = DeviceTimer(CudaTimingEvents()) if isinstance(streams, CudaStreams) else None
        device.attach(snapshotter.profiler, snapshotter.buffer, timer)
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


