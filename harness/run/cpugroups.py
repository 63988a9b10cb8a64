"""CPU control groups for a launch: each node's processes share one group, its store idle inside it.

With autogroups on (``kernel.sched_autogroup_enabled``) every session is a scheduling group with a fair share of
the machine, and the harness starts each node's torchrun agent and each node store in a session of its own: a
store in the idle class then still competes with its node's ranks as a whole group would (issue 55: the floor
replicator, which a rank starts in the rank's own group, cost training 1-2 points where the stores cost 5-7).
A cluster places a node's processes in the pod's control group; here the launch makes the same, when the
kernel lets it (root and the ``cpu`` controller, v1 or v2):

``<own cpu group>/baft-<token>/node<i>/job``    the node's agent and everything it starts (ranks, writers,
                                                a floor replicator)
``<own cpu group>/baft-<token>/node<i>/store``  the node's store, at its priority ``lowest`` or ``adaptive``
                                                (:func:`baft.priority.apply`): marked idle (``cpu.idle``) by the
                                                store itself, always or while its replicas keep up

The node's group competes with the rest of the machine as one process group would; inside it an idle store runs
on what the node's ranks leave (their bubbles, their waits), however busy the rest of the machine is. A process
joins its group itself, first thing (:func:`baft.priority.join_cpu_group` through
:data:`baft.priority.CPU_GROUP_VARIABLE`): what it starts later is in it too. A store at the default priority
``idle`` stays in a session of its own (the freshest replicas on a machine with no idle time: in CI's
oversubscribed runs an idle store group fell behind and a rack loss found no common replica). The groups go when
the launch ends; what was made, or why nothing could be, is journaled (``cpu_groups``). ``BAFT_CPU_GROUPS=0``
switches them off (the autogroups then decide, as before).
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from baft.priority import CPU_GROUP_VARIABLE

from analysis.journal import JournalWriter

#: Set to 0 to launch without control groups.
SWITCH_VARIABLE = "BAFT_CPU_GROUPS"
#: Where the kernel lists the mounted file systems (and where this process's groups are).
MOUNTINFO, OWN_GROUPS = "/proc/self/mountinfo", "/proc/self/cgroup"


def own_cpu_group(mountinfo: str = MOUNTINFO, cgroups: str = OWN_GROUPS) -> tuple[Path | None, int, str]:
    """(the directory of this process's CPU control group, the cgroup version, '') or (None, 0, why not)."""
    try:
        mounts = Path(mountinfo).read_text().splitlines()
        mine = Path(cgroups).read_text().splitlines()
    except OSError as e:
        return None, 0, f"no control groups here ({e.strerror or e})"
    v1 = {}
    v2 = None
    for line in mounts:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup" and "cpu" in tail[2].split(","):
            v1[fields[3]] = fields[4]  # the hierarchy's root inside the mount -> the mount point
        elif tail[0] == "cgroup2":
            v2 = (fields[3], fields[4])
    for line in mine:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(",") and v1:
            for inner, point in v1.items():
                if path.startswith(inner):
                    return Path(point) / path[len(inner):].lstrip("/"), 1, ""
        if controllers == "" and v2 is not None and path.startswith(v2[0]):
            d = Path(v2[1]) / path[len(v2[0]):].lstrip("/")
            try:
                if "cpu" in (d / "cgroup.controllers").read_text().split():
                    return d, 2, ""
            except OSError:
                pass
    return None, 0, "no cpu controller mounted for this process's control group"


class CpuGroups:
    """One launch's groups (see the module's docstring); :meth:`env` gives a node process its group."""

    def __init__(self, token: str, nodes: int, journal: JournalWriter) -> None:
        self.dirs: list[Path] = []
        """Every directory made, parents first (removed in reverse)."""
        self.base: Path | None = None
        self.refused = ""
        if os.environ.get(SWITCH_VARIABLE, "1") == "0":
            self.refused = f"switched off ({SWITCH_VARIABLE}=0)"
        else:
            self._make(token, nodes)
        if self.refused:
            self.close()
        journal.write("cpu_groups", path=str(self.base) if self.base and not self.refused else None,
                      refused=self.refused or None)

    def _make(self, token: str, nodes: int) -> None:
        own, version, why = own_cpu_group()
        if own is None:
            self.refused = why
            return
        sweep(own)
        try:
            # v2: children may use the controller only where their parent hands it down; the launch does not change
            # a group it did not make
            if version == 2 and "cpu" not in (own / "cgroup.subtree_control").read_text().split():
                self.refused = f"{own} does not hand the cpu controller down (cgroup.subtree_control)"
                return
            self.base = self._mkdir(own / f"baft-{token[:16]}")
            if version == 2:
                _write(self.base / "cgroup.subtree_control", "+cpu")
            for node in range(nodes):
                n = self._mkdir(self.base / f"node{node}")
                if version == 2:
                    _write(n / "cgroup.subtree_control", "+cpu")
                self._mkdir(n / "job")
                self._mkdir(n / "store")
        except OSError as e:
            self.refused = f"the control groups could not be made under {own} ({e.strerror or e})"

    def _mkdir(self, d: Path) -> Path:
        d.mkdir()
        self.dirs.append(d)
        return d

    @property
    def active(self) -> bool:
        return self.base is not None and not self.refused

    def env(self, node: int, role: str) -> dict[str, str]:
        """The environment entry that puts node ``node``'s ``role`` (``job`` or ``store``) in its group ({}: none)."""
        if not self.active:
            return {}
        assert self.base is not None
        return {CPU_GROUP_VARIABLE: str(self.base / f"node{node}" / role)}

    def close(self, wait: float = 5.0) -> None:
        """Remove the groups once their processes are gone (an exited process not yet reaped by its parent keeps
        its group busy a moment: tried again for up to ``wait`` seconds; one still there keeps its group)."""
        deadline = time.monotonic() + wait
        while self.dirs:
            for d in reversed(self.dirs):
                with contextlib.suppress(OSError):
                    d.rmdir()
            self.dirs = [d for d in self.dirs if d.exists()]
            if not self.dirs or time.monotonic() > deadline:
                return
            time.sleep(0.05)


def sweep(parent: Path, older_than: float = 600.0) -> list[Path]:
    """Remove the groups of earlier launches under ``parent`` that nothing runs in any more (a launch killed before
    it could remove its own), made over ``older_than`` seconds ago; the groups removed."""
    gone = []
    for base in parent.glob("baft-*"):
        try:
            if time.time() - base.stat().st_mtime < older_than:
                continue
            tree = sorted((d for d in base.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True)
            if any((d / "cgroup.procs").read_text().strip() for d in [*tree, base]):
                continue
            for d in [*tree, base]:
                d.rmdir()
            gone.append(base)
        except OSError:
            continue
    return gone


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)

