"""Who on this node has training traffic in flight: one byte per rank in a shared-memory file.

A worker sets its byte while it waits on a pipeline send or receive (its
activations or gradients are on the wire) and clears it when the wait ends.
The node's store sends replica data only while every byte is clear, so
checkpoint traffic goes out in the gaps and training traffic keeps priority
on a slow link. A byte write costs nanoseconds; nobody locks anything.
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

SLOTS = 256
#: The file's name in the node's shared-memory directory.
TRAFFIC_FILE = "traffic"


def _map(path: Path) -> mmap.mmap:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size < SLOTS:
            os.ftruncate(fd, SLOTS)
        return mmap.mmap(fd, SLOTS)
    finally:
        os.close(fd)


class TrafficFlag:
    """One rank's byte."""

    def __init__(self, path: Path, rank: int) -> None:
        self._mm = _map(path)
        self._i = rank % SLOTS

    def set(self, busy: bool) -> None:
        self._mm[self._i] = 1 if busy else 0

    def close(self) -> None:
        self._mm[self._i] = 0
        self._mm.close()


class TrafficFlags:
    """The store's view of all of the node's bytes."""

    def __init__(self, path: Path) -> None:
        self._mm = _map(path)

    def idle(self) -> bool:
        return self._mm.find(b"\x01") < 0

    def close(self) -> None:
        self._mm.close()
