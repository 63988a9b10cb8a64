"""The harness's side of a node joining: the node's store on empty memory, its agent on the job's rendezvous.

Rank 0 leaves a :class:`~injectors.join.JoinRequest` in the run's fault directory when its ``node_join`` fault
fires. The :class:`JoinController` (a thread of the launch) takes it and does what a job controller does when
capacity comes back to a job that shrank: the node is no longer lost (its marker goes, so its store and agent
are replaced like any node's from now on), a fresh store starts with empty memory, and a new torchrun agent
joins the rendezvous. The running agents see a node waiting and re-form the job with it (rank 0 holds at the
fault's point until they do); the hang watchdog is held meanwhile, until rank 0's next process starts (the
verdict measures the re-form as the join's recovery).
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.journal import JournalWriter
from harness.run.progress import JournalProgress
from injectors.handoff import acknowledge, take
from injectors.join import JoinRequest
from injectors.process import lost_marker

if TYPE_CHECKING:
    from harness.run.agents import AgentSet
    from harness.run.storefleet import StoreFleet
    from harness.run.watchdog import Watchdog

#: How often the controller looks for requests.
POLL = 0.05
#: Seconds the hang watchdog is held at most for one join (rank 0 gives up on the re-form sooner).
HOLD = 120.0


class JoinError(RuntimeError):
    """A join the harness could not carry out (the node was never lost, or is still up)."""


class JoinController:
    """Serves the node_join requests of one launch."""

    def __init__(self, run_dir: Path, agents: AgentSet, journal: JournalWriter, *, fleet: StoreFleet | None = None,
                 watchdog: Watchdog | None = None) -> None:
        self.run_dir, self.fault_dir = run_dir, run_dir / "faults"
        self.agents, self.journal, self.fleet, self.watchdog = agents, journal, fleet, watchdog
        self.error: BaseException | None = None
        self.progress = JournalProgress(run_dir)
        self._held: tuple[int | None, float] | None = None
        """While the watchdog is held for a join: rank 0's pid when it fired, and the hold's deadline."""
        self._lock = threading.Lock()
        """Guards :attr:`_held` and the watchdog's count (:meth:`stop` may release while the thread runs)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="join-controller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No node joins from now on (the launch is ending); waits for the thread."""
        self._stop.set()
        self._thread.join(timeout=30)
        self._release()

    def _run(self) -> None:
        while not self._stop.wait(POLL):
            for path in sorted(self.fault_dir.glob("*.join")) if self.fault_dir.is_dir() else []:
                self._serve(path)
            held = self._held
            if held is not None:
                self.progress.poll()
                pid, deadline = held
                if self.progress.pids.get(0) != pid or self.progress.done or time.monotonic() > deadline:
                    self._release()

    def _hold(self) -> None:
        self.progress.poll()
        with self._lock:
            if self.watchdog is not None and self._held is None:
                self.watchdog.held += 1
                self._held = (self.progress.pids.get(0), time.monotonic() + HOLD)

    def _release(self) -> None:
        with self._lock:
            if self.watchdog is not None and self._held is not None:
                self.watchdog.held -= 1
                self._held = None

    def _serve(self, path: Path) -> None:
        taken = take(path)
        if taken is None:
            return  # withdrawn: the worker gave up on it
        failure = ""
        try:
            req = JoinRequest.loads(taken.read_text())
            t0 = time.time()
            self._hold()  # rank 0 waits for the re-form: silence, not a hang
            self._join(req)
            self.journal.write("node_join", node=f"node{req.node}", fault=req.fault_id, step=req.step,
                               phase=req.phase, delay=round(t0 - req.at, 4), seconds=round(time.time() - t0, 3),
                               sync=True)
        except Exception as e:  # journaled; the launch ends with it as a failure
            self.error = self.error or e
            failure = f"{type(e).__name__}: {e}"
            self.journal.write("join_error", request=path.name, error=failure, sync=True)
            self._release()
        finally:
            acknowledge(path, failure)  # the firing worker raises a failure (and the launch fails with it)

    def _join(self, req: JoinRequest) -> None:
        marker = lost_marker(self.fault_dir, req.node)
        if not marker.exists():
            raise JoinError(f"node {req.node} was not lost for good when its node_join fired at step {req.step} "
                            "(a node joins after a node_loss with replacement: false, or a preempt with restart: "
                            "false, took it away)")
        self.progress.poll()
        if self.progress.done:  # rank 0 holds at the fault, so only a journal read amiss gets here
            raise JoinError(f"the job had finished when node {req.node}'s join was served")
        if self.agents.procs[req.node].poll() is None:
            raise JoinError(f"node {req.node}'s agent is still running")
        marker.unlink()
        if self.fleet is not None:
            self.fleet.rejoin(req.node)
        self.agents.journal_exit(req.node, reason="lost")
        self.agents.start(req.node, reason="joined", fault=req.fault_id)
