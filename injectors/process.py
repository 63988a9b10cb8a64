"""Process faults: kill or crash a rank, hang it, lose a whole node."""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from baft.events import RESTORE_PHASES
from baft.strategies.registry import CHECKPOINT_PHASES, STEP_CHECKPOINT_PHASES

from .base import RunShape
from .errors import FaultConfigError
from .trigger import TRAINING_PHASES, PointFault
from .worker import InWorkerInjector

#: Phases the training loop announces at every step that a process fault can be keyed to.
LOOP_PHASES: tuple[str, ...] = TRAINING_PHASES
#: Phases a fault inside the worker can be keyed to: the loop's and those the strategies announce
#: (each strategy declares its own, ``baft.strategies.Strategy.phases``).
WORKER_PHASES: tuple[str, ...] = LOOP_PHASES + CHECKPOINT_PHASES
#: Phases announced at every step: the loop's and those a strategy announces in its iterations.
STEP_PHASES: tuple[str, ...] = LOOP_PHASES + STEP_CHECKPOINT_PHASES


@dataclass(kw_only=True, slots=True)
class RankFault(PointFault):
    """A point fault that takes one rank down, at any phase a worker announces."""

    fatal: ClassVar[bool] = True
    phases: ClassVar[tuple[str, ...]] = WORKER_PHASES
    rank: int
    """Global rank the fault hits."""

    def __post_init__(self) -> None:
        if self.rank < 0:
            raise FaultConfigError("rank", "a rank >= 0", self.rank)


@dataclass(kw_only=True, slots=True)
class KillConfig(RankFault):
    """Send a signal to one rank when its trigger fires."""

    kind: ClassVar[str] = "kill"
    signal: Literal["SIGKILL", "SIGTERM", "SIGINT", "SIGABRT"] = "SIGKILL"
    """SIGKILL: no cleanup at all; SIGTERM / SIGINT: the process may run its handlers; SIGABRT: a core-dump style abort."""


class KillInjector(InWorkerInjector):
    """Signals its own process: the fault fires at exactly the configured point."""

    def inject(self, fields: dict[str, Any]) -> None:
        os.kill(os.getpid(), getattr(signal, self.config.signal))


@dataclass(kw_only=True, slots=True)
class CrashConfig(RankFault):
    """A rank crashes by itself: a segmentation fault, an abort, an exit or an uncaught exception."""

    kind: ClassVar[str] = "crash"
    how: Literal["segfault", "abort", "exit", "exception", "async_exception"] = "segfault"
    """``segfault``: a real invalid memory read; ``abort``: ``abort()``; ``exit``: exit code 1
    without cleanup; ``exception``: an uncaught Python exception through the training loop;
    ``async_exception``: an exception raised asynchronously in the training thread a moment later
    (``PyThreadState_SetAsyncExc``, as NVIDIA's resiliency extension injects one): it surfaces in whatever
    Python that thread runs next — the loop, a framework's callback, the return from a collective."""


class InjectedCrash(RuntimeError):
    """The exception a ``crash: {how: exception}`` raises through the training loop."""


class AsyncInjectedCrash(InjectedCrash):
    """The exception a ``crash: {how: async_exception}`` raises in the training thread from another thread."""


#: How long after the fault's moment the asynchronous exception is raised in the training thread.
ASYNC_DELAY = 0.05


def raise_in_thread(ident: int, exc: type[BaseException], delay: float) -> threading.Thread:
    """Raise ``exc`` in the thread ``ident`` after ``delay`` seconds, from a thread of its own."""
    def fire() -> None:
        time.sleep(delay)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc))

    t = threading.Thread(target=fire, name="baft-async-crash", daemon=True)
    t.start()
    return t


def hold_the_gil() -> None:
    """Take the interpreter lock and never give it back: a C call made while holding it (``ctypes.PyDLL`` does not
    release it), this thread's signals blocked so that none ends the call."""
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    libc = ctypes.PyDLL(None)
    while True:
        libc.sleep(3600)


class CrashInjector(InWorkerInjector):
    def inject(self, fields: dict[str, Any]) -> None:
        how = self.config.how
        if how == "async_exception":
            raise_in_thread(threading.get_ident(), AsyncInjectedCrash, ASYNC_DELAY)
            return
        if how == "segfault":
            ctypes.string_at(0)  # reads address 0: SIGSEGV from the hardware, not a sent signal
        elif how == "abort":
            os.abort()
        elif how == "exit":
            os._exit(1)
        raise InjectedCrash(f"injected crash of rank {self.ctx.rank} at step {fields.get('step')}")


@dataclass(kw_only=True, slots=True)
class HangConfig(RankFault):
    """A rank stops (SIGSTOP) and never comes back by itself.

    torchrun alone would wait forever (the other ranks block in gloo); the
    harness's watchdog notices that the job stopped making progress, journals
    how long detection took, continues and kills the stopped process, and
    torchrun restarts every worker, which restore the newest checkpoint.
    """

    kind: ClassVar[str] = "hang"
    how: Literal["sigstop", "gil"] = "sigstop"
    """``sigstop``: the whole process stopped; ``gil``: a thread of the rank takes the interpreter lock and never
    gives it back (as NVIDIA's resiliency extension injects): the process runs, its C++ threads too, but no
    Python runs again — the step stops, the peers' collectives wait; the watchdog kills the job's workers."""


