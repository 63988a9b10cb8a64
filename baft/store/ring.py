"""A store's ring of slot files for one rank, written in place: the replicas it receives, its kept copies.

The store writes a copy of a rank's state every version it replicates, on the
node that sends (its kept copy of the round's version) and on the node that
receives (the replica). Written into a fresh file and renamed, as they once
were, every copy faulted in new pages of shared memory: measured here, a
1.26 MB copy into a new ``/dev/shm`` file cost 0.45-0.54 CPU-s per GB
against 0.11 into pages already there — more than the whole floor of sending
a replica (0.28 CPU-s per GB, both sides). So each ring's :data:`SLOTS` files
are created once, mapped once, and rewritten in place under the slot file's
own protocol (:mod:`baft.snapshot.slotfile`): the header's state goes to WRITING before
the first byte of a copy and to the copied header (COMPLETE, its version) after
the last, so a reader that sees COMPLETE with the same version before and after
its read got a whole copy, and a copy interrupted anywhere is never taken for
one.

The ring remembers which version each file holds, so choosing where a copy goes
reads no headers; a file that vanished or was replaced behind its back (a node's
memory wiped) is opened again. Torch-free (the store process imports it).
"""
from __future__ import annotations

import mmap
import os
import struct
import threading
from collections.abc import Callable
from pathlib import Path

from baft.snapshot.slotfile import (
    ABANDONED,
    COMPLETE,
    HEAD,
    HEADER,
    MAGIC,
    SLOTS,
    WRITING,
    slot_header,
    slot_size,
)

_STATE = struct.Struct("<q")
_STATE_AT = 8  # the header's state field: after the magic


