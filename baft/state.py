"""Capture, restore and fingerprint the full state of a training job.

A checkpoint is only correct if it holds everything the next iteration reads:
model parameters and buffers, optimizer state, LR scheduler, every random
number generator (python, numpy, torch CPU, each CUDA device, the data
loader's own generator), the AMP grad scaler, the data position and the step.
:class:`TrainState` gathers those live objects and turns them into one nested
dict of *components* that contains only tensors and plain python values, so it
can be saved with ``torch.save`` and loaded back with ``weights_only=True``
(never unpickling arbitrary objects).

Fingerprints (:func:`fingerprint_components`) hash every leaf (xxh3-128, read
in place, GPU tensors staged through host memory in bounded pieces) so a
journal can record the state at each step boundary and an analysis can name the
first component and key where two runs differ; in the same pass they measure
each floating tensor's L2 norm, so the analysis can also say how large that
first divergence is.
"""
from __future__ import annotations

import math
import random
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
import xxhash

from .components import COMPONENTS
from .errors import BaftError

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch built without distributed
    DTensor = None  # type: ignore[assignment,misc]


def is_dtensor(value: Any) -> bool:
    return DTensor is not None and isinstance(value, DTensor)


def local_view(value: Any) -> Any:
    """A DTensor's local shard (a view of the storage it owns, no copy); anything else as it is."""
    return value.to_local().detach() if is_dtensor(value) else value


