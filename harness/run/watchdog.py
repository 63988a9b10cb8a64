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
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from analysis.journal import JournalWriter

from injectors.process import workers_of

from harness.run.progress import JournalProgress

#: Seconds a job may take from launch (or a restart) to its first completed step.
STARTUP_TIMEOUT = 60.0


class Watchdog:
    """Watches ``run_dir/journal/rank-*/events.jsonl`` while the agents run."""

    def __init__(self, run_dir: Path, agents: list[subprocess.Popen], journal: JournalWriter, timeout: float,
                 startup_timeout: float | None = None) -> None:
        self.run_dir, self.agents, self.journal, self.timeout = run_dir, agents, journal, timeout
        self.startup_timeout = startup_timeout if startup_timeout is not None else max(timeout, STARTUP_TIMEOUT)
        self.progress = JournalProgress(run_dir)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)
        self.detections = 0

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
            started = self.progress.steps_seen > seen_at_start  # this incarnation completed a step
            if silent < (self.timeout if started else self.startup_timeout):
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
