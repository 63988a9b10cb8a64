"""The hang watchdog: notice that a job stopped making progress, and restart it.

torchrun restarts workers that *exit*; a worker that hangs (stopped, deadlocked,
stuck in a collective) keeps every other rank waiting in gloo for its full
timeout (30 minutes by default). The watchdog watches the job's journal: every
rank appends to it at each step boundary, so a journal that stays silent for
``timeout`` seconds means nobody progresses. Until the job (or its restarted
incarnation) has completed a step, start-up — imports, rendezvous, a restore —
gets ``startup_timeout`` instead. It then journals ``hang_detected``
(how long the job was silent, which workers were stopped) and kills the stopped
workers — all workers if none is stopped, e.g. a deadlock — so torchrun sees a
failure and restarts the job, which restores the newest checkpoint.

It also ends a job that finished but does not exit: once every rank journaled ``finish``, a
worker still alive ``exit_timeout`` seconds after the last one did is stuck in its teardown (torch
2.13's gloo teardown can deadlock on the GIL as a DDP script's frame is cleared). The watchdog
journals ``teardown_hang`` (the rank, its pid, how long, and where it is: ``py-spy dump`` or the
threads' kernel waits), then kills the agents still running (so torchrun restarts nothing) and the
stuck workers. The run counts as completed: it is a finding about the job's stack, not a fault.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from analysis.journal import JournalWriter
from harness.run.processes import where_stuck
from harness.run.progress import JournalProgress
from injectors.process import is_resource_tracker, workers_of

#: Seconds a job may take from launch (or a restart) to its first completed step.
STARTUP_TIMEOUT = 60.0


class Watchdog:
    """Watches ``run_dir/journal/rank-*/events.jsonl`` while the agents run."""

    def __init__(self, run_dir: Path, agents: list[subprocess.Popen], journal: JournalWriter, timeout: float | None,
                 startup_timeout: float | None = None, exit_timeout: float | None = None) -> None:
        """``timeout``: seconds without progress before a hang is declared (None: no hang detection);
        ``exit_timeout``: seconds a worker may live after the job finished (None: no deadline)."""
        self.run_dir, self.agents, self.journal, self.timeout = run_dir, agents, journal, timeout
        self.startup_timeout = startup_timeout if startup_timeout is not None else max(timeout or 0, STARTUP_TIMEOUT)
        self.exit_timeout = exit_timeout
        self.ended_after_finish: list[int] = []
        """The nodes whose agent the watchdog ended after the job had finished (their exit is no failure)."""
        self.progress = JournalProgress(run_dir)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)
        self.detections = 0
        self.held = 0
        """While above 0 (a preemption's grace, a node coming back) the job's silence is no hang."""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def last_progress(self) -> float:
        """Wall-clock time of the newest write to any rank's journal."""
        newest = 0.0
        for f in (self.run_dir / "journal").glob("rank-*/events.jsonl"):
            try:
                newest = max(newest, f.stat().st_mtime)
            except OSError:
                pass
        return newest

    def _run(self) -> None:
        quiet_since = time.time()
        seen_at_start = self.progress.poll() and self.progress.steps_seen
        while not self._stop.wait(0.25):
            quiet_since = max(quiet_since, self.last_progress())
            silent = time.time() - quiet_since
            self.progress.poll()
            if self.progress.done:
                if self._past_exit_deadline():
                    return
                continue  # a finished job is silent: no hang
            if self.held:
                quiet_since, seen_at_start = time.time(), self.progress.steps_seen  # start-up time after it
                continue
            started = self.progress.steps_seen > seen_at_start  # this incarnation completed a step
            if self.timeout is None or silent < (self.timeout if started else self.startup_timeout):
                continue
            self._restart(silent)
            quiet_since = time.time()  # give the restarted job its own start-up time
            seen_at_start = self.progress.steps_seen

    def _restart(self, silent: float) -> None:
        workers = [(pid, st) for a in self.agents if a.poll() is None for pid, st in workers_of(a.pid)]
        stopped = [pid for pid, st in workers if st == "T"]
        victims = stopped or [pid for pid, _ in workers]
        self.detections += 1
        self.journal.write("hang_detected", silent_seconds=round(silent, 3), timeout=self.timeout,
                           stopped_pids=stopped, killed_pids=victims, sync=True)
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)  # also ends a stopped process; SIGCONT would let it run on
            except ProcessLookupError:
                pass

    def _past_exit_deadline(self) -> bool:
        """Every rank finished: end the job if a worker outlived the deadline (whether it did)."""
        if self.exit_timeout is None or not self.progress.finished_at:
            return False
        late = time.time() - max(self.progress.finished_at.values())
        if late < self.exit_timeout:
            return False
        # (a worker's own resource tracker is spared: it cleans up after its processes and exits)
        alive = {pid for a in self.agents if a.poll() is None for pid, _ in workers_of(a.pid) if not is_resource_tracker(pid)}
        stuck = {rank: pid for rank, pid in self.progress.pids.items() if rank in self.progress.finished and pid in alive}
        if not stuck:
            return False
        for i, (rank, pid) in enumerate(sorted(stuck.items())):  # py-spy (up to 20 s each) for the first two
            self.journal.write("teardown_hang", rank=rank, pid=pid, seconds=round(time.time() - self.progress.finished_at[rank], 3),
                               exit_timeout=self.exit_timeout, where=where_stuck(pid, spy=i < 2)[:8000], sync=True)
        if self._stop.is_set():
            return True  # the launch ended meanwhile: its processes are stopped by it, not here
        for node, agent in enumerate(self.agents):
            if agent.poll() is None:
                self.ended_after_finish.append(node)
                try:
                    os.kill(agent.pid, signal.SIGKILL)  # first, so that it restarts nothing
                except ProcessLookupError:
                    pass
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return True