def local_tensors(tree: Any) -> Any:
    """``tree`` with every DTensor replaced by its local shard: a checkpoint of one rank holds what that
    rank owns (FSDP's shard, a tensor-parallel slice), the way the rank holds it."""
    if isinstance(tree, Mapping):
        return {k: local_tensors(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [local_tensors(v) for v in tree]
    return local_view(tree)


@dataclass(frozen=True, slots=True)
class Placement:
    """How a DTensor lies over its mesh: enough to make a local shard that DTensor again."""

    mesh: Any
    placements: tuple[Any, ...]
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    local_shape: tuple[int, ...]

    @classmethod
    def of(cls, value: Any) -> Placement | None:
        if not is_dtensor(value):
            return None
        return cls(value.device_mesh, tuple(value.placements), tuple(value.shape), tuple(value.stride()),
                   tuple(value.to_local().shape))

    def wrap(self, local: torch.Tensor) -> Any:
        """``local`` (this rank's shard) as the DTensor this placement describes."""
        if tuple(local.shape) != self.local_shape:
            raise BaftError(f"a saved shard of shape {tuple(local.shape)} does not fit this rank's shard "
                            f"{self.local_shape} of {self.shape} ({list(self.placements)}): the checkpoint "
                            "was taken under another sharding")
        return DTensor.from_local(local, self.mesh, self.placements, run_check=False, shape=torch.Size(self.shape),
                                  stride=self.stride)

    def empty(self, dtype: torch.dtype) -> Any:
        """A DTensor of this placement to load into (its local shard uninitialised)."""
        return self.wrap(torch.empty(self.local_shape, dtype=dtype))


def placement_for(placements: Mapping[str, Placement], name: str, shape: tuple[int, ...], *,
                  local: bool) -> Placement | None:
    """The placement of the tensor named ``name`` (a :func:`baft.layout.split` name) of ``shape`` (its
    local shard's with ``local``, else the whole tensor's), if it is a DTensor's."""
    p = placements.get(name)
    if p is None and name.startswith("optimizer.state."):
        parts = name.split(".")
        p = placements.get(f"optimizer.state.{parts[2]}.*") if len(parts) > 3 else None
        if p is not None and tuple(shape) != (p.local_shape if local else p.shape):
            return None  # a per-parameter tensor not shaped like the parameter (a scalar step)
    return p


def _like(saved: Any, live: Any) -> Any:
    """``saved`` (a local shard) as a DTensor laid out like ``live``, when ``live`` is one."""
    if not is_dtensor(live) or not isinstance(saved, torch.Tensor) or is_dtensor(saved):
        return saved
    return Placement.of(live).wrap(saved)


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
        fits = p is not None and is_dtensor(p)
        state[idx] = {k: (_like(v, p) if fits and isinstance(v, torch.Tensor) and v.dim() > 0
                          and tuple(v.shape) == tuple(p.to_local().shape) else v) for k, v in per_param.items()}
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

    def placements(self) -> dict[str, Placement]:
        """Where the state's DTensors lie, by their name in :func:`baft.layout.split` order
        (``model.<key>``; ``optimizer.state.<i>.*`` for every per-parameter tensor of parameter i shaped
        like it, so a restore knows the layout of moments the optimizer has not created yet). Take it at
        a step boundary: FSDP2's state dict reshards what it gathered for a forward."""
        out = {f"model.{k}": p for k, v in self.model.state_dict().items() if (p := Placement.of(v)) is not None}
        if self.optimizer is not None:
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            for i, param in enumerate(params):
                if (p := Placement.of(param)) is not None:
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


#: Bytes a non-CPU (or non-contiguous) tensor is staged through host memory in: a
#: multi-GB GPU state is read piece by piece, never copied whole.
STAGE_BYTES = 64 << 20

#: Bytes hashed and squared together while they sit in the L2 cache (1 MiB per core
#: here): one read of main memory serves both the digest and the norm. Measured on
#: this machine, 256 KiB blocks ran ~9 GB/s for both against ~6 GB/s for two passes.
BLOCK_BYTES = 256 << 10

#: A float32 block whose sum of squares falls outside [_F32_LOW, inf) is summed again
#: in float64: at inf a square overflowed (|x| > 1.8e19); below the bound squares may
#: have lost bits under FLT_MIN, at most 2**18 * 1.2e-38 = 3e-33 in all, < 1e-8 of it.
_F32_LOW = 1e-24


class _Scratch:
    """Buffers reused across every leaf of one fingerprinting pass.

    Fresh host allocations are paid in page faults on first touch (~1 GB/s here),
    so the staging buffer and the per-block buffers are allocated once per pass.
    """

    def __init__(self) -> None:
        self.carry = np.empty(BLOCK_BYTES, np.uint8)
        self.upcast = np.empty(BLOCK_BYTES, np.float32)  # a block of 1- or 2-byte floats, widened
        self.squares32 = np.empty(BLOCK_BYTES, np.float32)
        self.squares64 = np.empty(BLOCK_BYTES // 8, np.float64)
        self._stage: torch.Tensor | None = None

    def stage(self, nbytes: int, pin: bool) -> torch.Tensor:
        """A host uint8 buffer of at least ``nbytes`` (at most :data:`STAGE_BYTES` are asked for)."""
        if self._stage is None or self._stage.numel() < nbytes or (pin and not self._stage.is_pinned()):
            grown = 2 * self._stage.numel() if self._stage is not None else 0  # few reallocations for many small tensors
            self._stage = torch.empty(max(nbytes, min(grown, STAGE_BYTES)), dtype=torch.uint8, pin_memory=pin)
        return self._stage[:nbytes]


class _TensorStream:
    """Digest and sum of squares of one tensor's bytes, fed in pieces of any size.

    The norm is summed over fixed blocks of :data:`BLOCK_BYTES` from the tensor's
    first byte (a partial block is carried over to the next piece), so it is a
    function of dtype and bytes alone: a CUDA or non-contiguous tensor, staged in
    other piece sizes, gets bit for bit the norm of its contiguous CPU copy.
    Each block's squares are summed in float32 by numpy's pairwise summation
    (error ~1e-8 relative, deterministic, single-threaded) and the blocks in float64.
    """

    def __init__(self, t: torch.Tensor, scratch: _Scratch, with_norm: bool) -> None:
        self.hash = xxhash.xxh3_128(f"{t.dtype}{tuple(t.shape)}".encode())
        self.dtype = t.dtype
        self.scratch = scratch
        self.sumsq: float | None = 0.0 if with_norm and t.is_floating_point() else None
        self.fill = 0

    def feed(self, data: np.ndarray) -> None:
        """Hash ``data`` (uint8, contiguous) and add its squares block by block."""
        if self.sumsq is None:
            self.hash.update(data)
            return
        n, pos = data.size, 0
        if self.fill:
            pos = min(BLOCK_BYTES - self.fill, n)
            self.hash.update(data[:pos])
            self.scratch.carry[self.fill:self.fill + pos] = data[:pos]
            self.fill += pos
            if self.fill < BLOCK_BYTES:
                return
            self._square(self.scratch.carry)
            self.fill = 0
        while n - pos >= BLOCK_BYTES:
            block = data[pos:pos + BLOCK_BYTES]
            self.hash.update(block)
            self._square(block)
            pos += BLOCK_BYTES
        if pos < n:
            rest = data[pos:]
            self.hash.update(rest)
            self.scratch.carry[:rest.size] = rest
            self.fill = rest.size

    def _square(self, block: np.ndarray) -> None:
        s = self.scratch
        if self.dtype == torch.float64:
            x64 = block.view(np.float64)
            sq64 = s.squares64[:x64.size]
            np.multiply(x64, x64, out=sq64)
            self.sumsq += float(np.add.reduce(sq64))
            return
        if self.dtype == torch.float32:
            x = block.view(np.float32)
        else:  # 2- and 1-byte floats (bf16, f16, float8): upcast exactly to float32 first
            x = s.upcast[:block.size // self.dtype.itemsize]
            torch.from_numpy(x).copy_(torch.from_numpy(block).view(self.dtype))
        sq = s.squares32[:x.size]
        np.multiply(x, x, out=sq)
        part = float(np.add.reduce(sq))
        if not _F32_LOW <= part < math.inf and not (part == 0.0 and not block.any()):
            x64 = x.astype(np.float64)
            part = float(np.add.reduce(x64 * x64))
        self.sumsq += part

    def finish(self) -> tuple[str, float | None]:
        if self.fill:
            self._square(self.scratch.carry[:self.fill])
            self.fill = 0
        return self.hash.hexdigest(), (math.sqrt(self.sumsq) if self.sumsq is not None else None)


def _pieces(t: torch.Tensor, limit: int) -> Iterator[torch.Tensor]:
    """Sub-tensors of ``t`` in row-major order, each at most ``limit`` bytes where a row allows."""
    if t.dim() == 0 or t.numel() * t.element_size() <= limit:
        yield t
    elif t.dim() == 1:
        step = max(1, limit // t.element_size())
        for i in range(0, t.shape[0], step):
            yield t[i:i + step]
    else:
        row = t[0].numel() * t.element_size()
        if row <= limit:
            rows = limit // row
            for i in range(0, t.shape[0], rows):
                yield t[i:i + rows]
        else:
            for i in range(t.shape[0]):
                yield from _pieces(t[i], limit)


def _tensor_fingerprint(value: torch.Tensor, scratch: _Scratch, with_norm: bool) -> tuple[str, float | None]:
    with np.errstate(all="ignore"):  # overflowing squares are expected: _square redoes them in float64
        return _fingerprint_tensor(value.detach().resolve_conj().resolve_neg(), scratch, with_norm)


def _fingerprint_tensor(t: torch.Tensor, scratch: _Scratch, with_norm: bool) -> tuple[str, float | None]:
    stream = _TensorStream(t, scratch, with_norm)
    if t.numel() == 0:
        return stream.finish()
    if t.device.type == "cpu" and t.is_contiguous():
        flat = t.reshape(-1)
        if flat.stride(0) != 1:  # a size-1 dimension may keep any stride; the bytes are still dense
            flat = flat.as_strided((flat.numel(),), (1,))
        stream.feed(flat.view(torch.uint8).numpy())  # in place: no copy at all
        return stream.finish()
    src = t.reshape(-1) if t.is_contiguous() else t
    pin = t.is_cuda and torch.cuda.is_available()
    for piece in _pieces(src, STAGE_BYTES):
        nbytes = piece.numel() * piece.element_size()
        staged = scratch.stage(nbytes, pin)
        staged.view(piece.dtype).view(piece.shape).copy_(piece)
        stream.feed(staged.numpy())
    return stream.finish()


def fingerprint_leaf(value: Any, with_norm: bool = True, scratch: _Scratch | None = None) -> tuple[str, float | None]:
    """A 32-hex-digit xxh3-128 fingerprint of a leaf, and its L2 norm if a floating tensor.

    A tensor's or numpy array's fingerprint covers its dtype, shape and bytes; a plain
    value's its ``repr`` (a float its exact bits). The norm (None for anything but a floating
    tensor, or when ``with_norm`` is false) says how large a state is, so a
    divergence can tell a flipped bit in a big tensor from a tensor that drifted
    by a factor. ``scratch`` shares buffers across the leaves of one pass.
    """
    if isinstance(value, torch.Tensor):
        return _tensor_fingerprint(value, scratch or _Scratch(), with_norm)
    if isinstance(value, float):
        return xxhash.xxh3_128_hexdigest(b"f" + struct.pack("<d", value)), None
    if isinstance(value, np.ndarray) and not value.dtype.hasobject:
        # every byte: an array's repr elides all but its corners once it is large
        head = f"n{value.dtype.str}{list(value.shape)}".encode()
        return xxhash.xxh3_128_hexdigest(head + np.ascontiguousarray(value).tobytes()), None
    return xxhash.xxh3_128_hexdigest(repr(value).encode()), None


def digest_leaf(value: Any) -> str:
    """The fingerprint of :func:`fingerprint_leaf` alone (no norm is computed)."""
    return fingerprint_leaf(value, with_norm=False)[0]


def _named_leaves(components: Mapping[str, Any], param_names: Mapping[int, str] | None) -> Iterator[tuple[str, str, Any]]:
    """``(component, key, leaf)`` for every leaf, optimizer keys renamed to parameter names."""
    for comp, tree in components.items():
        for key, leaf in flatten(tree):
            if comp == "optimizer" and param_names and key.startswith("state."):
                _, idx, rest = key.split(".", 2)
                key = f"state.{param_names.get(int(idx), idx)}.{rest}"
            elif comp == "optimizer" and key.startswith("param_groups.") and key.endswith(".params"):
                continue  # indices only; identical by construction
            yield comp, key, leaf


def fingerprint_components(
    components: Mapping[str, Any], param_names: Mapping[int, str] | None = None, *, with_norms: bool = True
) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, float]]]:
    """Per component, per flattened key: the leaf's fingerprint, and (floating tensors only) its L2 norm.

    One read of every tensor serves both. Optimizer state keys are renamed from
    parameter indices to parameter names when ``param_names`` is given, so a
    divergence reads ``state.blocks.0.w.exp_avg``. With ``with_norms=False`` no
    norm is computed and the norms dict is empty.
    """
    scratch = _Scratch()
    digests: dict[str, dict[str, str]] = {comp: {} for comp in components}
    norms: dict[str, dict[str, float]] = {}
    for comp, key, leaf in _named_leaves(components, param_names):
        digest, norm = fingerprint_leaf(leaf, with_norms, scratch)
        digests[comp][key] = digest
        if norm is not None:
            norms.setdefault(comp, {})[key] = norm
    return digests, norms


def digest_components(components: Mapping[str, Any], param_names: Mapping[int, str] | None = None) -> dict[str, dict[str, str]]:
    """The digests of :func:`fingerprint_components`, without computing norms."""
    return fingerprint_components(components, param_names, with_norms=False)[0]
