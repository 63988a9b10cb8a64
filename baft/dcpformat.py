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
from .storage import Root

METADATA = ".metadata"
"""The file in which DCP keeps the checkpoint's metadata (``filesystem._metadata_fn``)."""


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


def load(root: Root, step: int, rank: int, stage_key: str, process_group: Any = None) -> dict[str, Any]:
    """Components of ``rank`` from a committed DCP checkpoint (with stock ``dcp.load``)."""
    d = persist.step_dir(root, step)
    md = reader(root, step).read_metadata().state_dict_metadata
    key = meta_key(rank)
    if key not in md:
        raise KeyError(f"{d}: no entry {key}")
    template: dict[str, torch.Tensor] = {}
    for name, item in md.items():
        if (name.startswith(f"{stage_key}/") or name == key) and isinstance(item, TensorStorageMetadata):
            template[name] = torch.empty(tuple(item.size), dtype=item.properties.dtype)
    dcp.load(template, storage_reader=reader(root, step), process_group=process_group)
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
