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
4. the node **comes back**, whatever its ranks did in the grace (saved and exited 0, exited 143, were
   killed at its end; as a cluster replaces an evicted pod whatever its exit code): a new agent joins the job's rendezvous (the other nodes' workers failed with
   the preempted ones and wait there for it); node 0 hosts the rendezvous, so its preemption restarts every
   node's agent on a new one. With ``restart: false`` the node stays gone and the job continues elastically.

The hang watchdog is held while a preemption is handled (a job in its grace is silent, not hung).
"""
from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.journal import JournalWriter
from harness.run.processes import owned, signal_all
from harness.run.progress import JournalProgress
from injectors.handoff import acknowledge, take
from injectors.preempt import PreemptRequest
from injectors.process import agent_of, is_resource_tracker, lost_marker, workers_of

if TYPE_CHECKING:
    from harness.run.agents import AgentSet
    from harness.run.storefleet import StoreFleet
    from harness.run.watchdog import Watchdog

#: How often the controller looks for requests and, in a grace period, for processes that exited.
POLL = 0.02


def _gone(pid: int) -> bool:
    """Exited (a zombie waiting for its parent counts) or never there."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@dataclass(slots=True)
class _Signaled:
    """A preemption whose SIGTERMs are out."""

    req: PreemptRequest
    agent: Any
    """The node's agent (its ``Popen``), None for ranks or an agent already gone."""
    targets: dict[int, int]
    """pid -> rank of the workers signalled."""
    unknown: list[int]
    """Workers of the node signalled whose rank was not journaled yet."""
    at: float
    replaced: Any = None
    """The node's agent (dead or alive) at the time of the signals: the one a replacement takes the place of."""
    exited: dict[int, float] = field(default_factory=dict)
    """pid -> seconds from the SIGTERM to its end, for the targets that ended so far."""
    finished_before: bool = False
    """The job had finished before the signals (then nothing comes back). Ranks that finish *in* the grace
    (a script that saves on SIGTERM and exits 0) do not count: an evicted pod is replaced whatever its code."""


