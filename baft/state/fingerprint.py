"""Fingerprints of a training state: a digest and an L2 norm of every leaf, in one pass.

Fingerprints (:func:`fingerprint_components`) hash every leaf so a journal can
record the state at each step boundary and an analysis can name the first
component and key where two runs differ; in the same pass they measure each
floating tensor's L2 norm, so the analysis can also say how large that first
divergence is.

Where a tensor lives decides how it is read. A CPU tensor is hashed with
xxh3-128, in place (a non-contiguous one through a host buffer in bounded
pieces). A tensor on any other device (CUDA, an accelerator) is fingerprinted on
that device by :func:`baft.state.devicedigest.device_fingerprint`: integer torch
ops there, a few bytes back per tensor, never a copy of the state through host
memory. The two digests are different functions: a CUDA tensor's digest equals
the device digest of its CPU copy, not that copy's xxh3 digest, so digests are
compared between runs whose tensors live on the same kind of device (a reference
and a faulted run of the same job).
"""
from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
import xxhash

from baft.state.devicedigest import device_fingerprint


def flatten(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted.key, leaf)`` for every leaf of nested dicts/lists/tuples, keys sorted within each dict."""
    out: list[tuple[str, Any]] = []
    _walk(tree, prefix, out)
    return iter(out)


#: Types that are leaves, told apart before the (slower) abstract ``Mapping`` check.
_LEAF_TYPES = (torch.Tensor, np.ndarray, float, int, str, bytes, type(None))


def _walk(tree: Any, prefix: str, out: list[tuple[str, Any]]) -> None:
    if isinstance(tree, _LEAF_TYPES):
        out.append((prefix.rstrip("."), tree))
    elif isinstance(tree, dict) or isinstance(tree, Mapping):
        for k in sorted(tree, key=str):
            _walk(tree[k], f"{prefix}{k}.", out)
    elif isinstance(tree, (list, tuple)) and not _is_plain_sequence(tree):
        for i, v in enumerate(tree):
            _walk(v, f"{prefix}{i}.", out)
    else:
        out.append((prefix.rstrip("."), tree))


def _is_plain_sequence(seq: list[Any] | tuple[Any, ...]) -> bool:
    """A short sequence of scalars (betas, a shape) is one leaf, not many."""
    return all(isinstance(v, (int, float, bool, str, type(None))) for v in seq)


#: Bytes a non-contiguous CPU tensor is staged through a host buffer in: a large
#: strided tensor is read piece by piece, never copied whole. (Tensors on other
#: devices are not staged: :func:`device_fingerprint` reads them where they are.)
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


def _block_sumsq(block: np.ndarray, dtype: torch.dtype, s: _Scratch) -> float:
    """The sum of squares of one block (at most :data:`BLOCK_BYTES`, uint8) of floats of ``dtype``."""
    if dtype == torch.float64:
        x64 = block.view(np.float64)
        sq64 = s.squares64[:x64.size]
        np.multiply(x64, x64, out=sq64)
        return float(np.add.reduce(sq64))
    if dtype == torch.float32:
        x = block.view(np.float32)
    else:  # 2- and 1-byte floats (bf16, f16, float8): upcast exactly to float32 first
        x = s.upcast[:block.size // dtype.itemsize]
        torch.from_numpy(x).copy_(torch.from_numpy(block).view(dtype))
    sq = s.squares32[:x.size]
    np.multiply(x, x, out=sq)
    part = float(np.add.reduce(sq))
    if not _F32_LOW <= part < math.inf and not (part == 0.0 and not block.any()):
        x64 = x.astype(np.float64)
        part = float(np.add.reduce(x64 * x64))
    return part


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
        self.hash = xxhash.xxh3_128(_header(t))
        self.dtype = t.dtype
        self.scratch = scratch
        self.sumsq: float | None = 0.0 if with_norm and t.is_floating_point() else None
        self.fill = 0

    def feed(self, data: np.ndarray) -> None:
        """Hash ``data`` (uint8, contiguous) and add its squares block by block."""
        if self.sumsq is None:
            self.hash.update(data.data)
            return
        n, pos = data.size, 0
        if self.fill:
            pos = min(BLOCK_BYTES - self.fill, n)
            self.hash.update(data[:pos].data)
            self.scratch.carry[self.fill:self.fill + pos] = data[:pos]
            self.fill += pos
            if self.fill < BLOCK_BYTES:
                return
            self._square(self.scratch.carry)
            self.fill = 0
        while n - pos >= BLOCK_BYTES:
            block = data[pos:pos + BLOCK_BYTES]
            self.hash.update(block.data)
            self._square(block)
            pos += BLOCK_BYTES
        if pos < n:
            rest = data[pos:]
            self.hash.update(rest.data)
            self.scratch.carry[:rest.size] = rest
            self.fill = rest.size

    def _square(self, block: np.ndarray) -> None:
        if self.sumsq is not None:  # squares are taken only with a norm to make
            self.sumsq += _block_sumsq(block, self.dtype, self.scratch)

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
    if not value.is_cpu:  # digest and norm on the tensor's own device, no host copy
        return device_fingerprint(value, with_norm)
    if value.dtype in _ONE_READ and 0 < value.numel() * value.element_size() <= BLOCK_BYTES:
        small = _small_fingerprint(value, scratch, with_norm)
        if small is not None:
            return small
    return _fingerprint_tensor(value.detach().resolve_conj().resolve_neg(), scratch, with_norm)


#: Dtypes whose CPU tensors numpy reads as they are: a small one (at most one block) is fingerprinted
#: by :func:`_small_fingerprint`, a few calls instead of a stream's.
_ONE_READ = frozenset({torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
                       torch.int8, torch.uint8, torch.bool})

#: The digest's header (dtype and shape) per (dtype, shape) seen: a job's states repeat few shapes.
_HEADERS: dict[tuple[torch.dtype, torch.Size], bytes] = {}


def _header(t: torch.Tensor) -> bytes:
    key = (t.dtype, t.shape)
    head = _HEADERS.get(key)
    if head is None:
        if len(_HEADERS) > 4096:  # shapes that keep changing (a varying batch): keep the cache bounded
            _HEADERS.clear()
        head = _HEADERS[key] = f"{t.dtype}{tuple(t.shape)}".encode()
    return head


def _small_fingerprint(t: torch.Tensor, scratch: _Scratch, with_norm: bool) -> tuple[str, float | None] | None:
    """The fingerprint of a CPU tensor of at most one block, bit for bit the stream's (its bytes in
    row-major order, hashed after the same header; its squares summed as the one block they are), read
    through numpy in one piece; None where numpy cannot read it (a tensor subclass, a negative view)."""
    try:
        data = np.ascontiguousarray((t.detach() if t.requires_grad else t).numpy()).reshape(-1).view(np.uint8)
    except (RuntimeError, TypeError, ValueError):
        return None
    h = xxhash.xxh3_128(_header(t))
    h.update(data.data)
    if not (with_norm and t.is_floating_point()):
        return h.hexdigest(), None
    return h.hexdigest(), math.sqrt(_block_sumsq(data, t.dtype, scratch))


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
    for piece in _pieces(src, STAGE_BYTES):
        nbytes = piece.numel() * piece.element_size()
        staged = scratch.stage(nbytes, pin=False)
        staged.view(piece.dtype).view(piece.shape).copy_(piece)
        stream.feed(staged.numpy())
    return stream.finish()


def fingerprint_leaf(value: Any, with_norm: bool = True, scratch: _Scratch | None = None) -> tuple[str, float | None]:
    """A 32-hex-digit fingerprint of a leaf, and its L2 norm if a floating tensor.

    A tensor's or numpy array's fingerprint covers its dtype, shape and bytes: xxh3-128
    on the host for a CPU tensor or an array, :func:`device_fingerprint` on its device
    for a tensor elsewhere (see the module's docstring); a plain
    value's its ``repr`` (a float its exact bits). The norm (None for anything but a floating
    tensor, or when ``with_norm`` is false) says how large a state is, so a
    divergence can tell a flipped bit in a big tensor from a tensor that drifted
    by a factor. ``scratch`` shares buffers across the leaves of one pass.
    """
    with np.errstate(all="ignore"):  # overflowing squares are expected: _block_sumsq redoes them in float64
        return _leaf_fingerprint(value, with_norm, scratch or _Scratch())


def _leaf_fingerprint(value: Any, with_norm: bool, scratch: _Scratch) -> tuple[str, float | None]:
    """:func:`fingerprint_leaf` inside the caller's ``np.errstate``."""
    if isinstance(value, torch.Tensor):
        return _tensor_fingerprint(value, scratch, with_norm)
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
        if comp != "optimizer":
            for key, leaf in flatten(tree):
                yield comp, key, leaf
            continue
        for key, leaf in flatten(tree):
            if param_names and key.startswith("state."):
                _, idx, rest = key.split(".", 2)
                key = f"state.{param_names.get(int(idx), idx)}.{rest}"
            elif key.startswith("param_groups.") and key.endswith(".params"):
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
    with np.errstate(all="ignore"):  # once per pass, not per leaf (see fingerprint_leaf)
        for comp, key, leaf in _named_leaves(components, param_names):
            digest, norm = _leaf_fingerprint(leaf, with_norms, scratch)
            digests[comp][key] = digest
            if norm is not None:
                norms.setdefault(comp, {})[key] = norm
    return digests, norms


def digest_components(components: Mapping[str, Any], param_names: Mapping[int, str] | None = None) -> dict[str, dict[str, str]]:
    """The digests of :func:`fingerprint_components`, without computing norms."""
    return fingerprint_components(components, param_names, with_norms=False)[0]
