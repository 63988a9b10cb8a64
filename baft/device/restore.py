"""A restored version into a state that lives on the device, its bulk bytes copied on a side stream.

``TrainState.restore`` loads a slot's host tensors with ``load_state_dict``: on CUDA that is a
host-to-device copy of every parameter and moment on the compute stream (and Adam's
``load_state_dict`` makes a device copy of each moment first). :func:`restore_into` instead gives
``load_state_dict`` empty tensors where the live ones live (allocated, not copied: parameters take
them with a device-local copy, Adam keeps them as its moments), then fills the live tensors from the
slot with :class:`DeviceRestore`: the copy stream waits for the compute stream's last use of the
tensors, copies, and the compute stream waits for the copies, so training goes on after them without
the host waiting for training. The slot's memory is page-locked for the copies (a copy from pageable
memory would make the host wait for each one); where that is refused, the bytes go through a few pinned
staging buffers (:class:`_Staging`). Everything else (the scheduler, RNGs, the
data position, the step; Adam's step counts, which stay on the host) is restored as on the host.

The host path is taken for a state on the CPU and for DTensor state (a sharded layout's restore goes
through ``TrainState.restore``'s own placement logic).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from baft.bubbles.copier import CopyJob
from baft.device.streams import CudaStreams, Streams, simulated
from baft.state.dtensor import is_dtensor
from baft.state.fingerprint import flatten
from baft.state.train import TrainState

#: The components whose tensors are copied on the side stream.
BULK = ("model", "optimizer")


#: Pinned staging buffers, and the bytes of each, when the slot cannot be page-locked in place.
STAGING_BUFFERS = 4
STAGING_BYTES = 8 << 20


class DeviceRestore:
    """Copy a restored slot's bytes into the live device tensors on a side stream.

    :meth:`run` records ``start`` on the compute stream (the live tensors' last use before the restore),
    makes the copy stream wait on it, issues every job (``dst`` a live device tensor, ``src`` a view of the
    slot) and records ``done``; the compute stream waits on ``done``, so training continues after the
    copies without the host waiting. The sources' memory is page-locked in place for the copies (released
    by :meth:`finished` or :meth:`wait`); where that is refused, each source goes through a ring of pinned
    staging buffers (the host fills a buffer once the copy out of it completed). The slot must stay mapped
    and unchanged until :meth:`finished` (or :meth:`wait`)."""

    def __init__(self, streams: Streams, copy_stream: Any, buffers: int = STAGING_BUFFERS,
                 buffer_bytes: int = STAGING_BYTES) -> None:
        self.streams, self.stream = streams, copy_stream
        self.buffers, self.buffer_bytes = buffers, buffer_bytes
        self.done: Any = None
        self.path = "none"
        """``registered`` (the slot page-locked in place), ``staging`` (through pinned buffers) or ``none``."""
        self._registered: list[int] = []
        self._staging: deque[tuple[torch.Tensor, Any]] = deque()  # (buffer, the event after its copy)
        self._free: list[torch.Tensor] = []

    def run(self, jobs: Iterable[CopyJob]) -> None:
        s = self.streams
        jobs = list(jobs)
        if not jobs:
            return
        start = s.record(s.current())
        s.wait(self.stream, start)
        if self._register(jobs):
            self.path = "registered"
            for job in jobs:
                s.copy(self.stream, job.dst, job.src)
        else:
            self.path = "staging"
            for job in jobs:
                self._stage(job)
        self.done = s.record(self.stream)
        s.wait(s.current(), self.done)

    def _register(self, jobs: list[CopyJob]) -> bool:
        """Page-lock every source's storage; all or none."""
        regions: dict[int, int] = {}
        for job in jobs:
            storage = job.src.untyped_storage()
            if storage.nbytes():
                regions[storage.data_ptr()] = storage.nbytes()
        for ptr, nbytes in regions.items():
            if not self.streams.register(ptr, nbytes):
                self._release()
                return False
            self._registered.append(ptr)
        return True

    def _buffer(self) -> torch.Tensor:
        """A pinned buffer nothing is being copied out of (waits for the oldest copy when all are lent)."""
        if self._free:
            return self._free.pop()
        if len(self._staging) < self.buffers:
            return self.streams.pinned(self.buffer_bytes)
        buf, event = self._staging.popleft()
        self.streams.synchronize(event)
        return buf

    def _stage(self, job: CopyJob) -> None:
        """``job`` through the staging buffers, a buffer's worth at a time (a tensor that cannot be viewed as
        bytes gets a pinned copy of its own)."""
        s = self.streams
        src, dst = job.src.detach(), job.dst.detach()
        if not (src.is_contiguous() and dst.is_contiguous()):
            whole = s.pinned(src.numel() * src.element_size()).view(src.dtype).view(src.shape)
            whole.copy_(src)
            s.copy(self.stream, dst, whole)
            self._staging.append((whole, s.record(self.stream)))
            return
        src_bytes, dst_bytes = src.reshape(-1).view(torch.uint8), dst.reshape(-1).view(torch.uint8)
        for offset in range(0, src_bytes.numel(), self.buffer_bytes):
            n = min(self.buffer_bytes, src_bytes.numel() - offset)
            buf = self._buffer()
            buf[:n].copy_(src_bytes[offset : offset + n])
            s.copy(self.stream, dst_bytes[offset : offset + n], buf[:n])
            self._staging.append((buf, s.record(self.stream)))

    def _release(self) -> None:
        for ptr in self._registered:
            self.streams.unregister(ptr)
        self._registered.clear()
        self._staging.clear()
        self._free.clear()

    def finished(self) -> bool:
        if self.done is None or self.streams.query(self.done):
            self._release()
            return True
        return False

    def wait(self) -> None:
        if self.done is not None:
            self.streams.synchronize(self.done)
        self._release()


