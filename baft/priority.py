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

The idle class orders threads within one scheduling group. With autogroups on
(``kernel.sched_autogroup_enabled``, the default of many distributions) every
session is a group of its own, and the scheduler first shares a core between
groups at their group weight: a process in the idle class that leads its own
session (the node store: the harness starts it with a session of its own) then
competes with the ranks' group as an ordinary one would, whatever its class.
Measured here (issue 33): the stores' replication cost training 5-7 points while
a replicator in the ranks' own session, in the same class, cost 1-2. So for a
session leader the ``lowest`` priority also sets its session's group to nice 19
(the lowest weight, 15 against a normal group's 1024; ``/proc/PID/autogroup``):
then it truly runs on what training leaves, and on a machine with nothing left
(oversubscribed, such as a test run beside other jobs) it falls behind — in CI,
five scenarios that need fresh replicas at a node loss failed with it as the
stores' default. The store's ``adaptive`` takes both: the idle classes, and its
group at nice 19 only while its replicas keep up (:mod:`baft.store.governor`
raises it back to nice 0 when they fall behind); ``idle`` stays the default, the
freshest replicas. A process in its parent's
session (the writer, the floor replicator) is in the ranks' group already, where
its class does what it says; its group is never changed, or training's would be.

Where the launcher made control groups for the job (:data:`CPU_GROUP_VARIABLE` names one in a process's
environment: the harness's :mod:`harness.run.cpugroups`), :func:`apply` at ``lowest`` and ``adaptive`` moves the
process into it first and sets that group's class instead of an autogroup's: a process in a control group is out
of the autogroups, and the node's store then shares its node's group with the ranks, in a group of its own marked
idle (``cpu.idle``) — for ``lowest`` always, for ``adaptive`` while its replicas keep up — and runs on what the
node's ranks leave, whatever else the machine runs: the placement of the floor replicator, which a rank starts in
its own group. ``idle`` leaves the store where it was started (its own session), as before.
"""
from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass

IDLE, NORMAL, LOWEST, ADAPTIVE = "idle", "normal", "lowest", "adaptive"
PRIORITIES = (IDLE, NORMAL, LOWEST)
"""``idle``: the idle CPU and I/O classes; ``lowest``: those, and a session leader's autogroup at nice 19;
``normal``: as started (the parent's)."""
CHOICES = "idle, lowest or normal"
"""How a refused priority's message names the choices."""
STORE_PRIORITIES = (ADAPTIVE, *PRIORITIES)
"""The node store's: also ``adaptive``, the idle classes with its session's group lowered while its replicas keep
up (the store's :class:`baft.store.governor.GroupGovernor` decides; :func:`apply` leaves the group at nice 0)."""
STORE_CHOICES = "adaptive, idle, lowest or normal"
GROUP_LOW, GROUP_HIGH = 19, 0
"""The autogroup nice values of a lowered and a raised group (weights 15 and 1024)."""

CPU_GROUP_VARIABLE = "BAFT_CPU_GROUP"
"""The environment variable naming the directory of the CPU control group a process joins at :func:`apply` (or,
for a process that applies no priority, at its start: the harness's agents)."""

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
    group: str = ""
    """The scheduling group's weight when it was changed: ``autogroup nice 19`` (the process leads its session's
    autogroup); ``autogroup adaptive`` (it leads it, and its group's weight is the governor's to set); '' when it
    was left as it was (no autogroups, or the process is in its parent's)."""

    def fields(self) -> dict[str, str]:
        return {"cpu_class": self.cpu, "io_class": self.io, **({"cpu_group": self.group} if self.group else {}),
                **({"priority_note": self.note} if self.note else {})}


ADAPTIVE_GROUP = "autogroup adaptive"


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


_joined: dict[int, str] = {}  # process (0: this one) -> the CPU group apply() moved it into


def join_cpu_group(path: str, pid: int = 0) -> str:
    """Move process ``pid`` (0: this one; its threads and later children follow) into the CPU control group at
    ``path``; '' or why it could not be."""
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(pid or os.getpid()))
    except OSError as e:
        return f"the CPU group {path} refused it ({e.strerror or e})"
    return ""


def set_cpu_group_idle(path: str, idle: bool) -> str:
    """Mark the CPU control group at ``path`` idle (``cpu.idle`` 1; where the kernel lacks it, the lowest weight)
    or back to a normal group's weight; '' or why it could not be."""
    tries = [("cpu.idle", "1" if idle else "0")] + (
        [("cpu.shares", "2"), ("cpu.weight", "1")] if idle else [("cpu.shares", "1024"), ("cpu.weight", "100")])
    for name, value in tries:
        try:
            with open(os.path.join(path, name), "w") as f:
                f.write(value)
            return ""
        except OSError as e:
            last = f"the CPU group {path} kept its class ({name}: {e.strerror or e})"
    return last


def joined_cpu_group(pid: int = 0) -> str:
    """The CPU group :func:`apply` moved process ``pid`` into ('' if none)."""
    return _joined.get(pid, "")


def apply(priority: str, pid: int = 0) -> Applied:
    """Run every thread of process ``pid`` (0: this one; threads started later inherit it) at ``priority``, in the
    CPU group :data:`CPU_GROUP_VARIABLE` names, if any."""
    if priority not in STORE_PRIORITIES:
        raise ValueError(f"priority must be one of {STORE_CHOICES}, got {priority!r}")
    if priority == NORMAL:
        return Applied("normal", "normal")
    notes: list[str] = []
    cgroup = os.environ.get(CPU_GROUP_VARIABLE, "") if priority in (LOWEST, ADAPTIVE) else ""
    if cgroup:
        refused = join_cpu_group(cgroup, pid) or set_cpu_group_idle(cgroup, priority == LOWEST)
        if refused:
            notes.append(refused)
            cgroup = ""
        else:
            _joined[pid] = cgroup
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
    group, why = (f"cgroup {cgroup} " + ("idle" if priority == LOWEST else "adaptive"), "") if cgroup else ("", "")
    if not cgroup and priority in (LOWEST, ADAPTIVE) and leads_group(pid):  # adaptive: nice 0 until lowered
        why = set_group_nice(GROUP_LOW if priority == LOWEST else GROUP_HIGH, pid)
        group = "" if why else "autogroup nice 19" if priority == LOWEST else ADAPTIVE_GROUP
    if why:
        notes.append(why)
    return Applied(cpu, io, "; ".join(notes), group)


AUTOGROUPS = "/proc/sys/kernel/sched_autogroup_enabled"


def leads_group(pid: int = 0) -> bool:
    """Whether process ``pid`` (0: this one) leads its session's autogroup (its own and its children's, nobody
    else's) on a kernel with autogroups on, and the autogroup counts: a process in a CPU control group other than
    the root one (a container's, a launch's :data:`CPU_GROUP_VARIABLE`) is scheduled by that group instead."""
    try:
        with open(AUTOGROUPS) as f:
            if f.read().strip() != "1":
                return False
        target = pid or os.getpid()
        return (os.getsid(target) == target and os.path.exists(f"/proc/{target}/autogroup")
                and in_root_cpu_group(target))
    except OSError:
        return False  # a kernel without autogroups: the idle class alone decides


def in_root_cpu_group(pid: int = 0) -> bool:
    """Whether process ``pid`` (0: this one) is in the root CPU control group (where autogroups apply)."""
    try:
        with open(f"/proc/{pid or 'self'}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return True
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(",") or (controllers == "" and len(lines) == 1):
            return path == "/"
    return True


def set_group_nice(nice: int, pid: int = 0) -> str:
    """Set the weight of process ``pid``'s (0: this one) scheduling group to ``nice``: the CPU group :func:`apply`
    moved it into (nice 19: idle, else a normal group's weight), else its autogroup where it leads its session
    (else leave it: the group is shared with whoever started it); '' or why it could not be."""
    if joined_cpu_group(pid):
        return set_cpu_group_idle(joined_cpu_group(pid), nice == GROUP_LOW)
    if not leads_group(pid):
        return ""
    try:
        with open(f"/proc/{pid or os.getpid()}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError as e:
        return f"its session's autogroup kept its weight ({e})"
    return ""
