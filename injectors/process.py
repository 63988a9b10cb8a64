"""Process faults: kill a rank at a step; lose a whole node."""
from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from dataclasses import dataclass
from typing import ClassVar, Literal

from .base import FaultConfig, InWorkerInjector
from .errors import FaultConfigError


@dataclass(kw_only=True, slots=True)
class KillConfig(FaultConfig):
    """Send a signal to one rank when it reaches a step."""

    kind: ClassVar[str] = "kill"
    rank: int
    """Global rank to kill."""
    at_step: int
    """0-based iteration at whose start the signal is sent (that many steps have completed)."""
    phase: Literal["iteration", "optimizer", "snapshot", "replicate", "persist", "restore"] = "iteration"
    """Where it fires: ``iteration`` at the start of step ``at_step``; ``optimizer`` just before
    its optimizer step; ``snapshot`` when baft starts copying version ``at_step`` (inside the
    bubbles); ``replicate`` right after handing sealed version ``at_step`` to the node's store
    for replication; ``persist`` when baft's background thread starts writing version
    ``at_step``; ``restore`` when a restarted job starts loading step ``at_step``."""
    signal: Literal["SIGKILL", "SIGTERM"] = "SIGKILL"
    """SIGKILL: no cleanup at all; SIGTERM: the process may run its handlers."""

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise FaultConfigError("rank", "a rank >= 0", self.rank)
        if self.at_step < 0:
            raise FaultConfigError("at_step", "a step >= 0", self.at_step)


class KillInjector(InWorkerInjector):
    """Signals its own process: the fault fires at exactly the configured step."""

    def inject(self) -> None:
        os.kill(os.getpid(), getattr(signal, self.config.signal))


@dataclass(kw_only=True, slots=True)
class NodeLossConfig(FaultConfig):
    """Lose a node at a step: every worker on it, its checkpoint store and its memory.

    Locally the node's torchrun agent survives and restarts the workers, playing
    the replacement node; the harness starts a fresh store with empty memory.
    """

    kind: ClassVar[str] = "node_loss"
    node: int
    """Index of the node to lose."""
    at_step: int
    """0-based iteration at whose start the node goes."""
    phase: Literal["iteration", "optimizer", "snapshot"] = "iteration"
    """Where in the iteration (see ``kill``)."""

    def __post_init__(self) -> None:
        if self.node < 0:
            raise FaultConfigError("node", "a node >= 0", self.node)
        if self.at_step < 0:
            raise FaultConfigError("at_step", "a step >= 0", self.at_step)


def _children_of(ppid: int) -> list[int]:
    """PIDs whose parent is ``ppid`` (from /proc)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == ppid:
            out.append(int(d.name))
    return out


class NodeLossInjector(InWorkerInjector):
    """Fired by local rank 0 of the node: kills the store, wipes the memory, kills every worker."""

    def mine(self) -> bool:
        return self.ctx.node == self.config.node and self.ctx.local_rank == 0

    def inject(self) -> None:
        memory = self.ctx.node_memory
        if memory is not None:
            try:
                os.kill(int((memory / "store.pid").read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
            shutil.rmtree(memory, ignore_errors=True)
        me = os.getpid()
        for pid in _children_of(os.getppid()):
            if pid != me:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        os.kill(me, signal.SIGKILL)
