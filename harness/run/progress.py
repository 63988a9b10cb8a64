"""How far a job has come, from two sources: the ranks' journals (a run of ours, or a job on a
cluster with a shared volume) and the job's W&B run (:mod:`harness.cluster.wandbprogress`).

The watchdog, the controller of link faults and the run against a cluster read a job's progress
only through :class:`Progress`, so each works with either source.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class Progress(Protocol):
    """A job's progress, read by polling."""

    step: int
    """The furthest step any rank has started (steps done + 1; 0 before the first)."""
    steps_seen: int
    """Progress observations so far (journal: ``step`` events; W&B: polls that saw the step move)."""
    world: int
    """World size of the newest incarnation seen (0: unknown or not started)."""
    finished: set[int]
    """Ranks that finished (the journal knows them; W&B knows only the run's state)."""
    started_at: float | None
    """``time.time()`` when the job began (the origin of time triggers); None until known."""

    def poll(self) -> int:
        """Read what is new; return :attr:`step`. OSError when the source cannot be read."""
        ...

    def where(self) -> str:
        """Where the progress comes from, for messages."""
        ...

    @property
    def done(self) -> bool:
        """Whether the job has finished."""
        ...


class JournalProgress:
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
        self.pids: dict[int, int] = {}
        """Rank -> the pid of its newest worker (its ``start`` event)."""
        self.finished_at: dict[int, float] = {}
        """Rank -> ``time.time()`` of its ``finish`` (of the ranks in :attr:`finished`)."""

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
            event = json.loads(line)
            self.finished.add(int(event["rank"]))
            self.finished_at[int(event["rank"])] = float(event["t"])
        elif b'"event":"start"' in line:
            event = json.loads(line)
            self.started_at = min(self.started_at or event["t"], event["t"])
            self.finished.discard(int(event["rank"]))  # a restarted rank is running again
            if isinstance(event.get("pid"), int):
                self.pids[int(event["rank"])] = event["pid"]
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
