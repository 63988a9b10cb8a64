"""Drive the faults that live outside the workers (links between node namespaces).

The controller runs in the harness process next to the torchrun agents. It
follows the job's progress by reading the ``step`` events the ranks append to
their journals, opens each fault's window when its start step (or time) is
reached and closes it at its end, and — whatever happens, also on Ctrl-C —
rolls back every fault still in place when the run stops. Each transition is
journaled in the launcher's journal (``fault``, ``fault_rollback``) with the
step at which it took effect.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from analysis.journal import JournalWriter
from harness.run.progress import JournalProgress
from injectors.link import LinkInjector
from injectors.network import NetworkTopology
from injectors.worker import describe


class FaultController:
    """Opens and closes harness-side fault windows as the job progresses."""

    def __init__(self, run_dir: Path, faults: list[tuple[int, Any]], topo: NetworkTopology, journal: JournalWriter,
                 started_at: float) -> None:
        self.journal, self.started_at = journal, started_at
        self.progress = JournalProgress(run_dir)
        self.items = [(LinkInjector(cfg, i, topo, self._record), cfg) for i, cfg in faults]
        self.on: dict[int, float] = {}  # fault id -> elapsed seconds when it began
        self.done: set[int] = set()  # windows that closed: a window opens once per run
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-controller", daemon=True)
        self.error: BaseException | None = None

    def _record(self, event: str, **fields: Any) -> None:
        self.journal.write(event, sync=True, **fields)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.wait(0.05):
                self.tick()
        except BaseException as e:  # surfaced by stop(); the windows are rolled back there
            self.error = e

    def tick(self) -> None:
        step, elapsed = self.progress.poll(), time.time() - self.started_at
        for inj, cfg in self.items:
            fid = inj.fault_id
            if fid in self.done:
                continue
            if fid not in self.on and cfg.active(step, elapsed):
                self.on[fid] = elapsed
                self._record("fault", **describe(cfg), fault=cfg.kind, id=fid, occurrence=0, fatal=cfg.fatal,
                             step=step, phase="iteration", elapsed=round(elapsed, 4))
                inj.inject()
            elif fid in self.on and cfg.ended(step, elapsed, self.on[fid]):
                self._rollback(inj, step, "window ended")

    def _rollback(self, inj: LinkInjector, step: int, reason: str) -> None:
        self.on.pop(inj.fault_id, None)
        self.done.add(inj.fault_id)
        try:
            inj.rollback()
        finally:
            self._record("fault_rollback", fault=inj.config.kind, id=inj.fault_id, step=step, reason=reason)

    def stop(self) -> None:
        """Stop following the job and roll back every fault still in place."""
        self._stop.set()
        self._thread.join(timeout=5)
        errors = []
        for inj, _ in self.items:
            if inj.fault_id in self.on:
                try:
                    self._rollback(inj, self.progress.step, "run ended")
                except Exception as e:  # roll back the others anyway
                    errors.append(e)
        if self.error is not None:
            raise self.error
        if errors:
            raise errors[0]
