"""The processes a run owns: marked when started, found wherever they went, stopped together.

torchrun starts each worker in a session of its own, so a signal to an agent's process group
misses its workers, and a worker whose agent is killed is reparented to init. Every process a
launch starts (agents, their workers, the node stores; also inside network namespaces) therefore
carries the launch's token in its environment (:data:`TOKEN_VARIABLE`), inherited by everything it
starts. :func:`stop_owned` finds them by that token in ``/proc``, continues the stopped ones (a
SIGSTOPped worker ignores SIGTERM until continued), sends SIGTERM, and SIGKILLs what is left after
the grace period.

:func:`cancellation` turns SIGINT and SIGTERM into :class:`~harness.errors.Cancelled` in the main
thread, so the ``finally`` blocks of the launch, the runner and the injectors undo everything.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from harness.errors import Cancelled
from injectors.process import is_resource_tracker

#: Environment variable holding the token of the launch that started a process.
TOKEN_VARIABLE = "BAFT_RUN_TOKEN"
#: Environment variable naming the harness process of that launch, ``PID:START`` (its start time in
#: clock ticks since boot, so a reused pid is not taken for it): ``baft cleanup`` stops the
#: processes of a launch whose harness was killed (SIGKILL, the OOM killer) before it could.
OWNER_VARIABLE = "BAFT_RUN_OWNER"
#: Environment variable holding the index of the node a process belongs to (set by ``nodeenv.worker_env``).
NODE_VARIABLE = "BAFT_NODE_INDEX"
_PROC = Path("/proc")


def new_token() -> str:
    return uuid.uuid4().hex


def start_time(pid: int, proc: Path = _PROC) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22); None if it is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]  # fields after the command name start at field 3


def where_stuck(pid: int, proc: Path = _PROC, spy: bool = True) -> str:
    """Where process ``pid`` is, for a person: its Python stacks (``py-spy dump``, where installed and ``spy``),
    else the kernel function each of its threads waits in (``/proc/PID/task/*/wchan``)."""
    import shutil
    import subprocess

    exe = shutil.which("py-spy") if spy else None
    if exe is not None:
        try:
            done = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20)
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    threads = []
    for task in sorted((proc / str(pid) / "task").glob("*"), key=lambda p: int(p.name) if p.name.isdigit() else 0):
        try:
            name = (task / "comm").read_text().strip()
            wchan = (task / "wchan").read_text().strip() or "running"
        except OSError:
            continue
        threads.append(f"{task.name} {name}: {wchan}")
    return ("threads waiting in (kernel functions; no Python stacks): " + "; ".join(threads)) if threads else "gone"


def owner_value(pid: int | None = None) -> str:
    """:data:`OWNER_VARIABLE`'s value for ``pid`` (this process by default)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{start_time(pid)}"


def _environments(proc: Path = _PROC) -> Iterator[tuple[int, dict[bytes, bytes]]]:
    """(pid, the baft variables of its environment) of every live process this one may read."""
    for d in proc.iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # exited meanwhile, or not ours to read
        if state == "Z" or b"BAFT_RUN_" not in env:
            continue
        pairs = (item.partition(b"=") for item in env.split(b"\0") if item.startswith(b"BAFT_"))
        yield int(d.name), {k: v for k, _, v in pairs}


def owned(token: str, proc: Path = _PROC, node: int | None = None) -> list[int]:
    """Pids of the live processes whose environment carries ``token`` (never this process); with ``node``,
    only those of that node (its agent, workers and whatever they started, its store)."""
    key, value = TOKEN_VARIABLE.encode(), token.encode()
    return [pid for pid, env in _environments(proc) if env.get(key) == value
            and (node is None or env.get(NODE_VARIABLE.encode()) == str(node).encode())]


def orphaned(proc: Path = _PROC) -> dict[str, list[int]]:
    """The launches whose harness is gone but whose processes are not: token -> pids."""
    out: dict[str, list[int]] = {}
    for pid, env in _environments(proc):
        token, owner = env.get(TOKEN_VARIABLE.encode()), env.get(OWNER_VARIABLE.encode())
        if token is None or owner is None:
            continue
        owner_pid, _, start = owner.decode(errors="replace").partition(":")
        if not owner_pid.isdigit() or start_time(int(owner_pid), proc) != start:
            out.setdefault(token.decode(errors="replace"), []).append(pid)
    return out


def signal_all(pids: list[int], sig: int) -> None:
    """Send ``sig`` to each of ``pids``; those already gone are skipped."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_owned(token: str, grace: float = 2.0) -> list[int]:
    """Stop every process carrying ``token``: SIGCONT, SIGTERM, then SIGKILL after ``grace`` seconds.

    Returns the pids that had to be killed. Zombies whose parent is gone are reaped by init; those
    that are this process's children are reaped by their ``Popen``.
    """
    pids = owned(token)
    if not pids:
        return []
    signal_all(pids, signal.SIGCONT)
    signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        pids = owned(token)
        if not pids:
            return []
        time.sleep(0.05)
    killed = owned(token)
    # multiprocessing's resource tracker (it ignores SIGTERM) unlinks the semaphores and shared memory its
    # processes leaked once the last of them is gone; killed with them, it leaves /dev/shm/sem.mp-* behind
    trackers = [pid for pid in killed if is_resource_tracker(pid)]
    signal_all([pid for pid in killed if pid not in trackers], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while (left := owned(token)) and time.monotonic() < deadline:
        if set(left) <= set(trackers) and time.monotonic() > deadline - 2:
            break  # 3 s for a tracker to see its processes gone and clean up; then it is killed too
        time.sleep(0.05)
    signal_all([pid for pid in trackers if pid in owned(token)], signal.SIGKILL)
    return killed


@contextlib.contextmanager
def cancellation() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise :class:`Cancelled` in the main thread, once.

    A second signal while the cleanup runs is ignored (the cleanup is bounded): a cleanup
    interrupted half way would leave exactly what it exists to remove.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if fired:
            return
        fired.append(signum)
        raise Cancelled(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
