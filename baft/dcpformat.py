"""The persistent tier in ``torch.distributed.checkpoint`` (DCP) format.

What a rank contributes to the DCP state dict:

``stage<S>/<component>.<path>``   every bulk tensor (parameters, buffers, optimizer
                                  tensors) of pipeline stage S, under a key shared
                                  by its data-parallel replicas;
``rank<R>/meta``                  a uint8 tensor holding ``torch.save`` of the rest
                                  (RNGs, data position, scheduler, step, optimizer
                                  hyper-parameters) with a marker for each bulk tensor.

Only tensors go into DCP, so a plain ``dcp.load`` reads the checkpoint and
nothing is unpickled beyond ``weights_only=True``: the default DCP load planner
unpickles non-tensor items with ``weights_only=False``, which this format never
asks it to do. The directory is committed like every persistent checkpoint
here: files fsynced, a manifest with per-file checksums, then ``latest``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from . import persist
from .layout import MARKER, split


def meta_key(rank: int) -> str:
    return f"rank{rank}/meta"


def to_state_dict(components: dict[str, Any], rank: int, stage_key: str, owned: set[int] | None = None) -> dict[str, torch.Tensor]:
    """The DCP state dict of one rank. ``owned``: indices of the bulk tensors this rank writes
    (data-parallel replicas split them); None: all."""
    skeleton, tensors = split(components)
    names = [f"{stage_key}/{name}" for name, _ in tensors]
    sd: dict[str, torch.Tensor] = {
        names[i]: t for i, (_, t) in enumerate(tensors) if owned is None or i in owned
    }
    blob = persist.serialize({"skeleton": skeleton, "names": names})
    sd[meta_key(rank)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    return sd


def save(root: Path, step: int, state_dict: dict[str, torch.Tensor], process_group: Any = None) -> None:
    """Blocking DCP save into ``root/step-N`` (call from a background thread for async)."""
    d = persist.step_dir(root, step)
    d.mkdir(parents=True, exist_ok=True)
    dcp.save(state_dict, storage_writer=FileSystemWriter(str(d), sync_files=True), process_group=process_group)


def load(root: Path, step: int, rank: int, stage_key: str, process_group: Any = None) -> dict[str, Any]:
    """Components of ``rank`` from a committed DCP checkpoint (with stock ``dcp.load``)."""
    d = str(persist.step_dir(root, step))
    md = FileSystemReader(d).read_metadata().state_dict_metadata
    key = meta_key(rank)
    if key not in md:
        raise KeyError(f"{d}: no entry {key}")
    template: dict[str, torch.Tensor] = {}
    for name, item in md.items():
        if (name.startswith(f"{stage_key}/") or name == key) and isinstance(item, TensorStorageMetadata):
            template[name] = torch.empty(tuple(item.size), dtype=item.properties.dtype)
    dcp.load(template, checkpoint_id=d, process_group=process_group)
    meta = persist.deserialize(template[key].numpy().tobytes())
    names: list[str] = meta["names"]

    def fill(tree: Any) -> Any:
        if isinstance(tree, dict):
            if set(tree) == {MARKER}:
                return template[names[int(tree[MARKER])]]
            return {k: fill(v) for k, v in tree.items()}
        if isinstance(tree, list):
            return [fill(v) for v in tree]
        if isinstance(tree, tuple):
            return tuple(fill(v) for v in tree)
        return tree

    return fill(meta["skeleton"])
