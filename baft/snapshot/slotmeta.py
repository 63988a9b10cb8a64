"""The metadata of a snapshot slot: packed as the static part (the layout, the bulk tensors' tree, who
wrote it; the same for every version of one layout) and the dynamic part (RNGs, data position, step,
scheduler, the optimizer's groups), and decoded back into a version's components.

The static part of a gpt-tiny stage decodes in about a millisecond of Python; a persister that reads a
version from its slot every iteration decodes it once per layout (:func:`_decode_static`, cached by its
bytes), and with a cache of views (:data:`Views`) the views of a slot's tensors once per slot and
layout (another ~4 ms): what they return is shared, never to be changed by a caller.
"""
from __future__ import annotations

import functools
import struct
from typing import Any

import torch

from baft.components import COMPONENTS
from baft.snapshot.slots import Slot, SnapshotBuffer
from baft.state import codec
from baft.state.layout import MARKER, TensorSpec, rebuild


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


Views = dict[tuple[int, int, int], tuple[dict[str, Any], dict[str, Any]]]
"""A reader's cache of slot views: (id of a decoded static part, address and size of a slot's bytes) ->
(that static part, the views of its bulk tensors in those bytes). Each slot has one
(:attr:`baft.snapshot.slots.Slot.views`), cleared before its mapping is closed: the views keep no buffer exported, so an unmapped one would fault."""


def _bulk_views(static: dict[str, Any], bulk: dict[str, Any], layout: list[TensorSpec], data: torch.Tensor,
                views: Views) -> dict[str, Any]:
    """The views of ``data`` that a static part's bulk tree names, made once per slot and layout."""
    key = (id(static), data.data_ptr(), data.numel())
    hit = views.get(key)
    if hit is not None and hit[0] is static:
        found: dict[str, Any] = hit[1]
        return found
    tree: dict[str, Any] = rebuild(bulk, layout, data, copy=False)
    views[key] = (static, tree)
    return tree


def components(meta: bytes, data: torch.Tensor, copy: bool = True,
               views: Views | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The components of a sealed version from its metadata and its slot's bytes (copies of them, or
    without ``copy`` views; with a ``views`` cache the same views each time: read them, do not change
    the trees); and the static part (shared: do not change it)."""
    (n,) = struct.unpack_from("<Q", meta, 0)
    static, layout = _decode_static(bytes(meta[8 : 8 + n]))
    dynamic = codec.decode(meta[8 + n :])
    bulk = dynamic.pop("bulk_skeleton", None)
    if bulk is None:
        bulk = {"model": static["model"]}
        if static.get("optimizer_state") is not None:
            bulk["optimizer"] = {"state": static["optimizer_state"]}
        out = dict(_bulk_views(static, bulk, layout, data, views) if views is not None and not copy
                   else rebuild(bulk, layout, data, copy))
    else:
        out = dict(rebuild(bulk, layout, data, copy))
    if "optimizer_groups" in dynamic:
        out["optimizer"] = {**out.get("optimizer", {}), "param_groups": dynamic.pop("optimizer_groups")}  # not in place: shared
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


def writer_place(slot: Slot) -> tuple[int, int]:
    """(replica, replicas) of whoever wrote the version in ``slot``: which share of the tensors it holds."""
    meta = static_meta(slot) or {}
    return int(meta.get("replica", 0)), int(meta.get("replicas", 1))


def saved_replicas(buffer: SnapshotBuffer, complete: dict[int, int]) -> int:
    """How many data-parallel replicas made the newest complete version in ``buffer`` (0: none)."""
    if not complete:
        return 0
    return writer_place(buffer.slots[complete[max(complete)]])[1]