class PreemptController:
    """Serves the preempt requests of one launch's workers."""

    def __init__(self, run_dir: Path, agents: AgentSet, journal: JournalWriter, token: str, *,
                 fleet: StoreFleet | None = None, watchdog: Watchdog | None = None) -> None:
        self.fault_dir = run_dir / "faults"
        self.agents, self.journal, self.token, self.fleet, self.watchdog = agents, journal, token, fleet, watchdog
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="preempt-controller", daemon=True)
        self._busy = False
        self._active: list[_Signaled] = []
        """The preemptions whose SIGTERMs are out and whose grace is not over."""
        self.error: BaseException | None = None
        self.progress = JournalProgress(run_dir)
        """Which pid each rank's newest worker has (its ``start`` event: a worker forked by torchrun's fork
        server does not show its ``RANK`` in ``/proc/PID/environ``)."""

    @property
    def busy(self) -> bool:
        """A preemption is under way (from its request until the node is back or gone for good)."""
        return self._busy or (self.fault_dir.is_dir() and any(self.fault_dir.glob("*.request")))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No node is brought back from now on (the launch is ending); waits for the thread."""
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        """One loop for every preemption at once: a request that arrives while another's grace runs is signalled
        at once too (its worker waits for the ack, and its peers' collectives wait for it)."""
        active = self._active
        polled = 0.0
        while not self._stop.wait(POLL):
            if time.monotonic() - polled > 0.5:
                self.progress.poll()  # kept current, so a request finds every worker's rank at once
                polled = time.monotonic()
            for path in sorted(self.fault_dir.glob("*.request")) if self.fault_dir.is_dir() else []:
                self._busy = True
                if (pre := self._signal(path)) is not None:
                    active.append(pre)
            for pre in [p for p in active if self._grace_over(p)]:
                active.remove(pre)
                self._finish(pre)
            self._busy = bool(active)
        for pre in active:  # the launch is ending: kill what is left, bring nothing back
            self._finish(pre)
        self._busy = False

    def _fail(self, name: str, e: BaseException) -> None:
        self.error = self.error or e
        self.journal.write("preempt_error", request=name, error=f"{type(e).__name__}: {e}", sync=True)

    # -- one preemption -----------------------------------------------------------------------
    def _signal(self, path: Path) -> _Signaled | None:
        """Take the request at ``path``, send its SIGTERMs, let its worker go on; None if it was withdrawn."""
        taken = take(path)  # the worker withdraws an old request by renaming it away first
        if taken is None:
            return None
        try:
            req = PreemptRequest.loads(taken.read_text())
            agent = None if req.node is None else self.agents.procs[req.node]
            if agent is not None and agent.poll() is not None:
                agent = None  # already gone: its pid may be another process's by now
            targets, unknown = self._targets(req, agent.pid if agent is not None else None)
            if self.watchdog is not None:
                self.watchdog.held += 1
            self.progress.poll()
            finished_before = self.progress.done
            signaled_at = time.time()
            if agent is not None:
                agent.send_signal(signal.SIGTERM)
            signal_all(list(targets) + unknown, signal.SIGTERM)
        except Exception as e:  # journaled; the launch ends with it as a failure
            self._fail(path.name, e)
            return None
        finally:
            acknowledge(path)  # the firing worker goes on: its signal is delivered
        self.journal.write("preempt_signal", fault=req.fault_id, occurrence=req.occurrence, node=req.node,
                           ranks=sorted(targets.values()), grace_s=req.grace_s, step=req.step, phase=req.phase,
                           fired_by=req.rank, delay=round(signaled_at - req.at, 4),
                           agent_pid=agent.pid if agent is not None else None, pids=sorted(targets),
                           unknown_pids=unknown, sync=True)
        return _Signaled(req=req, agent=agent, targets=targets, unknown=unknown, at=signaled_at,
                         replaced=None if req.node is None else self.agents.procs[req.node],
                         finished_before=finished_before)

    def _finish(self, pre: _Signaled) -> None:
        """Once the grace is over: the kills, the per-rank outcomes, the node back."""
        req, exited = pre.req, pre.exited
        try:
            killed = self._kill_rest(req, pre.targets, exited, pre.agent, pre.unknown)
            for pid, rank in sorted(pre.targets.items(), key=lambda kv: kv[1]):
                # "ended": it exited, or the signal's default action ended it (no handler): either way, in time
                outcome = "ended" if pid in exited else "killed"
                self.journal.write("preempt_outcome", fault=req.fault_id, occurrence=req.occurrence, rank=rank,
                                   pid=pid, outcome=outcome, seconds=round(exited.get(pid, req.grace_s), 3),
                                   grace_s=req.grace_s)
            self.journal.write("preempt_end", fault=req.fault_id, occurrence=req.occurrence, node=req.node,
                               killed=killed, seconds=round(time.time() - pre.at, 3), restart=req.restart, sync=True)
            if not self._stop.is_set():
                self._bring_back(pre)
        except Exception as e:
            self._fail(f"{req.fault_id}-preempt-{req.occurrence}", e)
        finally:
            if self.watchdog is not None:
                self.watchdog.held -= 1

    def _targets(self, req: PreemptRequest, agent: int | None) -> tuple[dict[int, int], list[int]]:
        """pid -> rank of the workers signalled (the node's: its agent's own workers, not what they started;
        or the named ranks' on any node), and the node's workers whose rank is not journaled yet (still
        starting: signalled too, their rank unknown). Waits up to a second for workers to journal their pid."""
        agents = [agent] if agent is not None else [a.pid for a in self.agents.procs if a.poll() is None]
        deadline = time.monotonic() + 1.0
        while True:
            self.progress.poll()
            rank_of = {pid: rank for rank, pid in self.progress.pids.items()}
            workers = [pid for a in agents for pid, _ in workers_of(a) if agent_of(pid) == a]
            if all(pid in rank_of for pid in workers) or time.monotonic() > deadline:
                break
            time.sleep(POLL)
        out = {pid: rank_of[pid] for pid in workers if pid in rank_of
               and (req.ranks is None or rank_of[pid] in req.ranks)}
        unknown = [pid for pid in workers if pid not in rank_of] if req.ranks is None else []
        return out, unknown

    def _grace_over(self, pre: _Signaled) -> bool:
        """Note the targets that ended; whether the grace is over (its time is up, or the targets and the
        node's agent are all gone)."""
        now = time.time()
        for pid in pre.targets:
            if pid not in pre.exited and _gone(pid):
                pre.exited[pid] = now - pre.at
        gone = len(pre.exited) == len(pre.targets) and (pre.agent is None or pre.agent.poll() is not None)
        return gone or now >= pre.at + pre.req.grace_s

    def _kill_rest(self, req: PreemptRequest, targets: dict[int, int], exited: dict[int, float], agent: Any,
                   unknown: list[int]) -> list[int]:
        """SIGKILL what is left: the node's processes (its store aside: the fleet takes it with the memory),
        or the named ranks' workers and what they started. Returns the ranks killed."""
        left = [p for p in targets if p not in exited] + [p for p in unknown if not _gone(p)]
        victims = left + [c for p in left for c, _ in workers_of(p)]
        if req.node is not None:
            if not req.restart:  # before anything dies: nothing of the node is replaced
                lost_marker(self.fault_dir, req.node).touch()
            store = self.fleet.procs[req.node] if self.fleet is not None else None
            spare = {store.pid} if store is not None else set()
            if agent is not None and agent.poll() is None:  # not reaped: its pid is still its own
                victims += [agent.pid] + [c for c, _ in workers_of(agent.pid)]
            # whatever of the node left the agent's tree (orphans carry the launch's token)
            victims += [p for p in owned(self.token, node=req.node) if p not in spare]
        # multiprocessing's resource tracker outlives its processes by a moment to unlink their semaphores
        signal_all([p for p in dict.fromkeys(victims) if not is_resource_tracker(p)], signal.SIGKILL)
        if req.node is not None and self.fleet is not None:
            self.fleet.lose(req.node, reason="preempted", replace=not self._stop.is_set())
        return sorted(rank for pid, rank in targets.items() if pid not in exited)

    def _bring_back(self, pre: _Signaled) -> None:
        req = pre.req
        if req.node is None or not req.restart:
            return  # the ranks' agents restart their workers; a node lost for good stays gone
        if pre.finished_before:
            return  # the job had finished before the signals: nothing to come back to
        why = {"reason": "preempted", "fault": req.fault_id}
        lost = {n for n in range(len(self.agents.procs)) if lost_marker(self.fault_dir, n).exists()}
        in_grace = {p.req.node for p in self._active if p.req.node is not None}  # each comes back at its end
        if req.node == 0:
            # the rendezvous lived in node 0's agent: every other agent's workers failed or will; end them
            # (their memory and stores stay: those nodes were not preempted) and start the job again
            for node in range(1, len(self.agents.procs)):
                store = self.fleet.procs[node] if self.fleet is not None else None
                spare = {store.pid} if store is not None else set()
                signal_all([p for p in owned(self.token, node=node) if p not in spare and not is_resource_tracker(p)],
                        signal.SIGKILL)
            self.agents.restart_all(skip=lost | in_grace, **why)
        elif self.agents.procs[req.node] is not pre.replaced:
            return  # already back: node 0's preemption restarted every agent meanwhile
        else:
            self.agents.journal_exit(req.node, **why)
            self.agents.start(req.node, **why)
