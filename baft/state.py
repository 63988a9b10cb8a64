"""Capture, restore and fingerprint the full state of a training job.

A checkpoint is only correct if it holds everything the next iteration reads:
model parameters and buffers, optimizer state, LR scheduler, every random
number generator (python, numpy, torch CPU, each CUDA device, the data
loader's own generator), the AMP grad scaler, the data position and the step.
:class:`TrainState` gathers those live objects and turns them into one nested
dict of *components* that contains only tensors and plain python values, so it
can be saved with ``torch.save`` and loaded back with ``weights_only=True``
(never unpickling arbitrary objects).

Fingerprints (:func:`digest_components`) hash every leaf so a journal can record
the state at each step boundary and an analysis can name the first component
and key where two runs differ.
"""
from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from .errors import BaftError

#: Component names in the order a divergence is reported.
COMPONENTS = ("model", "optimizer", "scheduler", "rng", "data", "scaler", "step")


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
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = {str(i): s for i, s in enumerate(torch.cuda.get_rng_state_all())}
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
        torch.cuda.set_rng_state_all([state["cuda"][str(i)] for i in range(len(state["cuda"]))])
    for name, gen in (generators or {}).items():
        key = f"generator.{name}"
        if key not in state:
            raise BaftError(f"checkpoint has no state for generator {name!r}")
        gen.set_state(state[key])


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

    def capture(self, omit: tuple[str, ...] = (), only: tuple[str, ...] = COMPONENTS) -> dict[str, Any]:
        """A nested dict of components, in :data:`COMPONENTS` order.

        ``only`` selects components (a snapshot captures the RNGs and the data
        position at the boundary and the rest later); ``omit`` leaves
        components out (a test knob that makes a broken checkpoint).
        """
        getters: dict[str, Any] = {
            "model": self.model.state_dict,
            "optimizer": self.optimizer.state_dict if self.optimizer is not None else None,
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
        self.model.load_state_dict(components["model"])
        if self.optimizer is not None and "optimizer" in components:
            self.optimizer.load_state_dict(components["optimizer"])
        if self.scheduler is not None and "scheduler" in components:
            self.scheduler.load_state_dict(components["scheduler"])
        if "rng" in components:
            set_rng_state(components["rng"], self.generators)
        if self.data is not None and "data" in components:
            self.data.load_state_dict(components["data"])
        if self.scaler is not None and "scaler" in components:
            self.scaler.load_state_dict(components["scaler"])
        self.step = int(components["step"]["step"])

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


def flatten(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield ``(dotted.key, leaf)`` for every leaf of nested dicts/lists/tuples."""
    if isinstance(tree, Mapping):
        for k in sorted(tree, key=str):
            yield from flatten(tree[k], f"{prefix}{k}.")
    elif isinstance(tree, (list, tuple)) and not _is_plain_sequence(tree):
        for i, v in enumerate(tree):
            yield from flatten(v, f"{prefix}{i}.")
    else:
        yield prefix.rstrip("."), tree


def _is_plain_sequence(seq: list | tuple) -> bool:
    """A short sequence of scalars (betas, a shape) is one leaf, not many."""
    return all(isinstance(v, (int, float, bool, str, type(None))) for v in seq)


def digest_leaf(value: Any) -> str:
    """A 16-hex-digit fingerprint of a tensor (dtype, shape and bytes) or a plain value."""
    h = hashlib.blake2b(digest_size=8)
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    elif isinstance(value, float):
        h.update(b"f" + struct.pack("<d", value))
    else:
        h.update(repr(value).encode())
    return h.hexdigest()


def digest_components(components: Mapping[str, Any], param_names: Mapping[int, str] | None = None) -> dict[str, dict[str, str]]:
    """Per component, per flattened key, the leaf's fingerprint.

    Optimizer state keys are renamed from parameter indices to parameter names
    when ``param_names`` is given, so a divergence reads ``state.blocks.0.w.exp_avg``.
    """
    out: dict[str, dict[str, str]] = {}
    for comp, tree in components.items():
        leaves = {}
        for key, leaf in flatten(tree):
            if comp == "optimizer" and param_names and key.startswith("state."):
                _, idx, rest = key.split(".", 2)
                key = f"state.{param_names.get(int(idx), idx)}.{rest}"
            elif comp == "optimizer" and key.startswith("param_groups.") and key.endswith(".params"):
                continue  # indices only; identical by construction
            leaves[key] = digest_leaf(leaf)
        out[comp] = leaves
    return out
