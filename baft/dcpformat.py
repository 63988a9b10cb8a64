"""The persistent tier in ``torch.distributed.checkpoint`` (DCP) format.

What a rank contributes to the DCP state dict:

``stage<S>/<component>.<path>``   every bulk tensor (parameters, buffers, optimizer
                                  tensors) of pipeline stage S, under a key shared
                                  by its data-parallel replicas; a DTensor (FSDP2,
                                  tensor parallelism) as the DTensor, so DCP stores
                                  the whole tensor from its shards and a load into
                                  another sharding (or none) reshards it;
``stage<S>.shard<K>/...``         a plain tensor of a rank that holds piece K of a
                                  sharded stage (its own copy: a buffer, a step);
``rank<R>/meta``                  a uint8 tensor holding ``torch.save`` of the rest
                                  (RNGs, data position, scheduler, step, optimizer
                                  hyper-parameters) with a marker for each bulk tensor.

Only tensors go into DCP, so a plain ``dcp.load`` reads the checkpoint and
nothing is unpickled beyond ``weights_only=True``: the default DCP load planner
unpickles non-tensor items with ``weights_only=False``, which this format never
asks it to do. The directory is committed like every persistent checkpoint
here: files made durable, a manifest with per-file checksums, then ``latest``;
and only if every file DCP's own metadata names is there, whole.

``root`` is a local directory (DCP's ``FileSystemWriter``/``FileSystemReader``,
files fsynced) or an fsspec URL (DCP's ``FsspecWriter``/``FsspecReader``).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter, StorageReader, StorageWriter
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from . import persist, storage
from .errors import CheckpointCorrupt
from .layout import MARKER, split
from .state import Placement, is_dtensor, placement_for
from .storage import Root

METADATA = ".metadata"
"""The file in which DCP keeps the checkpoint's metadata (``filesystem._metadata_fn``)."""


def meta_key(rank: int) -> str:
    return f"rank{rank}/meta"


def to_state_dict(components: dict[str, Any], rank: int, stage_key: str, owned: set[int] | None = None, *,
                  shard_key: str | None = None, placements: dict[str, Placement] | None = None) -> dict[str, torch.Tensor]:
    """The DCP state dict of one rank. ``owned``: indices of the bulk tensors this rank writes
    (data-parallel replicas split them); None: all. ``placements`` (:meth:`TrainState.placements`):
    local shards in ``components`` that are DTensors' are written as those DTensors."""
    skeleton, tensors = split(components)
    if placements:
        tensors = [(name, p.wrap(t) if (p := placement_for(placements, name, tuple(t.shape), local=True)) else t)
                   for name, t in tensors]
    names = [f"{stage_key if is_dtensor(t) else shard_key or stage_key}/{name}" for name, t in tensors]
    sd: dict[str, torch.Tensor] = {
        names[i]: t for i, (_, t) in enumerate(tensors) if owned is None or i in owned
    }
    blob = persist.serialize({"skeleton": skeleton, "names": names})
    sd[meta_key(rank)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    return sd


def _fsspec_classes() -> tuple[type[StorageReader], type[StorageWriter]]:
    """DCP's ``FsspecReader`` and ``FsspecWriter`` (they import fsspec: only for a URL root)."""
    try:
        from torch.distributed.checkpoint import FsspecReader, FsspecWriter  # type: ignore[attr-defined]
    except ImportError:  # torch 2.13 does not re-export them
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
    return FsspecReader, FsspecWriter


def writer(root: Root, step: int) -> StorageWriter:
    """A DCP storage writer for ``root/step-N`` (created if missing)."""
    st = storage.at(root)
    name = persist.step_name(step)
    st.makedirs(name)
    if isinstance(st, storage.FsspecStorage):
        return _fsspec_classes()[1](st.location(name), sync_files=st.needs_fsync)
    return FileSystemWriter(str(st.location(name)), sync_files=True)


def reader(root: Root, step: int) -> StorageReader:
    """A DCP storage reader of ``root/step-N``."""
    st = storage.at(root)
    d = st.location(persist.step_name(step))
    if isinstance(st, storage.FsspecStorage):
        return _fsspec_classes()[0](d)
    return FileSystemReader(str(d))


def save(root: Root, step: int, state_dict: dict[str, torch.Tensor], process_group: Any = None) -> None:
    """Blocking DCP save into ``root/step-N`` (call from a background thread for async)."""
    dcp.save(state_dict, storage_writer=writer(root, step), process_group=process_group)


def commit(root: Root, step: int, world_size: int, extra: dict[str, Any] | None = None) -> None:
    """Commit a finished DCP save (:func:`persist.commit_directory`), requiring the metadata
    file and every data file it names, each at least as long as the data DCP put in it.
    Raises :class:`CheckpointCorrupt`, leaving ``latest`` where it was, when one is not."""
    try:
        md = reader(root, step).read_metadata()
    except FileNotFoundError as e:
        raise CheckpointCorrupt(f"{persist.step_dir(root, step)}: no DCP metadata; step {step} not committed") from e
    required = {METADATA: 1}
    for info in (md.storage_data or {}).values():
        required[info.relative_path] = max(required.get(info.relative_path, 0), info.offset + info.length)
    persist.commit_directory(root, step, world_size, extra, required=required)


def load(root: Root, step: int, rank: int, process_group: Any = None, *,
         placements: dict[str, Placement] | None = None) -> dict[str, Any]:
    """Components of ``rank`` from a committed DCP checkpoint (with stock ``dcp.load``): the tensors its
    metadata names, each DTensor of ``placements`` loaded as this rank's shard of it (resharded if
    the checkpoint was written under another sharding)."""
    d = persist.step_dir(root, step)
    md = reader(root, step).read_metadata().state_dict_metadata
    key = meta_key(rank)
    if key not in md or not isinstance(md[key], TensorStorageMetadata):
        raise KeyError(f"{d}: no entry {key}")
    blob = {key: torch.empty(tuple(md[key].size), dtype=md[key].properties.dtype)}
    dcp.load(blob, storage_reader=reader(root, step), process_group=process_group)
    meta = persist.deserialize(blob[key].numpy().tobytes())
    names: list[str] = meta["names"]
    template: dict[str, Any] = {}
    for name in names:
        item = md.get(name)
        if not isinstance(item, TensorStorageMetadata):
            raise KeyError(f"{d}: no tensor {name} (named by {key})")
        size, dtype = tuple(item.size), item.properties.dtype
        p = placement_for(placements or {}, name.split("/", 1)[1], size, local=False)
        template[name] = p.empty(dtype) if p is not None and p.shape == size else torch.empty(size, dtype=dtype)
    dcp.load(template, storage_reader=reader(root, step), process_group=process_group)

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
