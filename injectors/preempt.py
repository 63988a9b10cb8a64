"""Preemption: the job's processes get SIGTERM, a grace period, then SIGKILL; the node comes back or not.

This is what a Kubernetes eviction, a spot reclaim or a SLURM preemption does to a training job: every
process of the node is asked to stop (``SIGTERM``), whatever is still alive ``grace_s`` seconds later is
killed (``SIGKILL``), and the node's memory is gone with it. Training code saves "now" in its SIGTERM
handler — mid-step, mid-accumulation, or too slowly for the grace. Then the job's controller brings a
replacement node (``restart: true``) or the job goes on elastically without it (``restart: false``).

The fault is fired inside the worker at its exact point (step and phase, or a time) like the other process
faults, but signals cannot be sent by a process that is itself to be signalled and outlive its own death:
the worker writes a :class:`PreemptRequest` into the run's fault directory and waits until the harness
(``harness.run.preempt``) has sent the SIGTERMs, so the signal arrives at the configured point. The
harness then times the grace, journals what each rank did in it (exited by itself after S seconds, or
killed), kills what is left with the node's store and memory, and starts the replacement agent.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .base import RunShape
from .errors import FaultConfigError
from .handoff import Request, await_ack, post
from .handoff import ack_path as ack_path  # where the harness acknowledges (importable here as before)
from .process import STEP_PHASES, check_lost_for_good
from .trigger import PointFault
from .worker import InWorkerInjector

#: Seconds the firing worker waits for the harness to deliver the SIGTERMs before it gives up.
ACK_TIMEOUT = 10.0


@dataclass(kw_only=True, slots=True)
class PreemptConfig(PointFault):
    """Preempt a node (every process of it) or some ranks: SIGTERM, ``grace_s``, SIGKILL, then a restart."""

    kind: ClassVar[str] = "preempt"
    fatal: ClassVar[bool] = True
    phases: ClassVar[tuple[str, ...]] = STEP_PHASES
    node: int | None = None
    """The node preempted: its torchrun agent and every worker get SIGTERM. Node 0 hosts the rendezvous:
    preempting it restarts every node's agent (as a job controller does when the job's master pod goes)."""
    ranks: list[int] | None = None
    """Instead of ``node``: these ranks' workers get SIGTERM (one pod per rank); their agent stays and
    restarts the job's workers once they are gone."""
    grace_s: float = 30.0
    """Seconds between SIGTERM and SIGKILL (Kubernetes' ``terminationGracePeriodSeconds``, 30 by default)."""
    restart: bool = True
    """False: the node does not come back (a spot reclaim with no capacity left); the job continues
    elastically on the nodes that remain (``node`` only, not node 0)."""

    @property
    def replacement(self) -> bool:
        """Whether the preempted node comes back (what the scenario's elastic checks read)."""
        return self.restart

    def __post_init__(self) -> None:
        if (self.node is None) == (self.ranks is None):
            raise FaultConfigError("node", "exactly one of node or ranks", self.node if self.ranks is None else self.ranks)
        if self.node is not None and self.node < 0:
            raise FaultConfigError("node", "a node >= 0", self.node)
        if self.ranks is not None and (not self.ranks or len(set(self.ranks)) != len(self.ranks)
                                       or min(self.ranks) < 0):
            raise FaultConfigError("ranks", "a non-empty list of distinct ranks >= 0", self.ranks)
        if self.grace_s < 0:
            raise FaultConfigError("grace_s", "seconds >= 0", self.grace_s)

    def check(self, run: RunShape) -> None:
        PointFault.check(self, run)
        for r in self.ranks or []:
            if r >= run.world_size:
                raise FaultConfigError("ranks", f"ranks in 0..{run.world_size - 1}", self.ranks)
        if not self.restart:
            if self.node is None:
                raise FaultConfigError("restart", "true with ranks (only a node can stay gone)", self.restart)
            check_lost_for_good(self, self.node, "restart")

    def targets(self, rank: int, node: int, local_rank: int) -> bool:
        if self.ranks is not None:
            return rank == min(self.ranks)
        return node == self.node and local_rank == 0


@dataclass(kw_only=True, slots=True)
class PreemptRequest(Request):
    """What a worker asks the harness to do when a preempt fault fires (a JSON file in the fault directory)."""

    fault_id: int
    occurrence: int
    node: int | None
    ranks: list[int] | None
    grace_s: float
    restart: bool
    step: int
    phase: str
    rank: int
    """The rank that fired it."""
    at: float
    """``time.time()`` when it fired."""


def request_path(fault_dir: Path, fault_id: int, occurrence: int) -> Path:
    """Where a worker leaves its request (``.request``); the harness renames it to ``.taken``."""
    return fault_dir / f"{fault_id}-preempt-{occurrence}.request"


def write_request(fault_dir: Path, req: PreemptRequest) -> Path:
    """Write ``req`` atomically (the harness never reads half a request)."""
    return post(request_path(fault_dir, req.fault_id, req.occurrence), req.dumps())


class PreemptInjector(InWorkerInjector):
    """Asks the harness for the preemption and waits until the SIGTERMs were sent, so they arrive here, at
    the configured point, and on the other processes at the same moment. The process then goes on: what it
    does with the signal (a handler that saves, or the default: it dies) is the job's business."""

    _occurrence = 0

    def _mark(self, occurrence: int) -> None:
        InWorkerInjector._mark(self, occurrence)
        self._occurrence = occurrence

    def inject(self, fields: dict[str, Any]) -> None:
        c: PreemptConfig = self.config
        req = PreemptRequest(fault_id=self.fault_id, occurrence=self._occurrence, node=c.node, ranks=c.ranks,
                             grace_s=c.grace_s, restart=c.restart, step=int(fields.get("step", -1)),
                             phase=str(fields.get("phase", "")), rank=self.ctx.rank, at=time.time())
        path = write_request(self.ctx.fault_dir, req)
        await_ack(path, ACK_TIMEOUT, "a preempt fault runs under `baft run`, which sends the signals")
