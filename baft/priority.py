"""The idle classes: CPU and disk time that training leaves over, for baft's background processes.

The node store and the persistent writers do work training does not wait for.
In Linux's idle scheduling class (``SCHED_IDLE``) a process runs only on a core
no normal process wants, so on cores the ranks keep busy it runs while they wait
in their pipeline bubbles (a gloo wait sleeps) and never delays a rank that
could run; in the idle I/O class (``IOPRIO_CLASS_IDLE``) its reads and writes
go when no one else's wait. Where the container forbids one (a seccomp profile,
a kernel without the class), the process falls back to nice 19 for the CPU, and
the priority it got is said, not assumed: :func:`apply` returns it and its
callers journal it. Torch-free (the store imports it).
"""
from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass

IDLE, NORMAL = "idle", "normal"
PRIORITIES = (IDLE, NORMAL)
"""``idle``: the idle CPU and I/O classes; ``normal``: as started (the parent's)."""

_IOPRIO_WHO_PROCESS = 1  # a thread id, for Linux
_IOPRIO_CLASS_IDLE = 3
_IOPRIO_CLASS_SHIFT = 13
_SYS_IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "arm64": 30}.get(platform.machine())


@dataclass(frozen=True, slots=True)
class Applied:
    """The priority a process runs at, as the kernel accepted it (what its journal says)."""

    cpu: str
    """``SCHED_IDLE``, ``nice 19`` (the idle class refused) or ``normal``."""
    io: str
    """``idle`` or ``normal``."""
    note: str = ""
    """Why a class asked for was not applied ('' when all were)."""

    def fields(self) -> dict[str, str]:
        return {"cpu_class": self.cpu, "io_class": self.io, **({"priority_note": self.note} if self.note else {})}


def _threads(pid: int) -> list[int]:
    """The thread ids of process ``pid`` (0: this one); the scheduling class is a thread's own."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid or 'self'}/task")]
    except OSError:
        return [pid]


def _ioprio_idle(tid: int) -> str | None:
    """Put thread ``tid`` in the idle I/O class; None, or why not."""
    if _SYS_IOPRIO_SET is None:
        return f"no ioprio_set known for {platform.machine()}"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as e:
        return str(e)
    if libc.syscall(_SYS_IOPRIO_SET, _IOPRIO_WHO_PROCESS, tid, _IOPRIO_CLASS_IDLE << _IOPRIO_CLASS_SHIFT) != 0:
        return f"ioprio_set: {os.strerror(ctypes.get_errno())}"
    return None


def apply(priority: str, pid: int = 0) -> Applied:
    """Run every thread of process ``pid`` (0: this one; threads started later inherit it) at ``priority``."""
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}, got {priority!r}")
    if priority == NORMAL:
        return Applied("normal", "normal")
    notes: list[str] = []
    cpu = "SCHED_IDLE"
    for tid in _threads(pid):
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except (OSError, AttributeError) as e:
            notes.append(f"SCHED_IDLE refused ({e})")
            try:
                os.setpriority(os.PRIO_PROCESS, tid, 19)
                cpu = "nice 19"
            except OSError as e2:
                notes.append(f"nice 19 refused ({e2})")
                cpu = "normal"
            break
    io = "idle"
    for tid in _threads(pid):
        why = _ioprio_idle(tid)
        if why is not None:
            notes.append(f"idle I/O class refused ({why})")
            io = "normal"
            break
    return Applied(cpu, io, "; ".join(notes))

