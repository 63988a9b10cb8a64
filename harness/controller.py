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

import json
import threading
import time
from pathlib import Path
from typing import Any

from analysis.journal import JournalWriter
from injectors.link import LinkInjector
from injectors.network import Topology
from injectors.worker import describe


class Progress:
    """The furthest step any rank has started, read incrementally from the rank journals.

    Also tells when the job is done: every rank of its latest world size journaled ``finish``.
    """

    def __init__(self, run_dir: Path) -> None:
        self.root = run_dir / "journal"
        self.offsets: dict[Path, int] = {}
        self.step = 0
        self.steps_seen = 0
        """``step`` events read so far (a restarted job's steps count even below ``step``)."""
        self.world = 0
        """World size of the newest ``start`` event read (0: no worker started yet)."""
        self.finished: set[int] = set()
        """Ranks that journaled ``finish`` (since the newest ``start`` at a new world size)."""
        self.started_at: float | None = None
        """``time.time()`` of the first ``start`` event read: when the job's first worker began."""

    def poll(self) -> int:
        for f in self.root.glob("rank-*/events.jsonl"):
            with open(f, "rb") as fh:
                fh.seek(self.offsets.get(f, 0))
                data = fh.read()
            end = data.rfind(b"\n") + 1  # a line still being written is read next time
            self.offsets[f] = self.offsets.get(f, 0) + end
            for line in data[:end].splitlines():
                try:
                    self._read(line)
                except (ValueError, KeyError, TypeError):
                    continue  # a damaged line (as read_events skips); the next ones still count
        return self.step

    def _read(self, line: bytes) -> None:
        if b'"event":"step"' in line:
            self.step = max(self.step, json.loads(line)["step"] + 1)
            self.steps_seen += 1
        elif b'"event":"finish"' in line:
            self.finished.add(int(json.loads(line)["rank"]))
        elif b'"event":"start"' in line:
            event = json.loads(line)
            self.started_at = min(self.started_at or event["t"], event["t"])
            self.finished.discard(int(event["rank"]))  # a restarted rank is running again
            world = int(event.get("world_size") or 0)
            if world and world != self.world:
                self.world = world
                self.finished = {r for r in self.finished if r < world}

    def where(self) -> str:
        """Where the progress comes from, for messages."""
        return f"the job's journal under {self.root}"

    @property
    def done(self) -> bool:
        """Whether every rank of the job (at its latest world size) has finished."""
        return self.world > 0 and set(range(self.world)) <= self.finished


class FaultController:
    """Opens and closes harness-side fault windows as the job progresses."""

    def __init__(self, run_dir: Path, faults: list[tuple[int, Any]], topo: Topology, journal: JournalWriter,
                 started_at: float) -> None:
        self.journal, self.started_at = journal, started_at
        self.progress = Progress(run_dir)
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