class _File:
    """One slot file of the ring, open and mapped."""

    __slots__ = ("path", "fd", "ino", "size", "map")

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            st = os.fstat(self.fd)
            if st.st_size < size:
                os.ftruncate(self.fd, size)
            self.ino, self.size = st.st_ino, max(size, st.st_size)
            self.map = mmap.mmap(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            raise

    def current(self, size: int) -> bool:
        """Whether this is still the file at ``path`` and holds ``size`` bytes."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return st.st_ino == self.ino and size <= self.size

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


class SlotRing:
    """The :data:`SLOTS` files at ``paths`` (one rank's replicas, or its kept copies)."""

    def __init__(self, paths: list[Path]) -> None:
        if len(paths) != SLOTS:
            raise ValueError(f"a ring of {SLOTS} files, got {len(paths)}")
        self.paths = paths
        self.lock = threading.Lock()
        """Held by whoever writes the ring (one copy at a time; the store's threads share rings)."""
        self._files: list[_File | None] = [None] * SLOTS
        self.held: list[int | None] = []
        """The complete version each file holds (None: none), as this ring last wrote or read it."""
        self.rescan()

    def rescan(self) -> None:
        """Read which complete version each file holds from the files themselves."""
        self.held = []
        for p in self.paths:
            h = slot_header(p)
            self.held.append(h[1] if h is not None and h[0] == COMPLETE else None)

    def choose(self, version: int) -> int:
        """Where ``version`` goes: the file that holds it already, else one that holds no complete version,
        else the one holding the oldest. Not ``version % SLOTS``: replicas arrive every stride-th version,
        and with a stride that is a multiple of :data:`SLOTS` every one would land in the same file."""
        if version in self.held:
            return self.held.index(version)
        if None in self.held:
            return self.held.index(None)
        return min(range(SLOTS), key=lambda k: self.held[k])  # type: ignore[arg-type,return-value]

    def _open(self, k: int, size: int) -> _File:
        f = self._files[k]
        if f is not None and f.current(size):
            return f
        if f is not None:
            f.close()
        f = self._files[k] = _File(self.paths[k], size)
        return f

    def _begin(self, f: _File, k: int) -> None:
        self.held[k] = None
        os.pwrite(f.fd, _STATE.pack(WRITING), _STATE_AT)

    def _finish(self, f: _File, k: int, head: bytes, version: int) -> bool:
        """Write the copy's header last; whether it says COMPLETE ``version``."""
        os.pwrite(f.fd, head[:HEADER], 0)
        magic, state, got, *_ = HEAD.unpack(head[:HEAD.size])
        ok = bool(magic == MAGIC and state == COMPLETE and got == version)
        self.held[k] = version if ok else None
        return ok

    def receive(self, version: int, head: bytes, nbytes: int, fill: Callable[[memoryview], None]) -> Path:
        """Write a copy of ``version`` whose ``nbytes`` used bytes start with the header ``head`` (its first
        :data:`HEADER` bytes): ``fill`` writes the rest into the view it is given (a socket's
        ``recv_into``). Raises ``ValueError`` for bytes that are not a slot's; the file written."""
        size = slot_size(head)
        if size is None or nbytes < HEADER:
            raise ValueError(f"{nbytes} bytes that are not a snapshot slot's")
        k = self.choose(version)
        f = self._open(k, max(size, nbytes))
        self._begin(f, k)
        if nbytes > HEADER:
            view = memoryview(f.map)
            body = view[HEADER:nbytes]
            try:
                fill(body)
            finally:
                body.release()
                view.release()
        self._finish(f, k, head, version)
        return self.paths[k]

    def copy_from(self, src: Path, version: int, k: int | None = None) -> tuple[int, int] | None:
        """Copy the used bytes of slot file ``src`` into file ``k`` of the ring (None: :meth:`choose`) if
        ``src`` holds complete ``version`` before and after the copy; (file index, bytes copied), or None
        (torn, rewritten meanwhile, or not a slot). The kernel reads the source straight into this ring's
        mapping of file ``k`` (``preadv``: one copy from the source's pages into pages already there). Not
        ``copy_file_range``: between two tmpfs files it splices page by page through a pipe and writes each
        page back through the file system, 0.64 ms per 1.26 MB copy here against ~0.3 for the read (issue 33);
        nor a mapping of the source, which its writer may truncate (a relayout) under a copy, a SIGBUS where a
        read just comes back short."""
        try:
            fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)  # a link put in a slot's place is not followed
        except OSError:
            return None
        try:
            head = os.pread(fd, HEADER, 0)
            size = slot_size(head)
            if size is None:
                return None
            _, state, got, data_len, meta_len, _ = HEAD.unpack(head[:HEAD.size])
            if state != COMPLETE or got != version:
                return None
            used = HEADER + data_len + meta_len
            k = self.choose(version) if k is None else k
            f = self._open(k, size)
            self._begin(f, k)
            view = memoryview(f.map)
            try:
                done = HEADER
                while done < used:
                    n = os.preadv(fd, [view[done:used]], done)  # straight into the mapped file (see the docstring)
                    if n <= 0:
                        return None  # shorter than it said: left WRITING
                    done += n
            finally:
                view.release()
            if os.pread(fd, HEAD.size, 0) != head[:HEAD.size]:
                return None  # rewritten while copied: torn, left WRITING
            return (k, used) if self._finish(f, k, head, version) else None
        except OSError:
            return None
        finally:
            os.close(fd)

    def fd(self, k: int) -> int:
        """The open file descriptor of file ``k`` (written by :meth:`copy_from` or :meth:`receive`)."""
        f = self._files[k]
        if f is None:
            raise ValueError(f"file {k} of the ring was never written")
        return f.fd

    def abandon_newer(self, version: int) -> list[int]:
        """Mark every copy newer than ``version`` ABANDONED in place (a restore rolled the rank back to
        ``version``: the abandoned timeline's copies must never pass for the new one's); the versions."""
        self.rescan()
        dropped = []
        for k, held in enumerate(self.held):
            if held is not None and held > version:
                fd = os.open(self.paths[k], os.O_WRONLY)
                try:
                    os.pwrite(fd, _STATE.pack(ABANDONED), _STATE_AT)
                finally:
                    os.close(fd)
                self.held[k] = None
                dropped.append(held)
        return sorted(dropped)

    def close(self) -> None:
        for f in self._files:
            if f is not None:
                f.close()
        self._files = [None] * SLOTS
