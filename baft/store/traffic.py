"""Who on this node has training traffic in flight: one byte per rank in a shared-memory file.

A worker sets its byte while it waits on a pipeline send or receive (its
activations or gradients are on the wire) and clears it when the wait ends.
The node's store sends replica data only while every byte is clear, so
checkpoint traffic goes out in the gaps and training traffic keeps priority
on a slow link. A byte write costs nanoseconds; nobody locks anything.

A store that finds traffic in flight sleeps until a worker clears its byte, not
in a polling loop: it raises the file's *waiting* byte and sleeps on a futex
(Linux's wait on a shared word) over the file's *generation* word; a worker that
clears its byte while the waiting byte is up bumps the generation and wakes it (a
system call only then: with no store waiting, clearing stays a byte write). A
worker that clears its byte between the store's check and its sleep has already
changed the generation, so the sleep returns at once. Where futexes are not
available (another OS, an architecture not listed) the store polls every
millisecond, as it did before.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import platform
import time
from pathlib import Path
from typing import Any

SLOTS = 256
"""Ranks' bytes (a node's local ranks, by rank modulo this)."""
WAITING = SLOTS
"""The byte a store raises while it sleeps until the traffic pauses."""
GENERATION = SLOTS + 4
"""The 32-bit word (aligned) workers bump to wake a waiting store."""
SIZE = SLOTS + 8
#: The file's name in the node's shared-memory directory.
TRAFFIC_FILE = "traffic"
#: How often a store without futexes looks again.
POLL = 0.001

_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # shared (not _PRIVATE): the word is in a file other processes map
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _libc_syscall() -> Any:
    if _SYS_FUTEX is None or not hasattr(os, "sched_getaffinity"):  # not Linux, or an architecture not listed
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None


_syscall = _libc_syscall()


def _map(path: Path) -> mmap.mmap:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size < SIZE:
            os.ftruncate(fd, SIZE)
        return mmap.mmap(fd, SIZE)
    finally:
        os.close(fd)


class TrafficFlag:
    """One rank's byte."""

    def __init__(self, path: Path, rank: int) -> None:
        self._mm = _map(path)
        self._i = rank % SLOTS
        self._word = ctypes.c_uint32.from_buffer(self._mm, GENERATION)

    def set(self, busy: bool) -> None:
        self._mm[self._i] = 1 if busy else 0
        if not busy and self._mm[WAITING]:  # a store sleeps until the traffic pauses: wake it
            self._word.value = (self._word.value + 1) & 0xFFFFFFFF
            if _syscall is not None:
                _syscall(_SYS_FUTEX, ctypes.c_void_p(ctypes.addressof(self._word)), _FUTEX_WAKE, 0x7FFFFFFF,
                         None, None, 0)

    def close(self) -> None:
        self.set(False)
        del self._word  # the mapping cannot close while a ctypes view of it lives
        self._mm.close()


class TrafficFlags:
    """The store's view of all of the node's bytes."""

    def __init__(self, path: Path) -> None:
        self._mm = _map(path)
        self._word = ctypes.c_uint32.from_buffer(self._mm, GENERATION)

    def idle(self) -> bool:
        return self._mm.find(b"\x01", 0, SLOTS) < 0

    def wait_idle(self, timeout: float) -> float:
        """Sleep until no rank has traffic in flight, at most ``timeout`` seconds; the seconds waited."""
        t0 = time.perf_counter()
        if self.idle():
            return 0.0
        deadline = t0 + timeout
        self._mm[WAITING] = 1
        try:
            while True:
                seen = self._word.value
                if self.idle():
                    break
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                if _syscall is None:
                    time.sleep(min(POLL, left))
                    continue
                ts = _Timespec(int(left), int((left % 1) * 1e9))
                _syscall(_SYS_FUTEX, ctypes.c_void_p(ctypes.addressof(self._word)), _FUTEX_WAIT,
                         ctypes.c_uint32(seen), ctypes.byref(ts), None, 0)
        finally:
            self._mm[WAITING] = 0
        return time.perf_counter() - t0

    def close(self) -> None:
        del self._word
        self._mm.close()
