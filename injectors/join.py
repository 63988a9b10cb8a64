"""Elastic growth: a node lost for good comes back, and the job re-forms with more nodes.

This is a job controller bringing a replacement node to a job that shrank (torchrun ``--nnodes MIN:MAX``):
the new node's agent joins the rendezvous; the running agents see a node waiting, stop their workers
(SIGTERM, as torchrun does on a membership change: not a failure, no restart counted against
``--max-restarts``) and every node starts its workers again in the larger world, where each rank restores
the newest version every rank can get (the new ranks from their peers' memory, else the persistent tier).

The fault fires inside rank 0 at its exact step and phase (node 0 hosts the rendezvous: it never leaves
for good, so rank 0 is there to fire it); the worker posts a :class:`JoinRequest` and the harness
(:mod:`harness.run.join`) starts the node's store on empty memory and its agent, then acknowledges. Rank 0
then holds at that point until its agent stops it to re-form the job (SIGTERM, which then takes its usual
course), so that the job grows at the step the scenario names and not whenever the new agent happens to be
ready (a short job could otherwise finish first).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .base import RunShape
from .errors import FaultConfigError, InjectorError
from .handoff import Request, await_ack, post
from .process import LOOP_PHASES
from .trigger import PointFault
from .worker import InWorkerInjector

#: Seconds the firing worker waits for the harness to start the node before it gives up.
ACK_TIMEOUT = 30.0
#: Seconds rank 0 holds, once the node's agent started, for its own agent to stop it and re-form the job.
REFORM_TIMEOUT = 90.0


@dataclass(kw_only=True, slots=True)
class NodeJoinConfig(PointFault):
    """A node that an earlier fault took away for good (``node_loss`` with ``replacement: false`` or
    ``preempt`` with ``restart: false``) comes back: its store and agent start, and the job re-forms with it."""

    kind: ClassVar[str] = "node_join"
    fatal: ClassVar[bool] = True
    """Every worker is stopped and started again in the larger world (a recovery the verdict measures)."""
    phases: ClassVar[tuple[str, ...]] = LOOP_PHASES
    node: int
    """Index of the node that joins (one lost for good earlier in the run)."""

    def __post_init__(self) -> None:
        if self.node < 1:
            raise FaultConfigError("node", "a node >= 1 (node 0 hosts the rendezvous and is never lost for good)",
                                   self.node)

    def check(self, run: RunShape) -> None:
        PointFault.check(self, run)
        if self.node >= run.nodes:
            raise FaultConfigError("node", f"a node in 1..{run.nodes - 1}", self.node)
        if self.at_step is None and self.at_time is None:
            raise FaultConfigError("at_step", "at_step or at_time (a node joins once, at a point of the run)", None)
        if self.every is not None or self.every_seconds is not None:
            raise FaultConfigError("every", "no repetition (a node lost for good joins once)", self.every)

    def targets(self, rank: int, node: int, local_rank: int) -> bool:
        return rank == 0


@dataclass(kw_only=True, slots=True)
class JoinRequest(Request):
    """What rank 0 asks the harness to do when a node_join fault fires (a JSON file in the fault directory)."""

    fault_id: int
    node: int
    step: int
    phase: str
    at: float
    """``time.time()`` when it fired."""


def request_path(fault_dir: Path, fault_id: int) -> Path:
    """Where rank 0 leaves the request (``.join``); the harness renames it to ``.taken``."""
    return fault_dir / f"{fault_id}-node_join.join"


class NodeJoinInjector(InWorkerInjector):
    """Asks the harness to bring the node back and waits until its agent has started; the job goes on
    until the agents re-form it."""

    def inject(self, fields: dict[str, Any]) -> None:
        req = JoinRequest(fault_id=self.fault_id, node=self.config.node, step=int(fields.get("step", -1)),
                          phase=str(fields.get("phase", "")), at=time.time())
        if threading.current_thread() is not threading.main_thread():
            raise InjectorError("node_join fires in the main thread (it holds the rank until SIGTERM arrives)")
        got = threading.Event()
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.set())
        try:
            path = post(request_path(self.ctx.fault_dir, self.fault_id), req.dumps())
            failure = await_ack(path, ACK_TIMEOUT, "a node_join fault runs under `baft run`, which starts the node")
            if failure:
                raise InjectorError(f"node_join: the harness could not bring node {self.config.node} back: {failure}")
            deadline = time.monotonic() + REFORM_TIMEOUT
            while not got.is_set():
                if time.monotonic() > deadline:
                    raise InjectorError(f"node_join: node {self.config.node}'s agent started, but the job did not "
                                        f"re-form with it within {REFORM_TIMEOUT:g} s (see the node's agent log)")
                time.sleep(0.005)
        finally:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            if got.is_set():  # also when the join failed: a SIGTERM held meanwhile is not swallowed
                _deliver(previous)


def _deliver(handler: Any) -> None:
    """Let the SIGTERM held for the re-form take the course it would have taken: the handler the process had,
    or the default action (the process ends)."""
    if callable(handler):
        handler(signal.SIGTERM, None)
    elif handler in (signal.SIG_DFL, None):
        os.kill(os.getpid(), signal.SIGTERM)
