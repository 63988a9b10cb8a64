"""Snapshot slots in shared memory (three per rank) that outlive the process that wrote them.

Each rank owns :data:`SLOTS` slot files under a directory in ``/dev/shm``. A slot is::

    header (4 KiB)  int64 [magic, state, version, data_len, meta_len, meta_capacity]
    data            the flat bytes of the stage's tensors (model + optimizer)
    meta            a ``torch.save`` blob: the rest of the state with tensor markers, and the layout

Version v is written into slot ``v % SLOTS``: ``state`` goes to WRITING first and
to COMPLETE only after every byte of v is in place, so the other slots always
keep the previous complete versions, and a writer killed mid-copy leaves a
WRITING slot that readers discard. Files in ``/dev/shm`` survive a SIGKILL of
the writer (plain files, no resource tracker). Pages are touched once at
creation: first touch runs at ~1 GB/s here, later copies at 10+ GB/s.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

MAGIC = 0x42414654_534E4150  # "BAFTSNAP"
HEADER = 4096
WRITING, COMPLETE = 1, 2
_FIELDS = 6
_HEAD = struct.Struct(f"<{_FIELDS}q")


@dataclass(frozen=True, slots=True)
class SlotInfo:
    slot: int
    state: int
    version: int
    data_len: int
    meta_len: int


class Slot:
    """One mapped slot file."""

    def __init__(self, path: Path, data_len: int, meta_capacity: int, create: bool) -> None:
        self.path = path
        size = HEADER + data_len + meta_capacity
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
        try:
            fresh = create and os.fstat(fd).st_size != size
            if fresh:
                os.ftruncate(fd, 0)
                os.ftruncate(fd, size)
            size = os.fstat(fd).st_size
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.bytes = torch.frombuffer(self._mm, dtype=torch.uint8)
        self.header = self.bytes[: _FIELDS * 8].view(torch.int64)
        h = self.header.tolist()
        if create and (fresh or h[0] != MAGIC or h[3] != data_len or h[5] != meta_capacity):
            self.bytes.zero_()  # pre-touch every page now, not during a bubble
            self.header[0] = MAGIC
            self.header[3] = data_len
            self.header[5] = meta_capacity

    def info(self, slot: int) -> SlotInfo | None:
        h = self.header.tolist()
        if h[0] != MAGIC:
            return None
        return SlotInfo(slot=slot, state=h[1], version=h[2], data_len=h[3], meta_len=h[4])

    @property
    def data_len(self) -> int:
        return int(self.header[3])

    @property
    def meta_capacity(self) -> int:
        return int(self.header[5])

    def data(self) -> torch.Tensor:
        return self.bytes[HEADER : HEADER + self.data_len]

    def begin(self, version: int) -> None:
        self.header[1] = WRITING
        self.header[2] = version

    def complete(self, version: int, meta: bytes) -> None:
        if len(meta) > self.meta_capacity:
            raise ValueError(f"snapshot metadata of {len(meta)} bytes exceeds the slot's {self.meta_capacity}")
        start = HEADER + self.data_len
        self.bytes[start : start + len(meta)].copy_(torch.frombuffer(bytearray(meta), dtype=torch.uint8))
        self.header[4] = len(meta)
        self.header[2] = version
        self.header[1] = COMPLETE

    def meta(self) -> bytes:
        start = HEADER + self.data_len
        return self.bytes[start : start + int(self.header[4])].numpy().tobytes()

    def close(self) -> None:
        del self.header, self.bytes
        self._mm.close()


SLOTS = 3
"""Slots per rank: version v goes to slot ``v % SLOTS``. Pipeline stages run up to one
version apart, so when a failure interrupts every rank mid-copy, each still holds its two
newest complete versions and at least one of them is common to all ranks; with two slots
the stage ahead would already have overwritten the version the stage behind can offer."""


def slot_of(version: int) -> int:
    return version % SLOTS


class SnapshotBuffer:
    """The :data:`SLOTS` slots of one rank."""

    def __init__(self, root: Path, rank: int) -> None:
        self.root = Path(root)
        self.rank = rank
        self.slots: dict[int, Slot] = {}

    def path(self, k: int) -> Path:
        return own_slot(self.root, self.rank, k)

    def allocate(self, data_len: int, meta_capacity: int) -> None:
        """Map every slot with room for ``data_len`` bytes of tensors.

        Slot files of exactly that size are reused as they are, so a restarted
        worker keeps the complete version it restored from in the other slot.
        """
        self.close()
        self.root.mkdir(parents=True, exist_ok=True)
        self.slots = {k: Slot(self.path(k), data_len, meta_capacity, create=True) for k in range(SLOTS)}

    def fits(self, data_len: int, meta_len: int) -> bool:
        return 0 in self.slots and self.slots[0].data_len == data_len and self.slots[0].meta_capacity >= meta_len

    def open_existing(self) -> list[SlotInfo]:
        """Map slots a previous process left; returns their headers (COMPLETE or not)."""
        self.close()
        infos = []
        for k in range(SLOTS):
            p = self.path(k)
            if not p.is_file() or p.stat().st_size < HEADER:
                continue
            slot = Slot(p, 0, 0, create=False)
            info = slot.info(k)
            if info is None or HEADER + info.data_len > p.stat().st_size:
                slot.close()
                continue
            self.slots[k] = slot
            infos.append(info)
        return infos

    def slot_for(self, version: int) -> Slot:
        return self.slots[slot_of(version)]

    def close(self) -> None:
        for s in self.slots.values():
            s.close()
        self.slots = {}


# -- slot files as bytes (how the node store reads, copies and writes them) ----------------------------
def slot_header(path: Path) -> tuple[int, int, int] | None:
    """(state, version, data_len) of a slot file, or None if it is not one."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_HEAD.size)
    except OSError:
        return None
    if len(raw) < _HEAD.size:
        return None
    magic, state, version, data_len, _meta_len, _cap = _HEAD.unpack(raw)
    return (state, version, data_len) if magic == MAGIC else None


