"""A rank's share of a DCP checkpoint written straight from its tensors' bytes, without ``dcp.save``.

``dcp.save`` plans every save anew (a local plan per rank, a global plan on rank 0, both
exchanged), then serialises each tensor with ``torch.save``: per persist, tens of milliseconds of
Python on a background thread that shares the interpreter lock and the cores with training, and
four collectives that need every rank's persister to be scheduled. What the persistent tier
writes is the same every time but for the tensors' values, so this writer does the work once:

* each tensor's record in the data file (DCP's ``torch_save`` format: one ``torch.save`` archive
  per tensor, a zip without compression) is ``torch.save``'s bytes of a tensor of that dtype and
  shape, with the tensor's bytes in the data entry and that entry's CRC-32 patched in the local
  and central headers (:class:`SaveTemplate`, made once per dtype and shape, checked by loading
  it back when made);
* a rank writes its file with one buffered ``writelines`` straight from its tensors (views of the
  sealed shared-memory slot: no second copy), then reports what it wrote (:class:`RankReport`:
  the chunks, the file's size and checksum), in the one exchange of a persist;
* rank 0 writes DCP's ``.metadata`` from every rank's report (the tensors' global sizes, each
  rank's chunk, where its bytes are; keys two stages both wrote go under each stage's key) and
  commits without reading anything back; a stock ``dcp.load`` (``FileSystemReader``) reads the
  checkpoint as if ``dcp.save`` had written it, into any sharding.
"""
from __future__ import annotations

import ctypes
import functools
import io
import pickle
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from baft.errors import CheckpointCorrupt
from baft.persist import commits as persist
from baft.persist import storage
from baft.persist.storage import Root
from baft.persist.writer import WriterProcess, crc32_digest
from baft.state.dtensor import HostShard, is_dtensor

METADATA = ".metadata"
LOCAL_HEADER = b"PK\x03\x04"
CENTRAL_HEADER = b"PK\x01\x02"
#: A write of ``torch.save`` at least this long is the tensor's data: the template keeps its place only.
_DATA_WRITE = 1 << 12
#: Templates up to this size are checked by loading one back with a known pattern when they are made.
_CHECKED = 1 << 20


def data_file(rank: int) -> str:
    """The data file of ``rank`` (the name ``FileSystemWriter`` gives a rank's first file)."""
    return f"__{rank}_0.distcp"


