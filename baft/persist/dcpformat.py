"""The persistent tier in ``torch.distributed.checkpoint`` (DCP) format.

What a rank contributes to the DCP state dict, keyed the way
``torch.distributed.checkpoint.state_dict.get_state_dict`` keys a model and its optimizer
(fully qualified names), so a stock ``dcp.load`` reads it into a model laid out otherwise:

``model.<fqn>``                   a parameter or buffer of the model (a DTensor, from FSDP2 or tensor
                                  parallelism, as the DTensor: DCP stores the whole tensor from its
                                  shards and a load into another sharding, or none, reshards it);
``optimizer.state.<fqn>.<name>``  the optimizer's per-parameter state (Adam's ``exp_avg``, ``step``),
                                  keyed by its parameter's name instead of its index;
``stage<S>/<component>.<path>``   what has no such name, and any name two pipeline stages both use
                                  (the stages' modules named alike, not after the whole model: the
                                  stage key keeps them apart; a ``checkpoint_keys`` event says which;
                                  the direct writer, :mod:`baft.persist.dcpwrite`, puts ``stage<S>/`` before
                                  the shared name itself);
``stage<S>.shard<K>/...``         a plain buffer of a rank that holds piece K of a sharded stage (its
                                  own copy: BatchNorm statistics of its part of the batch);
``rank<R>/meta``                  a uint8 tensor holding ``torch.save`` of the rest
                                  (RNGs, data position, scheduler, step, optimizer
                                  hyper-parameters) with a marker for each bulk tensor.

Data-parallel replicas of a stage write the same keys (each its share of them, ``owned``); a
model whose stages keep the whole model's names (torchtitan's: each stage the whole model with the
other layers deleted) gives keys that a job with another stage count, or one process holding the
whole model, loads with stock DCP (:func:`load_model`).

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

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import (
    FileSystemReader,
    FileSystemWriter,
    StorageReader,
    StorageWriter,
)
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from baft import events
from baft.errors import CheckpointCorrupt
from baft.persist import commits as persist
from baft.persist import storage
from baft.persist.storage import Root
from baft.state.dtensor import TensorPlacement, is_dtensor, placement_for
from baft.state.layout import MARKER, split

METADATA = ".metadata"
"""The file in which DCP keeps the checkpoint's metadata (``filesystem._metadata_fn``)."""


def meta_key(rank: int) -> str:
    return f"rank{rank}/meta"


def dcp_keys(tensors: list[tuple[str, Any]], stage_key: str, shard_key: str | None = None,
             param_names: Mapping[int, str] | None = None) -> list[str]:
    """The DCP key of each bulk tensor (``(path, tensor)`` in :func:`baft.state.layout.split` order): its
    fully qualified name where every rank that holds it holds the same values (module docstring),
    else under the stage's (or the shard's) key."""
    names = param_names or {}
    params = set(names.values())
    keys = []
    for path, t in tensors:
        comp, _, rest = path.partition(".")
        idx, _, leaf = rest.removeprefix("state.").partition(".")
        if comp == "model" and (shard_key is None or is_dtensor(t) or rest in params):
            keys.append(path)
        elif comp == "optimizer" and rest.startswith("state.") and idx.isdigit() and int(idx) in names and leaf:
            keys.append(f"optimizer.state.{names[int(idx)]}.{leaf}")
        else:
            keys.append(f"{shard_key if shard_key and not is_dtensor(t) else stage_key}/{path}")
    return keys


def shared_by_stages(keys: list[str], stage_key: str, process_group: Any = None) -> set[str]:
    """The unprefixed keys of ``keys`` that ranks of another stage also write (collective over
    ``process_group``, every rank with its own keys): DCP would keep one of them, so those go under
    the stage key instead. Outside a process group, none."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return set()
    mine = sorted(k for k in keys if "/" not in k)
    everyone: list[Any] = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(everyone, (stage_key, mine), group=process_group)
    stages_of: dict[str, set[str]] = {}
    for stage, ks in everyone:
        for k in ks:
            stages_of.setdefault(k, set()).add(stage)
    return {k for k in mine if len(stages_of[k]) > 1}


def announce_stage_keys(shared: set[str]) -> None:
    """Journal that ``shared`` (keys two stages both wrote) went under their stages' keys."""
    events.emit("checkpoint_keys", stage_keyed=len(shared), example=min(shared),
                why="another pipeline stage's module has a tensor of the same name; name stage modules "
                    "after the whole model for keys that reshard across stage counts")


