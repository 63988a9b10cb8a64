"""The probe: what a training script calls each step so the harness can judge it.

It writes the rank's journal (``analysis.journal``), forwards every ``baft``
event into it, and fingerprints the state at each step boundary::

    probe = Probe.from_env(run_dir)
    probe.state(step, train_state)       # at each boundary (after restore too)
    probe.step(step, loss, seconds)      # after each iteration
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from baft import events
from baft.state.fingerprint import fingerprint_components
from baft.state.train import TrainState

from analysis.journal import JournalWriter, float_bits, rank_journal

#: ``baft`` events copied into the journal.
JOURNALED = ("checkpoint_saved", "checkpoint_restored", "checkpoint_rejected", "checkpoint_failed", "restore_candidates", "snapshot",
             "snapshot_skipped", "persist_skipped", "bubbles", "timeline", "replan", "persist_backpressure",
             "snapshots_discarded", "checkpoint_keys", "amp_step_skipped", "interval_changed")


def process_created() -> float | None:
    """Wall-clock time this process was created (from ``/proc``: its start in clock ticks after
    boot, plus the boot time); the recovery breakdown's end of the restart phase. None off Linux."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class Probe:
    """Journals one rank's progress; subscribes to ``baft`` events while open."""

    def __init__(self, run_dir: Path, rank: int, attempt: int, node: str, world_size: int, **start: Any) -> None:
        self.rank, self.attempt = rank, attempt
        self.writer = JournalWriter(rank_journal(run_dir, rank), rank=rank, attempt=attempt)
        self.writer.write("start", node=node, pid=os.getpid(), world_size=world_size, host=socket.gethostname(),
                          created=process_created(), **start)
        self._unsubscribe = events.subscribe(self._on_event)

    @classmethod
    def from_env(cls, run_dir: Path, **start: Any) -> Probe:
        """Rank, attempt and node from the variables torchrun and the launcher set; ``start``: more
        fields for the ``start`` event (the workload passes ``init_seconds``, the time it took to
        form the process group)."""
        return cls(
            run_dir,
            rank=int(os.environ.get("RANK", "0")),
            attempt=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            node=os.environ.get("BAFT_NODE", "node0"),
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            **start,
        )

    def _on_event(self, kind: str, fields: dict[str, Any]) -> None:
        if kind in JOURNALED:
            self.writer.write(kind, **fields)

    def state(self, step: int, state: TrainState) -> None:
        """Fingerprint every component at the boundary after ``step`` completed steps.

        The L2 norms of floating tensors ride along so a divergence can be sized. The whole state the
        job holds, also what a subclass leaves out of its checkpoints (``workload.omit``).
        """
        self.components(step, TrainState.capture(state), state.param_names())

    def components(self, step: int, components: dict[str, Any], param_names: dict[int, str] | None = None) -> dict:
        """Fingerprint ``components`` (``{component: nested state}``) as the state at boundary ``step``;
        returns the digests."""
        digests, norms = fingerprint_components(components, param_names)
        self.writer.write("state", step=step, digests=digests, norms=norms)
        return digests

    def step(self, step: int, loss: float | None, seconds: float, probe_seconds: float | None = None,
             backwards: int | None = None) -> None:
        """Journal iteration ``step``: its loss, its seconds and (the boot module's hooks) how many of
        them the probe itself took and how many backward calls this process made in it (its loss is their
        sum: a step resumed between two micro-batches saw fewer, the rest restored with the gradient)."""
        bits = float_bits(loss) if loss is not None else None
        extra: dict[str, Any] = {"probe_seconds": probe_seconds} if probe_seconds is not None else {}
        if backwards is not None:
            extra["backwards"] = backwards
        self.writer.write("step", step=step, loss=loss, loss_bits=bits, seconds=seconds, **extra)

    def record(self, event: str, **fields: Any) -> None:
        """Write any other event (faults); durable, since a kill may follow at once."""
        self.writer.write(event, sync=True, **fields)

    def close(self, step: int) -> None:
        self.writer.write("finish", step=step)
        self._unsubscribe()
        self.writer.close()