class HangInjector(InWorkerInjector):
    def inject(self, fields: dict[str, Any]) -> None:
        if self.config.how == "gil":
            threading.Thread(target=hold_the_gil, name="baft-gil-hold", daemon=True).start()
            return
        os.kill(os.getpid(), signal.SIGSTOP)


@dataclass(kw_only=True, slots=True)
class NodeLossConfig(PointFault):
    """Lose a node: every worker on it, its checkpoint store and its memory.

    With a replacement (the default) the node's torchrun agent survives and restarts
    the workers, playing the replacement node; the harness starts a fresh store with
    empty memory. Without one the agent dies too, nothing restarts on that node, and
    the job continues elastically on the nodes that remain.
    """

    kind: ClassVar[str] = "node_loss"
    fatal: ClassVar[bool] = True
    phases: ClassVar[tuple[str, ...]] = STEP_PHASES + tuple(p for p in CHECKPOINT_PHASES if p in RESTORE_PHASES)
    node: int
    """Index of the node to lose."""
    replacement: bool = True
    """False: the node is lost for good; the job goes on with fewer data-parallel replicas
    (torchrun ``--nnodes MIN:MAX``) and the same global batch (more microbatches each)."""

    def __post_init__(self) -> None:
        if self.node < 0:
            raise FaultConfigError("node", "a node >= 0", self.node)

    def check(self, run: RunShape) -> None:
        PointFault.check(self, run)
        if not self.replacement:
            check_lost_for_good(self, self.node, "replacement")

    def targets(self, rank: int, node: int, local_rank: int) -> bool:
        return node == self.node and local_rank == 0


def check_lost_for_good(fault: PointFault, node: int, flag: str) -> None:
    """A node lost for good (``flag`` false): never node 0, only once."""
    if node == 0:
        raise FaultConfigError("node", f"a node other than 0 when {flag} is false (node 0 hosts the "
                               "rendezvous; the job cannot outlive it)", node)
    if fault.every is not None or fault.every_seconds is not None or fault.mtbf is not None:
        raise FaultConfigError(flag, "true with a periodic or random trigger (a node can be lost "
                               "for good only once)", False)


#: What the command line of multiprocessing's own helper processes runs: the fork server (torchrun's
#: ``forkserver`` start method) and the resource tracker.
MP_HELPERS = (b"from multiprocessing.forkserver import", b"from multiprocessing.resource_tracker import")

#: The process name (``/proc/PID/comm``, at most 15 bytes) of a fork server forked from its agent
#: (harness.run.agent), whose command line is the agent's own.
FORK_SERVER_NAME = b"baft-forkserver"


def _parent(pid: int) -> int | None:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _mp_helper(pid: int) -> bool:
    try:
        cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes()
        comm = (Path("/proc") / str(pid) / "comm").read_bytes().strip()
    except OSError:
        return False
    return comm == FORK_SERVER_NAME or any(h in cmdline for h in MP_HELPERS)


def is_resource_tracker(pid: int) -> bool:
    """Whether ``pid`` is multiprocessing's resource tracker (killed with the processes it tracks, it leaves
    their semaphores in /dev/shm; alone, it unlinks them once they are gone and exits)."""
    try:
        return MP_HELPERS[1] in (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, state letter, e.g. ``T`` for stopped) of every process below ``pid``, from /proc."""
    table: dict[int, tuple[int, str]] = {}  # pid -> (parent, state)
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            rest = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        table[int(d.name)] = (int(rest[1]), rest[0])
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        for child, (parent, state) in table.items():
            if parent == p:
                out.append((child, state))
                frontier.append(child)
    return out


def workers_of(agent: int) -> list[tuple[int, str]]:
    """:func:`descendants` of a torchrun agent without multiprocessing's helpers (the agent's
    children running :data:`MP_HELPERS`): the workers and whatever they started. A worker forked by
    the fork server runs the server's command line too, but it is the server's child, not the agent's."""
    return [(p, st) for p, st in descendants(agent) if not (_parent(p) == agent and _mp_helper(p))]


def agent_of(worker: int) -> int | None:
    """The torchrun agent of a worker: its parent, or the parent of the fork server that forked it."""
    parent = _parent(worker)
    if parent is not None and _mp_helper(parent):
        return _parent(parent)
    return parent


def lost_marker(fault_dir: Path, node: int) -> Path:
    """The file that says ``node`` is gone for good (the harness then restarts nothing there)."""
    return fault_dir / f"node{node}.lost"


class NodeLossInjector(InWorkerInjector):
    """Fired by local rank 0 of the node: kills the store, wipes the memory, kills every worker
    (and, without a replacement, the node's torchrun agent first, so nothing restarts)."""

    def inject(self, fields: dict[str, Any]) -> None:
        agent = agent_of(os.getpid()) or os.getppid()
        workers = workers_of(agent)
        if not self.config.replacement:
            lost_marker(self.ctx.fault_dir, self.config.node).touch()
            os.kill(agent, signal.SIGKILL)
        memory = self.ctx.node_memory
        if memory is not None:
            try:
                os.kill(int((memory / "store.pid").read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
            shutil.rmtree(memory, ignore_errors=True)
        me = os.getpid()
        for pid, _ in workers:
            if pid != me:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        os.kill(me, signal.SIGKILL)