def _device_of(state: TrainState) -> torch.device | None:
    """The device of a state that lives on CUDA as plain tensors; None for the host path."""
    params = list(state.model.parameters())
    if not params or any(is_dtensor(p) for p in params) or not params[0].is_cuda:
        return None
    return params[0].device


def _placeholders(components: Mapping[str, Any], state: TrainState, device: torch.device | None) -> dict[str, Any]:
    """``components`` with each bulk tensor replaced by an empty one of its shape and dtype: a model
    tensor where the live one lives, an optimizer's per-parameter tensor on ``device`` (None: where the
    slot's is); a step count (0-dim) stays as it is."""
    live_model = state.model.state_dict()

    def empty(t: Any, where: Any) -> Any:
        return torch.empty_like(t, device=where) if isinstance(t, torch.Tensor) and t.dim() > 0 else t

    def swap(tree: Any) -> Any:
        if isinstance(tree, Mapping):
            return {k: swap(v) for k, v in tree.items()}
        return empty(tree, device)

    out = dict(components)
    if "model" in out:
        out["model"] = {k: empty(v, live_model[k].device if k in live_model else device) for k, v in out["model"].items()}
    if "optimizer" in out:
        out["optimizer"] = {k: swap(v) if k == "state" else v for k, v in out["optimizer"].items()}
    return out


def restore_into(state: TrainState, components: Mapping[str, Any], streams: Streams | None = None, *,
                 slot_stays: bool = False) -> DeviceRestore | None:
    """Restore ``components`` (a slot's: host tensors) into ``state``; on the device path (a CUDA state,
    ``streams`` given, or a simulated device plugged in) the bulk copies go on a side stream (see the
    module). Unless ``slot_stays`` (the caller keeps the slot mapped and unchanged until the restore
    returned :meth:`DeviceRestore.finished`), the host waits for the copy
    stream before returning — never for the training stream. The restore in flight, or None on the host
    path."""
    device = _device_of(state)
    if streams is None and device is not None:
        streams = CudaStreams(device)
    elif streams is None and not any(is_dtensor(p) for p in state.model.parameters()):
        streams = simulated()  # a simulated device plugged in (tests, the device check's rehearsal), else None
    if streams is None:
        state.restore(components)
        return None
    state.restore(_placeholders(components, state, device))
    live = dict(flatten(state.capture(only=BULK)))
    jobs: list[CopyJob] = []
    for key, src in flatten({c: components[c] for c in BULK if c in components}):
        if not isinstance(src, torch.Tensor) or src.dim() == 0:
            continue  # restored as it was
        dst = live.get(key)
        if not isinstance(dst, torch.Tensor) or dst.shape != src.shape:
            raise RuntimeError(f"restore: {key} is not in the live state as {tuple(src.shape)} after loading it")
        if streams.on_device(dst):
            jobs.append(CopyJob(len(jobs), src, dst))
        else:
            with torch.no_grad():
                dst.copy_(src)  # a host tensor of a device state (a buffer kept on the CPU): here and now
    flight = DeviceRestore(streams, streams.side())
    flight.run(jobs)
    if not slot_stays:
        flight.wait()
    return flight
