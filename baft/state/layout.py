"""Split captured state into big tensors (copied into shared memory) and a small skeleton.

The model and optimizer components hold the bulk of the state and do not
change between two optimizer steps, so their tensors are copied chunk by chunk
during the bubbles. Everything else (scheduler, RNGs, data position, step) is
tiny and is captured whole at the step boundary. The skeleton is the captured
tree with each bulk tensor replaced by a marker ``{"__shm__": i}``; it loads
with ``weights_only=True`` like every other checkpoint file.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

BULK_COMPONENTS = ("model", "optimizer")
MARKER = "__shm__"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Where one bulk tensor lives in the flat byte range."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def _replace(tree: Any, path: str, out: list[tuple[str, torch.Tensor]]) -> Any:
    if isinstance(tree, torch.Tensor):
        out.append((path, tree))
        return {MARKER: len(out) - 1}
    if isinstance(tree, Mapping):
        return {k: _replace(v, f"{path}.{k}", out) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_replace(v, f"{path}.{i}", out) for i, v in enumerate(tree)]
    if isinstance(tree, tuple):
        return tuple(_replace(v, f"{path}.{i}", out) for i, v in enumerate(tree))
    return tree


def split(components: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, torch.Tensor]]]:
    """The skeleton and the bulk tensors (name, live tensor) in layout order."""
    tensors: list[tuple[str, torch.Tensor]] = []
    skeleton = {}
    for comp, tree in components.items():
        skeleton[comp] = _replace(tree, comp, tensors) if comp in BULK_COMPONENTS else tree
    return skeleton, tensors


def layout(tensors: list[tuple[str, torch.Tensor]], align: int = 64) -> list[TensorSpec]:
    specs = []
    offset = 0
    for name, t in tensors:
        n = t.numel() * t.element_size()
        specs.append(TensorSpec(name=name, dtype=str(t.dtype).removeprefix("torch."), shape=tuple(t.shape), offset=offset, nbytes=n))
        offset += (n + align - 1) // align * align
    return specs


def total_bytes(specs: list[TensorSpec]) -> int:
    return (specs[-1].offset + specs[-1].nbytes) if specs else 0


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor's storage (no copy)."""
    t = t.detach()
    if not t.is_contiguous():
        raise ValueError("bulk tensors must be contiguous")
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def rebuild(skeleton: Any, specs: list[TensorSpec], data: torch.Tensor, copy: bool = True) -> Any:
    """The captured tree again, each marker replaced by a copy of its tensor from ``data`` (without
    ``copy``: by a view of ``data``)."""
    if isinstance(skeleton, Mapping):
        if set(skeleton) == {MARKER}:
            s = specs[int(skeleton[MARKER])]
            raw = data[s.offset : s.offset + s.nbytes]
            return (raw.clone() if copy else raw).view(getattr(torch, s.dtype)).reshape(s.shape)
        return {k: rebuild(v, specs, data, copy) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [rebuild(v, specs, data, copy) for v in skeleton]
    if isinstance(skeleton, tuple):
        return tuple(rebuild(v, specs, data, copy) for v in skeleton)
    return skeleton
