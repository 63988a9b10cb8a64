"""A restored version into a state that lives on the device, its bulk bytes copied on a side stream.

``TrainState.restore`` loads a slot's host tensors with ``load_state_dict``: on CUDA that is a
host-to-device copy of every parameter and moment on the compute stream (and Adam's
``load_state_dict`` makes a device copy of each moment first). :func:`restore_into` instead gives
``load_state_dict`` empty tensors where the live ones live (allocated, not copied: parameters take
them with a device-local copy, Adam keeps them as its moments), then fills the live tensors from the
slot with :class:`baft.bubbles.devicecopy.DeviceRestore`: the copy stream waits for the compute
stream's last use of the tensors, copies, and the compute stream waits for the copies, so training
goes on after them without the host waiting for training. Everything else (the scheduler, RNGs, the
data position, the step; Adam's step counts, which stay on the host) is restored as on the host.

The host path is taken for a state on the CPU and for DTensor state (a sharded layout's restore goes
through ``TrainState.restore``'s own placement logic).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from baft.bubbles.copier import CopyJob
from baft.bubbles.devicecopy import CudaStreams, DeviceRestore, Streams
from baft.state.dtensor import is_dtensor
from baft.state.fingerprint import flatten
from baft.state.train import TrainState

#: The components whose tensors are copied on the side stream.
BULK = ("model", "optimizer")


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
    or ``streams`` given: a test's simulated device) the bulk copies go on a side stream (see the
    module). Unless ``slot_stays`` (the caller keeps the slot mapped and unchanged until the restore
    returned :meth:`~baft.bubbles.devicecopy.DeviceRestore.finished`), the host waits for the copy
    stream before returning — never for the training stream. The restore in flight, or None on the host
    path."""
    device = _device_of(state)
    if streams is None and device is None:
        state.restore(components)
        return None
    streams = streams if streams is not None else CudaStreams()
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
