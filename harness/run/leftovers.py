"""What a run leaves on the host when the harness itself is killed, and ``baft cleanup`` to sweep it.

A run removes its shared-memory snapshots (``/dev/shm/baft-<id>``) and its network topology
(``baft-<tag>-*`` namespaces, veths, bridge) on the way out, also after errors and Ctrl-C. A
harness killed with SIGKILL (or a machine's OOM killer) cannot: the snapshots keep their RAM
and the namespaces their addresses until someone removes them. Each run's shared-memory
directory therefore names its owner — ``.owner`` holds the harness's pid and that process's
start time (so a reused pid is not mistaken for the owner) — as the topology's bridge does
(:func:`injectors.network.cleanup_stale`). A directory is stale when its owner is gone;
one without an owner file (written by something else that names itself ``baft-``) only
once it has not changed for :data:`UNOWNED_AGE` seconds. ``--force`` removes every one.
"""
from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from harness.run.processes import orphaned, start_time, stop_owned

SHM = Path("/dev/shm")
PREFIX = "baft-"
OWNER = ".owner"
UNOWNED_AGE = 3600.0
"""Seconds an unowned ``/dev/shm/baft-*`` directory must have been left unchanged to count as stale."""


def claim_shm(root: Path = SHM) -> Path:
    """A new shared-memory directory for one run, owned by this process."""
    path = root / f"{PREFIX}{uuid.uuid4().hex[:12]}"
    path.mkdir(mode=0o700)
    (path / OWNER).write_text(f"{os.getpid()} {start_time(os.getpid())}\n")
    return path


def owner_alive(path: Path) -> bool | None:
    """Whether the process that owns ``path`` still runs (None: no readable owner file)."""
    try:
        pid_text, start = (path / OWNER).read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    return start_time(pid) == start


@dataclass(slots=True)
class Sweep:
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    """Live runs' directories (and, without root, the network part), with why."""
    errors: list[str] = field(default_factory=list)


def stale_shm(root: Path = SHM, *, force: bool = False, now: float | None = None) -> tuple[list[Path], list[str]]:
    """The ``baft-*`` directories under ``root`` that no live run owns, and why each other one is kept."""
    now = time.time() if now is None else now
    stale, kept = [], []
    for path in sorted(root.glob(f"{PREFIX}*")):
        if not path.is_dir() or path.is_symlink():
            continue
        alive = owner_alive(path)
        if force:
            stale.append(path)
        elif alive is None:
            age = now - path.stat().st_mtime
            if age >= UNOWNED_AGE:
                stale.append(path)
            else:
                kept.append(f"{path}: no owner file, changed {age:.0f} s ago (stale after {UNOWNED_AGE:.0f} s)")
        elif alive:
            kept.append(f"{path}: its run is still going")
        else:
            stale.append(path)
    return stale, kept


def sweep(*, force: bool = False, dry_run: bool = False, shm_root: Path = SHM, network: bool = True,
          processes: bool = True) -> Sweep:
    """Remove what killed runs left behind: their processes, shared-memory directories, then network
    topologies (root only)."""
    out = Sweep()
    for token, pids in sorted(orphaned().items()) if processes else ():
        if not dry_run:
            stop_owned(token)
        out.removed.append(f"processes of a killed run ({token[:12]}): pids {', '.join(map(str, sorted(pids)))}")
    stale, out.kept = stale_shm(shm_root, force=force)
    for path in stale:
        if not dry_run:
            try:
                shutil.rmtree(path)
            except OSError as e:
                out.errors.append(f"{path}: {e.strerror or e}")
                continue
        out.removed.append(str(path))
    if network:
        from injectors import network as net
        from injectors.errors import InjectorError

        if os.geteuid() != 0:
            out.kept.append("network namespaces: not checked (removing them needs root: run as root or with "
                            "CAP_NET_ADMIN and CAP_SYS_ADMIN)")
        else:
            try:
                out.removed += net.stale_names(force=force) if dry_run else net.cleanup_stale(force=force)
            except InjectorError as e:
                out.errors.append(str(e))
    return out