def to_state_dict(components: dict[str, Any], rank: int, stage_key: str, owned: set[int] | None = None, *,
                  shard_key: str | None = None, placements: dict[str, TensorPlacement] | None = None,
                  param_names: Mapping[int, str] | None = None, process_group: Any = None,
                  exchange_keys: bool = True, host_shards: bool = False) -> dict[str, Any]:
    """The DCP state dict of one rank (collective over ``process_group``: :func:`shared_by_stages`;
    without ``exchange_keys`` not, and keys two stages share are left to the metadata's writer,
    :func:`baft.persist.dcpwrite.stage_keyed`).
    ``owned``: indices of the bulk tensors this rank writes (data-parallel replicas split them);
    None: all. ``placements`` (:meth:`TrainState.placements`): local shards in ``components`` that are
    DTensors' are written as those DTensors. ``param_names`` (:meth:`TrainState.param_names`): the
    optimizer's parameter index -> name, for its FQN keys. ``host_shards``: those shards as
    :class:`~baft.state.dtensor.HostShard` where they lie (for baft's own writer, :mod:`baft.persist.dcpwrite`),
    not DTensors (for ``dcp.save``; on a CUDA mesh a DTensor moves its host shard to the device)."""
    skeleton, plain = split(components)
    tensors: list[tuple[str, Any]] = list(plain)
    if placements:
        tensors = [(name, (p.shard(t) if host_shards else p.wrap(t))
                    if (p := placement_for(placements, name, tuple(t.shape), local=True)) else t)
                   for name, t in plain]
    names = dcp_keys(tensors, stage_key, shard_key, param_names)
    if exchange_keys and (shared := shared_by_stages(names, stage_key, process_group)):
        names = [f"{stage_key}/{tensors[i][0]}" if k in shared else k for i, k in enumerate(names)]
        announce_stage_keys(shared)
    sd: dict[str, Any] = {
        names[i]: t for i, (_, t) in enumerate(tensors) if owned is None or i in owned
    }
    blob = persist.serialize({"skeleton": skeleton, "names": names, "paths": [name for name, _ in tensors],
                              "stage_key": stage_key})
    sd[meta_key(rank)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    return sd


def _fsspec_classes() -> tuple[Any, Any]:
    """DCP's ``FsspecReader`` and ``FsspecWriter`` (they import fsspec: only for a URL root)."""
    try:
        from torch.distributed.checkpoint import FsspecReader, FsspecWriter  # type: ignore[attr-defined]
    except ImportError:  # torch 2.13 does not re-export them
        from torch.distributed.checkpoint._fsspec_filesystem import (
            FsspecReader,
            FsspecWriter,
        )
    return FsspecReader, FsspecWriter


def writer(root: Root, step: int) -> StorageWriter:
    """A DCP storage writer for ``root/step-N`` (created if missing)."""
    st = storage.at(root)
    name = persist.step_name(step)
    st.makedirs(name)
    if isinstance(st, storage.FsspecStorage):
        fsspec_writer: StorageWriter = _fsspec_classes()[1](st.location(name), sync_files=st.needs_fsync)
        return fsspec_writer
    return FileSystemWriter(str(st.location(name)), sync_files=True)


def reader(root: Root, step: int) -> StorageReader:
    """A DCP storage reader of ``root/step-N``."""
    st = storage.at(root)
    d = st.location(persist.step_name(step))
    if isinstance(st, storage.FsspecStorage):
        fsspec_reader: StorageReader = _fsspec_classes()[0](d)
        return fsspec_reader
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
         placements: dict[str, TensorPlacement] | None = None) -> dict[str, Any]:
    """Components of ``rank`` from a committed DCP checkpoint (with stock ``dcp.load``): the tensors its
    metadata names, each DTensor of ``placements`` loaded as this rank's shard of it (resharded if
    the checkpoint was written under another sharding)."""
    d = persist.step_dir(root, step)
    md = reader(root, step).read_metadata().state_dict_metadata
    key = meta_key(rank)
    entry = md.get(key)
    if not isinstance(entry, TensorStorageMetadata):
        raise KeyError(f"{d}: no entry {key}")
    blob = {key: torch.empty(tuple(entry.size), dtype=entry.properties.dtype)}
    dcp.load(blob, storage_reader=reader(root, step), process_group=process_group)
    meta = persist.deserialize(blob[key].numpy().tobytes())
    paths: list[str] = meta.get("paths") or [n.split("/", 1)[1] for n in meta["names"]]  # before FQN keys: prefixed
    # a name another stage also wrote is under this stage's key (baft.persist.dcpwrite.stage_keyed)
    names = [n if n in md or "stage_key" not in meta else f"{meta['stage_key']}/{n}" for n in meta["names"]]
    template: dict[str, Any] = {}
    for name, path in zip(names, paths):
        item = md.get(name)
        if not isinstance(item, TensorStorageMetadata):
            raise KeyError(f"{d}: no tensor {name} (named by {key})")
        size, dtype = tuple(item.size), item.properties.dtype
        p = placement_for(placements or {}, path, size, local=False)
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

    state: dict[str, Any] = fill(meta["skeleton"])
    return state


