"""The metadata of a snapshot slot: packed as the static part (the layout, the bulk tensors' tree, who
wrote it; the same for every version of one layout) and the dynamic part (RNGs, data position, step,
scheduler, the optimizer's groups), and decoded back into a version's components.

The static part of a gpt-tiny stage decodes in about a millisecond of Python; a persister that reads a
version from its slot every iteration decodes it once per layout (:func:`_decode_static`, cached by its
bytes): what it returns is shared, never to be changed by a caller.
"""
from __future__ import annotations

import functools
import struct
from typing import Any

import torch

from . import codec
from .components import COMPONENTS
from .layout import MARKER, TensorSpec, rebuild
from .snapshot import Slot


def specs(meta: dict[str, Any]) -> list[TensorSpec]:
    """The bulk tensors' places in the slot, from a decoded static part."""
    return [TensorSpec(name=n, dtype=d, shape=tuple(s), offset=o, nbytes=b) for n, d, s, o, b in meta["layout"]]


def only_markers(tree: Any) -> bool:
    """Whether ``tree`` holds nothing but tensor markers (then it belongs in the static part)."""
    if isinstance(tree, dict):
        return set(tree) == {MARKER} or all(only_markers(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return all(only_markers(v) for v in tree)
    return tree is None


def pack(static: bytes, dynamic: bytes) -> bytes:
    return struct.pack("<Q", len(static)) + static + dynamic


@functools.lru_cache(maxsize=8)
def _decode_static(data: bytes) -> tuple[dict[str, Any], list[TensorSpec]]:
    static = codec.decode(data)
    return static, specs(static)


def components(meta: bytes, data: torch.Tensor, copy: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """The components of a sealed version from its metadata and its slot's bytes (copies of them, or
    without ``copy`` views); and the static part (shared: read it, do not change it)."""
    (n,) = struct.unpack_from("<Q", meta, 0)
    static, layout = _decode_static(bytes(meta[8 : 8 + n]))
    dynamic = codec.decode(meta[8 + n :])
    bulk = dynamic.pop("bulk_skeleton", None)
    if bulk is None:
        bulk = {"model": static["model"]}
        if static.get("optimizer_state") is not None:
            bulk["optimizer"] = {"state": static["optimizer_state"]}
    out = dict(rebuild(bulk, layout, data, copy))
    if "optimizer_groups" in dynamic:
        out.setdefault("optimizer", {})["param_groups"] = dynamic.pop("optimizer_groups")
    for c, v in dynamic.items():
        out[c] = v
    return {c: out[c] for c in COMPONENTS if c in out}, static


def static_meta(slot: Slot) -> dict[str, Any] | None:
    """The static part of the metadata ``slot`` holds (None: none, or unreadable: a torn write)."""
    try:
        meta = slot.meta()
        (n,) = struct.unpack_from("<Q", meta, 0)
        out = _decode_static(bytes(meta[8 : 8 + n]))[0]
    except Exception:  # noqa: BLE001 - any garbage in a slot left by a killed writer reads as "unknown"
        return None
    return out if isinstance(out, dict) else None