def read_complete(path: Path, version: int) -> bytes | None:
    """The used bytes of a slot file (header, data, metadata) if it holds complete
    ``version`` both before and after reading; None if not (or rewritten meanwhile)."""
    before = slot_header(path)
    if before is None or before[0] != COMPLETE or before[1] != version:
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD.size)
            _, _, _, data_len, meta_len, _ = _HEAD.unpack(head)
            f.seek(0)
            data = f.read(HEADER + data_len + meta_len)
    except OSError:
        return None
    after = slot_header(path)
    if after != before or len(data) < HEADER:
        return None  # rewritten while we read: torn
    return data


def write_slot(path: Path, data: bytes) -> None:
    """Atomically place a slot's used bytes at ``path``, padded to the slot's full size."""
    _, _, _, data_len, _, capacity = _HEAD.unpack(data[: _HEAD.size])
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.truncate(HEADER + data_len + capacity)
    os.replace(tmp, path)


def own_slot(root: Path, rank: int, k: int) -> Path:
    return root / f"rank-{rank:05d}.slot{k}"


def replica_slot(root: Path, rank: int, k: int) -> Path:
    return root / f"replica-rank-{rank:05d}.slot{k}"


def kept_slot(root: Path, rank: int, k: int) -> Path:
    """The store's own copies of a local rank's recent round versions (a ring of ``SLOTS``)."""
    return root / f"kept-rank-{rank:05d}.slot{k}"


def copies(root: Path, rank: int) -> list[tuple[int, Path]]:
    """Complete copies of ``rank``'s state on this node: (version, file)."""
    out = []
    for k in range(SLOTS):
        for p in (own_slot(root, rank, k), replica_slot(root, rank, k), kept_slot(root, rank, k)):
            h = slot_header(p)
            if h is not None and h[0] == COMPLETE:
                out.append((h[1], p))
    return out