def load_restaged(root: Root, step: int, source: int, live: Mapping[str, Any], param_names: Mapping[int, str],
                  process_group: Any = None) -> dict[str, Any]:
    """Components for a rank of a job cut into other pipeline stages than the one that wrote the checkpoint
    (collective over ``process_group``, as :func:`load`): the model's tensors (``model.<fqn>``) and the
    optimizer's per-parameter tensors (``optimizer.state.<fqn>.<name>``) by name, whichever old stage wrote
    them; the rest (RNGs, data position, scheduler, scaler, step, the optimizer's hyper-parameters) from old
    rank ``source``'s record. ``live``: this rank's ``model`` and ``optimizer`` components (their keys and
    parameter groups); ``param_names``: its optimizer's parameter index -> name. Plain tensors only."""
    d = persist.step_dir(root, step)
    old = load(root, step, source, process_group)
    md = reader(root, step).read_metadata().state_dict_metadata

    def empty(key: str, what: str) -> torch.Tensor:
        item = md.get(key)
        if not isinstance(item, TensorStorageMetadata):
            raise CheckpointCorrupt(f"{d}: no tensor {key} for {what}; a restore across stage counts needs every "
                                    "stage's tensors under the whole model's names")
        return torch.empty(tuple(item.size), dtype=item.properties.dtype)

    def model_key(k: str) -> str:
        """Where the checkpoint holds model tensor ``k``: under its name, or under the key of the one stage
        that wrote it (a plain buffer of a rank with a shard key); several stages under one name: refused."""
        if f"model.{k}" in md:
            return f"model.{k}"
        staged = sorted(m for m in md if m.endswith(f"/model.{k}"))
        if len(staged) > 1:
            raise CheckpointCorrupt(f"{d}: model key {k} was written by several stages ({', '.join(staged)}): "
                                    "their modules name their tensors alike, so a restore across stage counts "
                                    "cannot tell which is this stage's")
        return staged[0] if staged else f"model.{k}"

    where = {k: model_key(k) for k in live["model"]}
    template = {where[k]: empty(where[k], f"model key {k}") for k in live["model"]}
    moments = bool((old.get("optimizer") or {}).get("state"))
    leaves: dict[int, list[str]] = {}
    for idx, name in param_names.items():
        prefix = f"optimizer.state.{name}."
        leaves[idx] = sorted(k[len(prefix):] for k in md if k.startswith(prefix))
        if moments and not leaves[idx]:  # the old stages' optimizers had state: every parameter's is named
            raise CheckpointCorrupt(f"{d}: no optimizer.state.{name}.* for parameter {name}; a restore across "
                                    "stage counts needs the optimizer's state under the whole model's names")
        template.update((prefix + leaf, empty(prefix + leaf, f"parameter {name}")) for leaf in leaves[idx])
    dcp.load(template, storage_reader=reader(root, step), process_group=process_group)
    components = {**old, "model": {k: template[where[k]] for k in live["model"]}}
    if "optimizer" in live and "optimizer" in old:
        groups = old["optimizer"].get("param_groups") or [{}]
        components["optimizer"] = {
            "state": {idx: {leaf: template[f"optimizer.state.{param_names[idx]}.{leaf}"] for leaf in ls}
                      for idx, ls in leaves.items() if ls},
            "param_groups": [{**{k: v for k, v in groups[min(i, len(groups) - 1)].items() if k != "params"},
                              "params": g["params"]} for i, g in enumerate(live["optimizer"]["param_groups"])],
        }
    return components


def load_model(root: Root, model: torch.nn.Module, step: int | None = None) -> int:
    """Load the model tensors of a committed DCP checkpoint (the newest, or ``step``) into ``model``,
    by name, with stock ``dcp.load``: any module whose names are the job's, laid out any way (one
    process holding the whole model, another stage count, another sharding: a DTensor loads as its
    shard). Returns the step. Call it in a process group as DCP does, or without one in one process."""
    import torch.distributed as dist

    if step is None:
        steps = persist.committed_steps(root)
        if not steps:
            raise CheckpointCorrupt(f"{root}: no committed checkpoint")
        step = steps[0]
    live = model.state_dict()
    md = reader(root, step).read_metadata().state_dict_metadata
    missing = [k for k in live if f"model.{k}" not in md]
    if missing:
        raise KeyError(f"{persist.step_dir(root, step)}: no model.{missing[0]} (and {len(missing) - 1} more "
                       "missing); the checkpoint's stages name their tensors otherwise")
    sd = {f"model.{k}": v for k, v in live.items()}
    dcp.load(sd, storage_reader=reader(root, step), no_dist=not (dist.is_available() and dist.is_initialized()))
    model.load_state_dict({k: sd[f"model.{k}"] for k in live})  # DCP filled the tensors state_dict gave; a
    # module whose state_dict returns copies (its own hooks) gets them here
    return step
