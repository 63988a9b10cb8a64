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

#: Environment variable holding the token of the launch that started a process.
TOKEN_VARIABLE = "BAFT_RUN_TOKEN"


def new_token() -> str:
    return uuid.uuid4().hex


def owned(token: str, proc: Path = Path("/proc")) -> list[int]:
    """Pids of the live processes whose environment carries ``token`` (never this process)."""
    needle = f"{TOKEN_VARIABLE}={token}".encode()
    found = []
    for d in proc.iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # exited meanwhile, or not ours to read
        if state != "Z" and needle in env.split(b"\0"):
            found.append(int(d.name))
    return found


def _signal_all(pids: list[int], sig: int) -> None:
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
    _signal_all(pids, signal.SIGCONT)
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        pids = owned(token)
        if not pids:
            return []
        time.sleep(0.05)
    killed = owned(token)
    _signal_all(killed, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while owned(token) and time.monotonic() < deadline:
        time.sleep(0.05)
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
