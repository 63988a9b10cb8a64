"""Snapshot slots in shared memory (three per rank), mapped as tensors, that outlive the process that wrote them.

The file format, the slot paths and the byte-level reads the node store does are in :mod:`baft.snapshot.slotfile`.
Version v is written into slot ``v % SLOTS`` (see there); a writer killed mid-copy leaves a WRITING slot that
readers discard. Pages are touched once at creation: first touch runs at ~1 GB/s here, later copies at 10+ GB/s.
"""
from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from baft.snapshot.slotfile import (
    COMPLETE,
    FIELDS,
    HEAD,
    HEADER,
    MAGIC,
    SLOTS,
    WRITING,
    SlotInfo,
    own_slot,
    slot_of,
)
from baft.state.layout import TensorSpec


def owner_tag(replica: int, replicas: int, tensors: list[int], specs: list[TensorSpec]) -> str:
    """Which bytes of a slot a writer fills: its place among the replicas, the tensors it owns and the
    layout. Two writers with the same tag leave the same bytes zero."""
    key = repr((replica, replicas, sorted(tensors), [(s.name, s.dtype, s.shape, s.offset, s.nbytes) for s in specs]))
    return hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


def _reusable(fd: int, data_len: int, meta_capacity: int) -> bool:
    """Whether the slot file open at ``fd`` is one of ``data_len`` tensor bytes with room for at least
    ``meta_capacity`` bytes of metadata (a capacity that grew is kept, with what the slot holds)."""
    size = os.fstat(fd).st_size
    if size < HEADER:
        return False
    magic, _, _, length, _, capacity = HEAD.unpack(os.pread(fd, HEAD.size, 0))
    return bool(magic == MAGIC and length == data_len and capacity >= meta_capacity and size == HEADER + length + capacity)


class Slot:
    """One mapped slot file."""

    def __init__(self, path: Path, data_len: int, meta_capacity: int, create: bool,
                 on_unmap: Callable[[Slot], None] | None = None) -> None:
        self.path = path
        self.on_unmap = on_unmap
        """Told before the mapping goes (remapped or closed), while it is still mapped (the CUDA path
        unlocks the pages it locked there)."""
        self.views: dict[Any, Any] = {}
        """A reader's cache of views of this mapping (:data:`baft.snapshot.slotmeta.Views`), dropped before it is unmapped."""
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
        try:
            fresh = create and not _reusable(fd, data_len, meta_capacity)
            if fresh:
                os.ftruncate(fd, 0)
                os.ftruncate(fd, HEADER + data_len + meta_capacity)
            self._map(fd)
        finally:
            os.close(fd)
        self.fresh = fresh
        """Created (or re-created) zeroed by this process; otherwise it holds what an earlier writer left."""
        if fresh:
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

    def _map(self, fd: int) -> None:
        self._mm = mmap.mmap(fd, os.fstat(fd).st_size)
        self.bytes = torch.frombuffer(self._mm, dtype=torch.uint8)
        self.header = self.bytes[: FIELDS * 8].view(torch.int64)

    def grow_meta(self, capacity: int) -> None:
        """Make room for ``capacity`` bytes of metadata: the file grows at its end (the metadata is
        its last part), so the header and the tensor bytes stay where they are, and so does a
        version sealed in it. Only the writer maps its own slots; readers of other processes
        read the file by offsets (:mod:`baft.snapshot.slotfile`), so nobody holds the old mapping."""
        fd = os.open(self.path, os.O_RDWR)
        try:
            os.ftruncate(fd, HEADER + self.data_len + capacity)
            self._unmap()
            self._map(fd)
        finally:
            os.close(fd)
        self.header[5] = capacity

    def complete(self, version: int, meta: bytes) -> None:
        if len(meta) > self.meta_capacity:
            # metadata has no fixed bound (a loader's or a scheduler's state can be large): double
            # until it fits, rather than fail the seal inside a pipeline wait
            capacity = self.meta_capacity or 1
            while capacity < len(meta):
                capacity *= 2
            self.grow_meta(capacity)
        start = HEADER + self.data_len
        self.bytes[start : start + len(meta)].copy_(torch.frombuffer(bytearray(meta), dtype=torch.uint8))
        self.header[4] = len(meta)
        self.header[2] = version
        self.header[1] = COMPLETE

    def meta(self) -> bytes:
        start = HEADER + self.data_len
        return self.bytes[start : start + int(self.header[4])].numpy().tobytes()

    def _unmap(self) -> None:
        if self.on_unmap is not None:
            self.on_unmap(self)
        self.views.clear()
        del self.header, self.bytes
        self._mm.close()

    def close(self) -> None:
        self._unmap()


class SnapshotBuffer:
    """The :data:`SLOTS` slots of one rank."""

    def __init__(self, root: Path, rank: int) -> None:
        self.root = Path(root)
        self.rank = rank
        self.slots: dict[int, Slot] = {}
        self.on_unmap: Callable[[Slot], None] | None = None
        """Given to every slot it maps (:attr:`Slot.on_unmap`)."""

    def path(self, k: int) -> Path:
        return own_slot(self.root, self.rank, k)

    def allocate(self, data_len: int, meta_capacity: int) -> None:
        """Map every slot with room for ``data_len`` bytes of tensors.

        Slot files of exactly that size are reused as they are, so a restarted
        worker keeps the complete version it restored from in the other slot.
        """
        self.close()
        self.root.mkdir(parents=True, exist_ok=True)
        self.slots = {k: Slot(self.path(k), data_len, meta_capacity, create=True, on_unmap=self.on_unmap) for k in range(SLOTS)}

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
            slot = Slot(p, 0, 0, create=False, on_unmap=self.on_unmap)
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