class _Recorder:
    """A write-only stream for ``torch.save`` that keeps its small writes and only the place of a large
    one (the data: a template never holds a tensor's bytes)."""

    def __init__(self) -> None:
        self.pos = 0
        self.parts: list[tuple[int, bytes | int]] = []

    def write(self, b: Any) -> int:
        n = memoryview(b).nbytes
        self.parts.append((self.pos, n if n >= _DATA_WRITE else bytes(b)))
        self.pos += n
        return n

    def flush(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class SaveTemplate:
    """``torch.save``'s archive of one tensor of some dtype and shape, but for its data: the bytes
    before and after the data entry and where the entry's CRC-32 sits in each."""

    head: bytes
    tail: bytes
    nbytes: int
    head_crc: int
    tail_crc: int

    @property
    def length(self) -> int:
        return len(self.head) + self.nbytes + len(self.tail)

    def parts(self, data: memoryview) -> tuple[bytes, memoryview, bytes]:
        """The archive of a tensor whose bytes are ``data``, as three buffers."""
        if data.nbytes != self.nbytes:
            raise ValueError(f"{data.nbytes} bytes for a template of {self.nbytes}")
        crc = struct.pack("<I", zlib.crc32(data) & 0xFFFFFFFF)
        return (self.head[: self.head_crc] + crc + self.head[self.head_crc + 4 :], data,
                self.tail[: self.tail_crc] + crc + self.tail[self.tail_crc + 4 :])


def _image(parts: list[tuple[int, bytes | int]], start: int, end: int) -> bytes:
    """The recorded bytes in [start, end) (none of them a large write)."""
    out = bytearray()
    for pos, b in parts:
        if start <= pos < end:
            if isinstance(b, int):
                raise CheckpointCorrupt("torch.save wrote an archive this writer cannot read")
            out += b
    return bytes(out)


@functools.lru_cache(maxsize=4096)
def save_template(dtype: torch.dtype, shape: tuple[int, ...]) -> SaveTemplate:
    """The :class:`SaveTemplate` of tensors of ``dtype`` and ``shape`` (made with ``torch.save`` of an
    uninitialised one, whose pages a large tensor never touches)."""
    t = torch.empty(shape, dtype=dtype)
    nbytes = t.numel() * t.element_size()
    rec = _Recorder()
    torch.save(t, rec)  # type: ignore[arg-type]  # a file-like object: write() and tell() are all it calls
    data_at = next((pos for pos, b in rec.parts if isinstance(b, int) and b == nbytes), None)
    if data_at is None:  # small: the data is one of the kept writes; the local header says where
        whole = _image(rec.parts, 0, rec.pos)
        data_at = _data_offset(whole)
    head, tail = _image(rec.parts, 0, data_at), _image(rec.parts, data_at + nbytes, rec.pos)
    if len(head) != data_at or len(head) + nbytes + len(tail) != rec.pos:
        raise CheckpointCorrupt("torch.save wrote the tensor's data in pieces; this writer needs it whole")
    local = head.rfind(LOCAL_HEADER)  # the data entry's local header: the last one before the data
    name_len = struct.unpack_from("<H", head, local + 26)[0] if local >= 0 else 0
    name = head[local + 30 : local + 30 + name_len]
    central = tail.find(CENTRAL_HEADER)
    while central >= 0:  # the same entry in the central directory, after the data
        n = struct.unpack_from("<H", tail, central + 28)[0]
        if tail[central + 46 : central + 46 + n] == name:
            break
        central = tail.find(CENTRAL_HEADER, central + 4)
    if local < 0 or central < 0 or not name.endswith(b"/data/0"):
        raise CheckpointCorrupt(f"torch.save's archive of a {dtype} tensor has no data entry this writer knows")
    template = SaveTemplate(head=head, tail=tail, nbytes=nbytes, head_crc=local + 14, tail_crc=central + 16)
    if nbytes <= _CHECKED:
        _check(template, dtype, shape)
    return template


def _data_offset(archive: bytes) -> int:
    """Where the data entry's bytes start in a whole archive (after its local header, name, extra)."""
    at = 0
    while (at := archive.find(LOCAL_HEADER, at)) >= 0:
        name_len, extra_len = struct.unpack_from("<HH", archive, at + 26)
        if archive[at + 30 : at + 30 + name_len].endswith(b"/data/0"):
            return int(at + 30 + name_len + extra_len)
        at += 4
    raise CheckpointCorrupt("torch.save's archive has no data entry this writer knows")


def _check(template: SaveTemplate, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """Load a patched archive back: it must be a tensor of ``dtype`` and ``shape`` holding the bytes put in."""
    pattern = bytes((7 * i + 3) & 0x7F for i in range(template.nbytes))  # no NaN patterns matter: bytes compared
    loaded = torch.load(io.BytesIO(b"".join(template.parts(memoryview(pattern)))), weights_only=True)
    if loaded.dtype != dtype or tuple(loaded.shape) != shape or bytes(tensor_bytes(loaded)) != pattern:
        raise CheckpointCorrupt(f"a patched torch.save archive of a {dtype} tensor did not load back as written")


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of tensor ``t`` in row-major order: a view of its memory when it is a contiguous CPU
    tensor (the view keeps it alive), else of a contiguous CPU copy."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    n = t.numel() * t.element_size()
    if not n:
        return memoryview(b"")
    memory = (ctypes.c_char * n).from_address(t.data_ptr())
    memory.owner = t  # type: ignore[attr-defined]  # the tensor lives as long as a view of its bytes
    return memoryview(memory).cast("B")


class Written(NamedTuple):
    """One tensor chunk a rank wrote: its DCP key, the whole tensor's dtype and size, the chunk's
    offsets and sizes in it, and where its record is in the rank's file. (A tuple: a report of a few
    hundred pickles, hashes and compares several times faster than as dataclasses.)"""

    key: str
    dtype: str
    size: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class RankReport:
    """What one rank wrote into checkpoint ``step``: its stage's key, its file (name, size, CRC-32
    checksum, the file durable) and the chunks in it."""

    rank: int
    stage: str
    file: str
    size: int
    checksum: str
    items: tuple[Written, ...]


def chunk_of(t: Any) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """A state-dict value as (its local tensor, the whole tensor's size, the local chunk's offsets):
    a DTensor's (or a :class:`~baft.state.dtensor.HostShard`'s) shard where its placement puts it, a plain tensor
    as the whole."""
    if isinstance(t, HostShard):
        return t.local, t.shape, t.offsets
    if is_dtensor(t):
        chunks = t.__create_chunk_list__()
        if len(chunks) != 1:
            raise CheckpointCorrupt(f"a DTensor with {len(chunks)} local chunks; this writer takes one")
        return t.to_local(), tuple(t.shape), tuple(chunks[0].offsets)
    return t, tuple(t.shape), (0,) * t.dim()


def write_rank(root: Root, step: int, rank: int, stage: str, state_dict: Mapping[str, Any], *,
               writer: WriterProcess | None = None, slot: Any = None) -> RankReport:
    """Write ``rank``'s tensors of ``state_dict`` (DCP keys -> tensors or DTensors; ``stage``: the key of
    its pipeline stage) into its data file of checkpoint ``step``, durably (the directory entry is made
    durable by the commit, :func:`commit`); what it wrote. With ``writer`` (a local ``root``), that
    process writes the file, reading the tensors that are views of ``slot`` (a mapped
    :class:`baft.snapshot.slots.Slot`) from its file; else this thread writes it."""
    name = data_file(rank)
    rel = f"{persist.step_name(step)}/{name}"
    st = storage.at(root)
    plan, locals_ = _plan(rank, slot, state_dict)
    records = [(e.template, local) for e, local in zip(plan.entries, locals_)]
    pos = plan.length
    if writer is not None and isinstance(st, storage.LocalStorage):
        st.makedirs(persist.step_name(step))
        written, checksum = writer.write(str(st.location(rel)), str(slot.path) if slot is not None else "",
                                         [e.wire for e in plan.entries])
    else:
        parts: list[bytes | memoryview] = []
        for template, local in records:
            parts.extend(template.parts(tensor_bytes(local)))
        st.write_parts(rel, parts, sync_dir=False)
        written, checksum = pos, crc32_digest(parts)
    if written != pos:
        raise CheckpointCorrupt(f"{st.location(rel)}: {written} bytes written, {pos} meant")
    return RankReport(rank=rank, stage=stage, file=name, size=pos, checksum=checksum,
                      items=tuple(e.item for e in plan.entries))


class _Entry(NamedTuple):
    """One tensor of a rank's file: its template, what the file records of it, and what the writer process is sent."""

    template: SaveTemplate
    item: Written
    wire: tuple[tuple[bytes, bytes, int, int], tuple[int, int] | bytes]


@dataclass(slots=True)
class _Plan:
    """A rank's file as last written from one slot: each tensor's entry, in the file's order, and by key the
    tensor it was made for (the slot's views, kept alive here so that ``is`` cannot match another tensor)."""

    entries: list[_Entry]
    by_key: dict[str, tuple[Any, _Entry]]

    @property
    def length(self) -> int:
        return self.entries[-1].item.offset + self.entries[-1].item.length if self.entries else 0


#: The last plan of each (rank, slot file, slot mapping): a persist from the same slot finds the same views (the
#: snapshotter caches them per slot and layout), and their entries are reused, not made again (~1 ms of Python
#: per persist for 100 tensors).
_PLANS: dict[tuple[int, str, int], _Plan] = {}
_PLANS_KEPT = 16


def _plan(rank: int, slot: Any, state_dict: Mapping[str, Any]) -> tuple[_Plan, list[torch.Tensor]]:
    """The entries of ``state_dict``'s tensors in a rank's file, and each one's local tensor (a DTensor's shard).
    An entry of the last plan of the same slot is reused for the same key and the same plain tensor object when
    its bytes are a range of the slot (read when the file is written; bytes sent by value are taken anew). Only a
    slot's views are kept alive here, never a private copy."""
    where = (rank, str(slot.path), slot.bytes.data_ptr()) if slot is not None else None
    last = _PLANS.get(where) if where is not None else None
    known = last.by_key if last is not None else {}
    entries: list[_Entry] = []
    locals_: list[torch.Tensor] = []
    pos = 0
    for key, value in state_dict.items():
        old = known.get(key)
        if old is not None and old[0] is value and isinstance(old[1].wire[1], tuple) and not is_dtensor(value):
            e = old[1]
            local = value
            if e.item.offset != pos:
                e = e._replace(item=e.item._replace(offset=pos))
        else:
            local, size, offsets = chunk_of(value)
            template = save_template(local.dtype, tuple(local.shape))
            item = Written(key=key, dtype=str(local.dtype).removeprefix("torch."), size=size, offsets=offsets,
                           sizes=tuple(local.shape), offset=pos, length=template.length)
            e = _Entry(template, item, ((template.head, template.tail, template.head_crc, template.tail_crc),
                                        _source(local, slot)))
        entries.append(e)
        locals_.append(local)
        pos += e.item.length
    plan = _Plan(entries, {k: (v, e) for (k, v), e in zip(state_dict.items(), entries)})
    if where is not None:
        _PLANS.pop(where, None)
        _PLANS[where] = plan
        while len(_PLANS) > _PLANS_KEPT:
            del _PLANS[next(iter(_PLANS))]
    return plan, locals_


def _source(t: torch.Tensor, slot: Any) -> tuple[int, int] | bytes:
    """Where the writer process finds ``t``'s bytes: its range in the slot file when it is a contiguous
    view of the mapped slot, else the bytes themselves."""
    n = t.numel() * t.element_size()
    if slot is not None and t.device.type == "cpu" and t.is_contiguous() and n:
        offset = t.data_ptr() - slot.bytes.data_ptr()
        if 0 <= offset and offset + n <= slot.bytes.numel():
            return offset, n
    return bytes(tensor_bytes(t))


def stage_keyed(reports: Iterable[RankReport]) -> set[str]:
    """The keys that ranks of more than one pipeline stage wrote (their stages' modules name tensors
    alike): each stage's go under ``<stage>/<key>`` instead, or DCP would keep one stage's. A loader
    that finds no ``key`` looks for its stage's (:func:`baft.persist.dcpformat.load`)."""
    stages: dict[str, set[str]] = {}
    for r in reports:
        for w in r.items:
            if "/" not in w.key:
                stages.setdefault(w.key, set()).add(r.stage)
    return {k for k, s in stages.items() if len(s) > 1}


def metadata(reports: Sequence[RankReport]) -> Metadata:
    """DCP's metadata of a checkpoint whose ranks wrote ``reports``. A chunk two ranks both wrote (a
    replicated tensor) is kept once, as DCP's planner keeps it; ranks that disagree on a tensor's
    dtype or size are refused. Without ``storage_meta`` (``dcp.save``'s ids of one save, which a load
    does not need): the metadata of one layout is the same for every step."""
    shared = stage_keyed(reports)
    tensors: dict[str, TensorStorageMetadata] = {}
    where: dict[MetadataIndex, _StorageInfo] = {}
    for r in reports:
        for w in r.items:
            key = f"{r.stage}/{w.key}" if w.key in shared else w.key
            dtype = getattr(torch, w.dtype)
            md = tensors.get(key)
            if md is None:
                md = tensors[key] = TensorStorageMetadata(TensorProperties(dtype=dtype), torch.Size(w.size), [])
            elif md.properties.dtype != dtype or tuple(md.size) != tuple(w.size):
                raise CheckpointCorrupt(f"{key}: ranks wrote {md.properties.dtype} {tuple(md.size)} and "
                                        f"{dtype} {tuple(w.size)}")
            if any(tuple(c.offsets) == w.offsets for c in md.chunks):
                continue
            offsets = torch.Size(w.offsets)
            where[MetadataIndex(key, offsets, len(md.chunks))] = _StorageInfo(r.file, w.offset, w.length)
            md.chunks.append(ChunkStorageMetadata(offsets=offsets, sizes=torch.Size(w.sizes)))
    described: dict[str, TensorStorageMetadata | BytesStorageMetadata] = dict(tensors)
    return Metadata(state_dict_metadata=described, planner_data={k: (k,) for k in tensors}, storage_data=where,
                    version=CURRENT_DCP_VERSION)


@functools.lru_cache(maxsize=2)
def _layout_commit(layout: tuple[tuple[int, str, str, tuple[Written, ...]], ...]) -> tuple[bytes, str, frozenset[str]]:
    """The pickled :func:`metadata` of reports laid out so, its checksum and the keys written under their
    stage's (:func:`stage_keyed`): the same from one persist to the next while the state's layout stays, so
    made once (~5 ms of Python for 100 tensors)."""
    reports = [RankReport(rank, stage, file, 0, "", items) for rank, stage, file, items in layout]
    blob = pickle.dumps(metadata(reports))
    return blob, persist.checksum(blob), frozenset(stage_keyed(reports))


def commit_ops(step: int, reports: Sequence[RankReport],
               extra: dict[str, Any] | None = None) -> tuple[list[persist.FileOp], set[str]]:
    """How rank 0 commits ``step`` once every rank's file is durable: write DCP's ``.metadata`` from
    ``reports``, then the checkpoint's commit (:func:`baft.persist.commits.commit_file_ops`: the files at their
    sizes, manifest, ``latest``); and the keys written under their stage's (:func:`stage_keyed`)."""
    blob, blob_checksum, shared = _layout_commit(tuple((r.rank, r.stage, r.file, r.items) for r in reports))
    files = {r.file: (r.size, r.checksum) for r in reports}
    files[METADATA] = (len(blob), blob_checksum)
    ops = [persist.FileOp("write", f"{persist.step_name(step)}/{METADATA}", data=blob, sync_dir=False),
           *persist.commit_file_ops(step, len(reports), files, extra)]
    return ops, set(shared)


def commit(root: Root, step: int, reports: Sequence[RankReport], extra: dict[str, Any] | None = None) -> set[str]:
    """Rank 0, once every rank's file is durable: commit ``step`` (:func:`commit_ops`). Returns the keys
    written under their stage's."""
    ops, shared = commit_ops(step, reports, extra)
    persist.run_ops(root, ops)
    return shared
