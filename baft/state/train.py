"""What a checkpoint holds: the live objects of a training job, captured as components and restored.

A checkpoint is only correct if it holds everything the next iteration reads:
model parameters and buffers, optimizer state, LR scheduler, every random
number generator (python, numpy, torch CPU, each CUDA device, the data
loader's own generator), the AMP grad scaler, the data position and the step.
:class:`TrainState` gathers those live objects and turns them into one nested
dict of *components* that contains only tensors and plain python values, so it
can be saved with ``torch.save`` and loaded back with ``weights_only=True``
(never unpickling arbitrary objects).
"""
from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from baft.components import COMPONENTS
from baft.errors import BaftError
from baft.state.dtensor import TensorPlacement, is_dtensor, local_tensors

log = logging.getLogger("baft")


def _like(saved: Any, live: Any) -> Any:
    """``saved`` (a local shard) as a DTensor laid out like ``live``, when ``live`` is one."""
    if not is_dtensor(live) or not isinstance(saved, torch.Tensor) or is_dtensor(saved):
        return saved
    placement = TensorPlacement.of(live)
    return placement.wrap(saved) if placement is not None else saved


def _model_like(saved: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _like(v, live.get(k)) for k, v in saved.items()}


def _optimizer_like(saved: Mapping[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """An optimizer state dict of local shards, its per-parameter tensors shaped like their parameter's
    shard made DTensors like the parameter (Adam's moments of an FSDP parameter are sharded with it)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if not any(is_dtensor(p) for p in params):
        return dict(saved)
    state = {}
    for idx, per_param in saved.get("state", {}).items():
        p = params[int(idx)] if int(idx) < len(params) else None
        shape = tuple(p.to_local().shape) if p is not None and is_dtensor(p) else None
        state[idx] = {k: (_like(v, p) if shape is not None and isinstance(v, torch.Tensor) and v.dim() > 0
                          and tuple(v.shape) == shape else v) for k, v in per_param.items()}
    return {**saved, "state": state}



class Stateful(Protocol):
    """Anything with ``state_dict``/``load_state_dict`` (samplers, loaders, ...)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def rng_state(generators: Mapping[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Every process-wide RNG plus the named extra generators, as tensors and ints."""
    version, internal, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "name": np_name,
            "keys": torch.from_numpy(np.asarray(np_keys).astype(np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = {str(i): s for i, s in enumerate(torch.cuda.get_rng_state_all())}
        state["cuda_current"] = torch.cuda.current_device()
    for name, gen in (generators or {}).items():
        state[f"generator.{name}"] = gen.get_state()
    return state


def set_rng_state(state: Mapping[str, Any], generators: Mapping[str, torch.Generator] | None = None) -> None:
    """Inverse of :func:`rng_state`."""
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["internal"].tolist()), py["gauss"]))
    npst = state["numpy"]
    np.random.set_state(
        (npst["name"], npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"], npst["gauss"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        _set_cuda_rng(state["cuda"], state.get("cuda_current"))
    for name, gen in (generators or {}).items():
        key = f"generator.{name}"
        if key not in state:
            raise BaftError(f"checkpoint has no state for generator {name!r}")
        gen.set_state(state[key])


def _set_cuda_rng(saved: Mapping[str, Any], saved_current: int | None) -> None:
    """Each device's generator from the state saved for it, where the process sees as many devices as the one
    that saved. Where it sees another number (one GPU per rank through ``CUDA_VISIBLE_DEVICES`` on one side),
    indices do not name the same devices: the current device gets the state of the device that was current
    when saved (the rank's own), the others are left, and the log says so. Never an index past the devices
    it has."""
    count = torch.cuda.device_count()
    if len(saved) == count:
        for i in range(count):
            torch.cuda.set_rng_state(saved[str(i)], i)
        return
    mine = str(saved_current) if saved_current is not None and str(saved_current) in saved else "0"
    current = torch.cuda.current_device()
    torch.cuda.set_rng_state(saved[mine], current)
    log.warning("baft: the checkpoint holds the CUDA RNG states of %d devices, this process sees %d: device %d "
                "restored from the saved device %s (current when saved), the others not restored",
                len(saved), count, current, mine)


@dataclass(kw_only=True)
class TrainState:
    """The live objects whose state makes up one checkpoint.

    ``data`` is any stateful object that knows the data position (a resumable
    sampler); ``generators`` are extra ``torch.Generator`` objects such as the
    data loader's. ``step`` is the number of completed optimizer steps.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any | None = None
    data: Stateful | None = None
    scaler: Any | None = None
    generators: dict[str, torch.Generator] = field(default_factory=dict)
    step: int = 0

    def capture(self, omit: tuple[str, ...] = (), only: tuple[str, ...] = COMPONENTS, *,
                local: bool = True) -> dict[str, Any]:
        """A nested dict of components, in :data:`COMPONENTS` order.

        ``only`` selects components (a snapshot captures the RNGs and the data
        position at the boundary and the rest later); ``omit`` leaves
        components out. DTensors (FSDP2, tensor
        parallelism) appear as this rank's local shards (``local=False``: as DTensors, for a
        format that reshards, DCP); :meth:`restore` takes either.
        """
        shards = local_tensors if local else (lambda tree: tree)
        getters: dict[str, Any] = {
            "model": lambda: shards(self.model.state_dict()),
            "optimizer": (lambda: shards(self.optimizer.state_dict())) if self.optimizer is not None else None,
            "scheduler": self.scheduler.state_dict if self.scheduler is not None else None,
            "rng": lambda: rng_state(self.generators),
            "data": self.data.state_dict if self.data is not None else None,
            "scaler": self.scaler.state_dict if self.scaler is not None else None,
            "step": lambda: {"step": self.step},
        }
        return {c: getters[c]() for c in COMPONENTS if c in only and c not in omit and getters[c] is not None}

    def restore(self, components: Mapping[str, Any]) -> None:
        """Load every component present in ``components`` into the live objects."""
        if "model" not in components or "step" not in components:
            raise BaftError("checkpoint lacks the model or the step component")
        self.model.load_state_dict(_model_like(components["model"], self.model.state_dict()))
        if self.optimizer is not None and "optimizer" in components:
            self.optimizer.load_state_dict(_optimizer_like(components["optimizer"], self.optimizer))
        if self.scheduler is not None and "scheduler" in components:
            self.scheduler.load_state_dict(components["scheduler"])
        if "rng" in components:
            set_rng_state(components["rng"], self.generators)
        if self.data is not None and "data" in components:
            self.data.load_state_dict(components["data"])
        if self.scaler is not None and "scaler" in components:
            self.scaler.load_state_dict(components["scaler"])
        self.step = int(components["step"]["step"])

    def placements(self) -> dict[str, TensorPlacement]:
        """Where the state's DTensors lie, by their name in :func:`baft.state.layout.split` order
        (``model.<key>``; ``optimizer.state.<i>.*`` for every per-parameter tensor of parameter i shaped
        like it, so a restore knows the layout of moments the optimizer has not created yet). Take it at
        a step boundary: FSDP2's state dict reshards what it gathered for a forward."""
        out = {f"model.{k}": p for k, v in self.model.state_dict().items() if (p := TensorPlacement.of(v)) is not None}
        if self.optimizer is not None:
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            for i, param in enumerate(params):
                if (p := TensorPlacement.of(param)) is not None:
                    out[f"optimizer.state.{i}.*"] = p
        return out

    def param_names(self) -> dict[int, str]:
        """Optimizer param index -> parameter name, for readable divergence keys."""
        if self.optimizer is None:
            return {}
        by_id = {id(p): n for n, p in self.model.named_parameters()}
        names: dict[int, str] = {}
        idx = 0
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                names[idx] = by_id.get(id(p), str(idx))
                idx += 1
        return names


