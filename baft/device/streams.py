"""What baft's device path asks of an accelerator: streams, events, asynchronous copies, page-locked memory.

:class:`Streams` is the interface; :class:`CudaStreams` is CUDA's. A simulated device (the tests' stand-in,
``tests/fakes/streams.py``, also what ``scripts/device-check --cpu-rehearsal`` runs on) is plugged in with
:func:`simulate`, so the whole device path — copies, seals, restores, the device check — runs on a CPU.

Three things CUDA does that the order of the copies must respect (and the stand-in reproduces):

- an event completes some time after it was recorded: a query may say "not yet" long after the host
  issued everything (the host never waits for the training stream);
- a copy between the device and *pageable* host memory is not asynchronous: the host waits for it. Every
  host side of a copy is therefore page-locked: a slot registered in place, or a pinned staging buffer;
- registering host memory can be refused (a container's locked-memory limit, a mapping the driver will not
  take); the refused call leaves its error as the thread's last CUDA error, which torch's next launch
  check would raise as its own, so it must be cleared (:func:`_error_clearer`).
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch


class Streams(Protocol):
    """What the copy order needs from a device."""

    def on_device(self, t: torch.Tensor) -> bool:
        """Whether ``t`` lives on this device (else a copy of it is the host's own)."""

    def current(self) -> Any:
        """The compute stream (the stream the training's kernels run on now)."""

    def side(self) -> Any:
        """A new stream for copies."""

    def record(self, stream: Any, timing: bool = False) -> Any:
        """Record an event on ``stream``; returns it. ``timing``: it can be passed to :meth:`elapsed`."""

    def wait(self, stream: Any, event: Any) -> None:
        """Make ``stream``'s later work wait for ``event`` (the host does not wait)."""

    def query(self, event: Any) -> bool:
        """Whether ``event`` completed (never blocks)."""

    def synchronize(self, event: Any) -> None:
        """The host waits for ``event`` (one event of a copy stream; only at close, drain or restore)."""

    def elapsed(self, start: Any, end: Any) -> float | None:
        """Seconds of device time between two completed timing events (None: this device cannot tell)."""

    def copy(self, stream: Any, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Issue ``dst.copy_(src, non_blocking=True)`` on ``stream``."""

    def pinned(self, nbytes: int) -> torch.Tensor:
        """A page-locked host buffer of ``nbytes`` uint8."""

    def register(self, ptr: int, nbytes: int) -> bool:
        """Page-lock host memory in place (False: refused, and nothing left behind)."""

    def unregister(self, ptr: int) -> None:
        """Undo :meth:`register`."""


_simulated: Callable[[], Streams] | None = None


def simulate(factory: Callable[[], Streams] | None) -> None:
    """Run baft's device path on the streams ``factory()`` makes, whatever the tensors' device (a simulated
    device: the tests and the device check's CPU rehearsal); None: back to CUDA only."""
    global _simulated
    _simulated = factory


def simulated() -> Streams | None:
    """A new simulated device's streams, if one is plugged in (:func:`simulate`)."""
    return _simulated() if _simulated is not None else None


def for_tensors(tensors: Any) -> Streams | None:
    """The streams of the device ``tensors`` live on (DTensors by their local shards): the simulated device if
    one is plugged in, CUDA's of the first CUDA tensor's device, or None (all on the host)."""
    from baft.state.dtensor import local_view

    sim = simulated()
    if sim is not None:
        return sim
    for t in tensors:
        if isinstance(t, torch.Tensor) and local_view(t).is_cuda:
            return CudaStreams(local_view(t).device)
    return None


def _loaded_libcudart() -> Path | None:
    """The CUDA runtime library this process has mapped (torch's), from ``/proc/self/maps``."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if "/libcudart.so" in path:
            return Path(path)
    return None


def _error_clearer(cudart: Any) -> Callable[[], Any] | None:
    """A call that clears the thread's last CUDA error: torch's binding if it has one (it has not in 2.11 or
    2.13), else ``cudaGetLastError`` of the runtime torch loaded; None if neither is found."""
    clear = getattr(cudart, "cudaGetLastError", None)
    if clear is not None:
        return clear  # type: ignore[no-any-return]
    lib = _loaded_libcudart()
    if lib is None:
        return None
    try:
        fn = ctypes.CDLL(str(lib)).cudaGetLastError
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    return fn


class CudaStreams:
    """:class:`Streams` of one CUDA device: the device of the tensors it copies, whatever thread calls it.

    A thread that has not chosen a device runs on device 0: a copier thread (``copier: thread``) issuing
    for a rank on device 3 would make a CUDA context on device 0 (memory on another rank's GPU) and its
    streams' current device would be wrong. Every call therefore first makes this device the calling
    thread's (once per thread)."""

    def __init__(self, device: torch.device | int | None = None) -> None:
        if device is None:
            device = torch.cuda.current_device()
        self.device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._bound = threading.local()
        self._clear: Callable[[], Any] | None | bool = False  # False: not looked up yet

    def _bind(self) -> None:
        if getattr(self._bound, "device", None) != self.device.index:
            torch.cuda.set_device(self.device)
            self._bound.device = self.device.index

    def on_device(self, t: torch.Tensor) -> bool:
        return bool(t.is_cuda)

    def current(self) -> Any:
        self._bind()
        return torch.cuda.current_stream(self.device)

    def side(self) -> Any:
        self._bind()
        return torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]

    def record(self, stream: Any, timing: bool = False) -> Any:
        self._bind()
        event = torch.cuda.Event(enable_timing=timing)  # type: ignore[no-untyped-call]
        event.record(stream)
        return event

    def wait(self, stream: Any, event: Any) -> None:
        self._bind()
        stream.wait_event(event)

    def query(self, event: Any) -> bool:
        self._bind()
        return bool(event.query())

    def synchronize(self, event: Any) -> None:
        self._bind()
        event.synchronize()

    def elapsed(self, start: Any, end: Any) -> float | None:
        self._bind()
        try:
            return float(start.elapsed_time(end)) / 1e3
        except RuntimeError:  # an event recorded without timing
            return None

    def copy(self, stream: Any, dst: torch.Tensor, src: torch.Tensor) -> None:
        self._bind()
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
        for t in (src, dst):  # the caching allocator must not reuse a block while the copy stream uses it
            if t.is_cuda:
                t.record_stream(stream)

    def pinned(self, nbytes: int) -> torch.Tensor:
        self._bind()
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def register(self, ptr: int, nbytes: int) -> bool:
        """Page-lock in place; refused (or no way to clear a refusal's error, then not even tried): False."""
        self._bind()
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        if self._clear is False:
            self._clear = _error_clearer(cudart)
        if self._clear is None:
            return False  # a refusal would leave an error nothing can clear: the staging ring instead
        ok = int(cudart.cudaHostRegister(ptr, nbytes, 0)) == 0
        if not ok:  # the failed call leaves its error as the last one: clear it, or torch's next check raises it
            self._clear()  # type: ignore[operator]
        return ok

    def unregister(self, ptr: int) -> None:
        self._bind()
        torch.cuda.cudart().cudaHostUnregister(ptr)  # type: ignore[no-untyped-call]
