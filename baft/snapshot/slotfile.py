"""The slot file: the format of a snapshot slot in shared memory, its paths, and byte-level reads and writes.

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

This module is torch-free: the node store (``python -m baft.store``) reads, copies and writes
slot files as bytes; :mod:`baft.snapshot.slots` maps them as tensors.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0x42414654_534E4150  # "BAFTSNAP"
HEADER = 4096
WRITING, COMPLETE, ABANDONED = 1, 2, 3
"""A slot's states; ABANDONED: a complete version newer than the one the job rolled back to, of the
timeline it left (kept for nothing: a restore must never take it for the new timeline's version)."""
FIELDS = 6
HEAD = struct.Struct(f"<{FIELDS}q")


@dataclass(frozen=True, slots=True)
class SlotInfo:
    slot: int
    state: int
    version: int
    data_len: int
    meta_len: int


SLOTS = 3
"""Slots per rank: version v goes to slot ``v % SLOTS``. Pipeline stages run up to one
version apart, so when a failure interrupts every rank mid-copy, each still holds its two
newest complete versions and at least one of them is common to all ranks; with two slots
the stage ahead would already have overwritten the version the stage behind can offer."""


def slot_of(version: int) -> int:
    return version % SLOTS


def slot_header(path: Path) -> tuple[int, int, int] | None:
    """(state, version, data_len) of a slot file, or None if it is not one."""
    try:
        with open(path, "rb") as f:
            raw = f.read(HEAD.size)
    except OSError:
        return None
    if len(raw) < HEAD.size:
        return None
    magic, state, version, data_len, _meta_len, _cap = HEAD.unpack(raw)
    return (state, version, data_len) if magic == MAGIC else None


def read_complete(path: Path, version: int) -> bytes | None:
    """The used bytes of a slot file (header, data, metadata) if it holds complete
    ``version`` both before and after reading; None if not (or rewritten meanwhile)."""
    before = slot_header(path)
    if before is None or before[0] != COMPLETE or before[1] != version:
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD.size)
            _, _, _, data_len, meta_len, _ = HEAD.unpack(head)
            f.seek(0)
            data = f.read(HEADER + data_len + meta_len)
    except OSError:
        return None
    after = slot_header(path)
    if after != before or len(data) < HEADER:
        return None  # rewritten while we read: torn
    return data


def slot_size(head: bytes) -> int | None:
    """The full size of the slot file whose first bytes are ``head`` (None: not a slot's header)."""
    if len(head) < HEAD.size:
        return None
    magic, _, _, data_len, _, capacity = HEAD.unpack(head[: HEAD.size])
    return HEADER + data_len + capacity if magic == MAGIC else None


def write_slot(path: Path, data: bytes) -> None:
    """Atomically place a slot's used bytes at ``path``, padded to the slot's full size; bytes that are
    not a slot's (too short, another magic) raise ``ValueError`` and write nothing."""
    size = slot_size(data[:HEADER]) if len(data) >= HEADER else None
    if size is None:
        raise ValueError(f"{len(data)} bytes that are not a snapshot slot's")
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.truncate(size)
    os.replace(tmp, path)


def own_slot(root: Path, rank: int, k: int) -> Path:
    return root / f"rank-{rank:05d}.slot{k}"


def replica_slot(root: Path, rank: int, k: int) -> Path:
    return root / f"replica-rank-{rank:05d}.slot{k}"


def abandon(path: Path) -> None:
    """Mark the slot file at ``path`` ABANDONED in place (its header's state field)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, struct.pack("<q", ABANDONED), 8)
    finally:
        os.close(fd)


def discard_newer(root: Path, rank: int, version: int) -> list[int]:
    """Mark the rank's own slots under ``root`` that hold versions newer than ``version`` ABANDONED (the
    worker does this after a restore; the store does the same to its replicas and kept copies,
    :meth:`baft.store.ring.SlotRing.abandon_newer`); the versions dropped."""
    dropped = []
    for k in range(SLOTS):
        p = own_slot(root, rank, k)
        h = slot_header(p)
        if h is not None and h[0] == COMPLETE and h[1] > version:
            abandon(p)
            dropped.append(h[1])
    return sorted(dropped)


def kept_slot(root: Path, rank: int, k: int) -> Path:
    """The store's own copies of a local rank's recent round versions (a ring of ``SLOTS``)."""
    return root / f"kept-rank-{rank:05d}.slot{k}"


def held_slot(root: Path, rank: int, k: int) -> Path:
    """The store's copies of a local rank at the versions its peers replicate to this node (a ring of
    ``SLOTS``): after a peer node is lost, its ranks restore from their replicas here, and this node's
    ranks need those same versions, whatever versions this node's own rounds took."""
    return root / f"held-rank-{rank:05d}.slot{k}"


def copies(root: Path, rank: int) -> list[tuple[int, Path]]:
    """Complete copies of ``rank``'s state on this node: (version, file)."""
    out = []
    for k in range(SLOTS):
        for p in (own_slot(root, rank, k), replica_slot(root, rank, k), kept_slot(root, rank, k), held_slot(root, rank, k)):
            h = slot_header(p)
            if h is not None and h[0] == COMPLETE:
                out.append((h[1], p))
    return out
