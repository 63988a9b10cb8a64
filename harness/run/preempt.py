"""The harness's side of a preemption: the signals, the grace period, what each rank did in it, the node back.

A worker whose preempt fault fires leaves a :class:`~injectors.preempt.PreemptRequest` in the run's fault
directory and waits. The :class:`PreemptController` (a thread of the launch) takes it and does what a
container runtime and a job controller do:

1. **SIGTERM** to the node's torchrun agent and to each of its workers (or to the ranks named), the agent
   first — as SLURM signals every task of a job, and as Kubernetes signals a container's first process,
   which torchrun forwards to its workers a moment later — then tells the worker it may go on;
2. the **grace period**: each targeted rank that exits by itself is journaled with the seconds it took;
3. **SIGKILL** to whatever of the node is still alive after ``grace_s`` (the node's processes, found by the
   launch's token and node index), journaled per rank as killed; the node's store and its shared memory go
   with it (a preempted node's memory does not survive);
4. the node **comes back**: a new agent joins the job's rendezvous (the other nodes' workers failed with
   the preempted ones and wait there for it); node 0 hosts the rendezvous, so its preemption restarts every
   node's agent on a new one. With ``restart: false`` the node stays gone and the job continues elastically.

The hang watchdog is held while a preemption is handled (a job in its grace is silent, not hung).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.journal import JournalWriter
from injectors.preempt import PreemptRequest, ack_path
from injectors.process import agent_of, is_resource_tracker, lost_marker, workers_of

from harness.run.processes import owned
from harness.run.progress import JournalProgress

if TYPE_CHECKING:
    from harness.run.agents import AgentSet
    from harness.run.storefleet import StoreFleet
    from harness.run.watchdog import Watchdog

#: How often the controller looks for requests and, in a grace period, for processes that exited.
POLL = 0.01


def _gone(pid: int) -> bool:
    """Exited (a zombie waiting for its parent counts) or never there."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class PreemptController:
    """Serves the preempt requests of one launch's workers."""

    def __init__(self, run_dir: Path, agents: AgentSet, journal: JournalWriter, token: str, *,
                 fleet: StoreFleet | None = None, watchdog: Watchdog | None = None) -> None:
        self.fault_dir = run_dir / "faults"
        self.agents, self.journal, self.token, self.fleet, self.watchdog = agents, journal, token, fleet, watchdog
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="preempt-controller", daemon=True)
        self._busy = False
        self.error: BaseException | None = None
        self.progress = JournalProgress(run_dir)
        """Which pid each rank's newest worker has (its ``start`` event: a worker forked by torchrun's fork
        server does not show its ``RANK`` in ``/proc/PID/environ``)."""

    @property
    def busy(self) -> bool:
        """A preemption is under way (from its request until the node is back or gone for good)."""
        return self._busy or any(self.fault_dir.glob("*.request"))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(POLL):
            for path in sorted(self.fault_dir.glob("*.request")) if self.fault_dir.is_dir() else []:
                taken = path.with_suffix(".taken")
                self._busy = True
                try:
                    os.replace(path, taken)
                    self.serve(PreemptRequest.loads(taken.read_text()), ack_path(path))
                except Exception as e:  # journaled; the launch goes on (its deadline still holds)
                    self.error = e
                    self.journal.write("preempt_error", request=path.name, error=f"{type(e).__name__}: {e}", sync=True)
                finally:
                    self._busy = False

    # -- one preemption -----------------------------------------------------------------------
    def serve(self, req: PreemptRequest, ack: Path) -> None:
        agent = None if req.node is None else self.agents.procs[req.node]
        targets = self._targets(req, agent.pid if agent is not None else None)
        if self.watchdog is not None:
            self.watchdog.held += 1
        try:
            signaled_at = time.time()
            _signal([agent.pid] if agent is not None else [], signal.SIGTERM)
            _signal(list(targets), signal.SIGTERM)
            ack.touch()  # the firing worker goes on: its signal is delivered
            self.journal.write("preempt_signal", fault=req.fault_id, occurrence=req.occurrence, node=req.node,
                               ranks=sorted(targets.values()), grace_s=req.grace_s, step=req.step, phase=req.phase,
                               fired_by=req.rank, delay=round(signaled_at - req.at, 4),
                               agent_pid=agent.pid if agent is not None else None, pids=sorted(targets), sync=True)
            exited = self._grace(req, targets, agent, signaled_at)
            killed = self._kill_rest(req, targets, exited, agent.pid if agent is not None else None)
            for pid, rank in sorted(targets.items(), key=lambda kv: kv[1]):
                outcome = "exited" if pid in exited else "killed"
                self.journal.write("preempt_outcome", fault=req.fault_id, rank=rank, pid=pid, outcome=outcome,
                                   seconds=round(exited.get(pid, req.grace_s), 3), grace_s=req.grace_s)
            self.journal.write("preempt_end", fault=req.fault_id, node=req.node, killed=killed,
                               seconds=round(time.time() - signaled_at, 3), restart=req.restart, sync=True)
            self._bring_back(req)
        finally:
            if self.watchdog is not None:
                self.watchdog.held -= 1

    def _targets(self, req: PreemptRequest, agent: int | None) -> dict[int, int]:
        """pid -> rank of the workers signalled: the node's (its agent's own workers, not what they started),
        or the named ranks' on any node."""
        agents = [agent] if agent is not None else [a.pid for a in self.agents.procs if a.poll() is None]
        self.progress.poll()
        rank_of = {pid: rank for rank, pid in self.progress.pids.items()}
        out = {}
        for a in agents:
            for pid, _ in workers_of(a):
                if agent_of(pid) != a:
                    continue  # started by a worker (a writer process): it goes with it
                rank = rank_of.get(pid, -1)  # -1: not journaled yet (still starting)
                if req.ranks is None or rank in req.ranks:
                    out[pid] = rank
        return out

    def _grace(self, req: PreemptRequest, targets: dict[int, int], agent: Any, since: float) -> dict[int, float]:
        """Wait up to ``grace_s`` for the targets (and the node's agent) to exit; pid -> seconds it took."""
        exited: dict[int, float] = {}
        end = since + req.grace_s
        while time.time() < end and not self._stop.is_set():
            for pid in targets:
                if pid not in exited and _gone(pid):
                    exited[pid] = time.time() - since
            if len(exited) == len(targets) and (agent is None or agent.poll() is not None):
                break
            time.sleep(POLL)
        return exited

    def _kill_rest(self, req: PreemptRequest, targets: dict[int, int], exited: dict[int, float],
                   agent: int | None) -> list[int]:
        """SIGKILL what is left: the node's processes (its store aside: the fleet takes it with the memory),
        or the named ranks' workers and what they started. Returns the ranks killed."""
        left = [p for p in targets if p not in exited]
        victims = left + [c for p in left for c, _ in workers_of(p)]
        if req.node is not None:
            if not req.restart:  # before anything dies: nothing of the node is replaced
                lost_marker(self.fault_dir, req.node).touch()
            store = self.fleet.procs[req.node] if self.fleet is not None else None
            spare = {store.pid} if store is not None else set()
            # the agent and everything below it, and whatever of the node left it (orphans carry the token)
            victims += ([agent] + [c for c, _ in workers_of(agent)] if agent is not None else [])
            victims += [p for p in owned(self.token, node=req.node) if p not in spare]
        # multiprocessing's resource tracker outlives its processes by a moment to unlink their semaphores
        _signal([p for p in dict.fromkeys(victims) if not is_resource_tracker(p)], signal.SIGKILL)
        if req.node is not None and self.fleet is not None:
            self.fleet.lose(req.node, reason="preempted")
        return sorted(rank for pid, rank in targets.items() if pid not in exited)

    def _bring_back(self, req: PreemptRequest) -> None:
        if req.node is None or not req.restart:
            return  # the ranks' agents restart their workers; a node lost for good stays gone
        why = {"reason": "preempted", "fault": req.fault_id}
        if req.node == 0:
            # the rendezvous lived in node 0's agent: every other agent's workers failed or will; end them
            # (their memory and stores stay: those nodes were not preempted) and start the job again
            for node in range(1, len(self.agents.procs)):
                spare = {self.fleet.procs[node].pid} if self.fleet is not None and self.fleet.procs[node] else set()
                _signal([p for p in owned(self.token, node=node) if p not in spare and not is_resource_tracker(p)],
                        signal.SIGKILL)
            self.agents.restart_all(**why)
        else:
            self.agents.journal_exit(req.node, **why)
            self.agents.start(req.node, **why)
