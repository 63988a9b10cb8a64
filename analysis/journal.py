"""The run journal: the one contract between running a job and judging it.

A run directory holds ``journal/rank-<R>/events.jsonl`` for every rank (appended
across restarts) and ``journal/launcher.jsonl`` for the launcher. Each line is
one JSON object with at least:

``t``       wall-clock seconds (``time.time()``)
``event``   the kind, one of :data:`EVENTS`
``rank``    the global rank that wrote it (absent in the launcher's file)
``attempt`` the torchrun restart count of the writing worker's agent

On loading, every event also gets ``incarnation``: which forming of the job its
process belonged to (0 for the first, 1 after the first restart, ...; a rank whose
node was away skips numbers), ``world``: the world size that process ran in (it
changes after an elastic restart), and, only where true, ``resized``: the world had
changed from the first incarnation's by then (records after a node left, even once
it has joined again, went through another arithmetic).

Event fields:

``start``               node, pid, world_size, created (when the process was created, wall clock),
                        init_seconds (spent forming the process group before this event)
``state``               step (completed optimizer steps), digests {component: {key: hex}},
                        norms {component: {key: L2 norm}} (floating tensors only; absent in older journals)
``step``                step (0-based iteration index), loss, loss_bits (hex of the float32), seconds
``resume_point``        step, exact, description, equal_at {component: [reference steps]} (an unmodified
                        script's first state in a process of a faulted run, matched against the
                        reference: where it resumed, :mod:`analysis.resume`)
``script_save``         step, how (``torch.save``, ``dcp``, ``safetensors``): an unmodified script began writing a
                        checkpoint at this step (once per step and way; ``baft check`` picks its faults from them)
``script_epoch``        step: an unmodified script began a new pass over a ``DataLoader`` (an epoch) at this step
``exit``                code: the worker ends with this non-zero code of its own (an unmodified script's
                        ``sys.exit(code)``; the built-in workload's 143 after a preemption's flush): a
                        preemption's verdict tells such an exit from one by the signal
``step_mismatch``       framework, framework_step, counted (a framework adapter's step count disagreed with
                        the hooks' count; journaled once per process)
``checkpoint_saved``    step, tier, bytes, seconds, path; baft: gated_seconds (its persister waited for the
                        training thread's bubbles, ``persist_window_ms``)
``checkpoint_restored`` step, tier, seconds, path
``checkpoint_rejected`` step, tier, reason
``fault``               fault, id, occurrence, fatal, elapsed (seconds since launch), step, phase,
                        plus the fault's own fields (its trigger: at_step, every, mtbf, seed, ...)
``fault_rollback``      fault, id, step, reason (a window fault switched off)
``fault_effect``        id, effect, ... (what a fault did: the damaged file, the ballast size)
``jitter_summary`` / ``straggler_summary`` / ``slow_storage_summary``
                        id and the delay a window fault added (per worker, when it is rolled back)
``checkpoint_failed``   step, tier, reason (a write failed; ``latest`` still names the last good one)
``hang_detected`` (launcher) silent_seconds, timeout, stopped_pids, killed_pids
``teardown_hang`` (launcher) rank, pid, seconds (since it journaled ``finish``), exit_timeout, where (its
                        stacks or kernel waits): alive after every rank finished; the harness ended the job
``preempt_signal`` (launcher) fault, occurrence, node, ranks, grace_s, step, phase, fired_by, delay, agent_pid, pids
                        (SIGTERM sent to a preempted node's agent and workers, or to the ranks named)
``preempt_outcome`` (launcher) fault, rank, pid, outcome (``exited`` by itself, or ``killed`` at the grace's end),
                        seconds (from the SIGTERM), grace_s
``preempt_end`` (launcher) fault, node, killed (ranks), seconds, restart (the node's processes, store and memory gone)
``preempt_flush``       step, persisted (the step the strategy wrote, None if it already was), seconds,
                        since_signal, signaled (the built-in workload's answer to SIGTERM, on every rank)
``snapshot``            step (version), tier, bytes, window_bytes, stall_bytes, copy_seconds, stall_seconds
``bubbles``             step, idle_seconds, windows, copy_in_windows_seconds, utilisation (copy time / idle time),
                        in_window_fraction (bytes copied inside windows / all bytes), iteration_seconds
``timeline``            step, seconds, spans [[kind, index, start, end]] (seconds from the iteration's start;
                        kinds forward, backward, optimizer, wait = a bubble, snapshot = copy work inside it);
                        every 10th iteration and after each re-plan (baft only)
``replan``              step, windows, idle_ms, bandwidth_gbps, bytes, overflow_bytes, stall_ms, policy, every, reason
``snapshot_skipped``    step, tier, reason (its slot was still being persisted)
``persist_skipped``     step, reason (baft: at a due step, no version newer than the last persisted one was
                        sealed on every rank, so none was persisted)
``restore_candidates``  tier, local (versions in the rank's own memory), remote ([version, node] held by stores)
``persist_backpressure`` step, seconds the training thread waited for the previous persist (baft: also a due
                        snapshot whose slot a persist still held, up to ``baft.strategies.baft.snapshotter.PIN_WAIT``)
``snapshots_discarded`` after, versions (baft: copies of this rank newer than the version restored, from the
                        timeline the job left, marked abandoned; the stores drop theirs too)
``checkpoint_keys``     stage_keyed, example, why (DCP tier: tensor names two pipeline stages share, written
                        under the stage's key instead of their fully qualified name)
``interval_changed``    step, every, before, cost_seconds, iteration_seconds, mtbf_seconds, daly_seconds, bounded,
                        why (``checkpoint.mtbf_hours``: the persistent interval adapted to the measured cost,
                        the largest over the ranks, at a persist boundary)
``amp_step_skipped``    step, scale (fp16: a gradient overflowed on some rank; every rank skipped the step
                        and the scaler halved its scale)
``store_start`` / ``store_exit`` (launcher) node, pid / returncode

``background_priority`` process (``writer``), pid, cpu_class, io_class, priority_note (what a baft writer process
                        runs at: the idle classes unless ``checkpoint.baft.writer_priority: normal``; the note says what
                        the kernel refused)

Each node's store writes ``journal/store-node<N>.jsonl``: store_start (pid, address, cpu_seconds spent
starting, cpu_class, io_class, cpu_group, priority_note), replicated
(rank, version, peer, bytes, seconds, deferred_seconds, behind: the versions the rank sealed
after this one by the time it landed, paced: sent in paced pieces, cpu_seconds: the store's CPU time so far, age_versions: versions from the rank's
seal to the peer's answer, a wait for training traffic left out),
peer_connected (peer, paced, reason: a kept connection made, once per peer unless one failed or the link's
mode changed), peer_connection_failed (peer, reason), replication_skipped
(rank, version, reason: one rank's copy of a round lost; or version, skipped, versions: the first 64 of them,
stride, reason: the versions sealed since the last round that no round took, each counted once), replication_failed, pulled (rank, version, source, bytes),
replication_paced (the link found to be the bottleneck or no longer), replication_stride (stride, reason),
replication_degraded (persistent_age_versions, persist_every, reason, and replica_age_versions when the newest
peer copy would be older than the persistent tier's, slowdown when replication slowed training past its budget), replication_resumed (a probe found
the link fast again), store_group (nice: the store's session group now, 19 or 0, null when the kernel refused
the change; reason; calm_needed: calm replicas in a row that lower it next; under the adaptive priority).
``finish``              step
``agent_start`` / ``agent_exit`` (launcher) node, returncode
``worker_failed``       (the node's torchrun agent, ``journal/agent-node<N>.jsonl``) node, attempt (the workers'
                        restart count), rank, local_rank, pid, exitcode, signal (its name when a signal ended the
                        worker, else null), message (first line of the worker's error file, or torchrun's
                        "Signal N (NAME) received by PID"), where (the innermost frame of an uncaught exception)
``aborted``             (launcher) signal (SIGINT/SIGTERM), seconds into the launch or during=reference:
                        the run was cancelled; everything it started was stopped and undone
"""
from __future__ import annotations

import json
import os
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import AnalysisError

EVENTS = (
    "start",
    "state",
    "resume_point",
    "step_mismatch",
    "script_save",
    "script_epoch",
    "exit",
    "step",
    "checkpoint_saved",
    "checkpoint_restored",
    "checkpoint_rejected",
    "fault",
    "fault_rollback",
    "fault_effect",
    "jitter_summary",
    "straggler_summary",
    "slow_storage_summary",
    "checkpoint_failed",
    "hang_detected",
    "teardown_hang",
    "preempt_signal",
    "preempt_outcome",
    "preempt_end",
    "preempt_flush",
    "finish",
    "snapshot",
    "snapshot_skipped",
    "persist_skipped",
    "bubbles",
    "timeline",
    "replan",
    "restore_candidates",
    "persist_backpressure",
    "snapshots_discarded",
    "checkpoint_keys",
    "amp_step_skipped",
    "interval_changed",
    "background_priority",
    "store_start",
    "store_exit",
    "agent_start",
    "agent_exit",
    "worker_failed",
    "aborted",
)


def rank_journal(run_dir: Path, rank: int) -> Path:
    return run_dir / "journal" / f"rank-{rank}" / "events.jsonl"


def launcher_journal(run_dir: Path) -> Path:
    return run_dir / "journal" / "launcher.jsonl"


def agent_journal(run_dir: Path, node: int) -> Path:
    """Where node ``node``'s torchrun agent journals its workers' failures."""
    return run_dir / "journal" / f"agent-node{node}.jsonl"


def float_bits(x: float) -> str:
    """The exact float32 bits of ``x`` as 8 hex digits (bitwise loss comparison)."""
    return struct.pack(">f", x).hex()


class JournalWriter:
    """Appends events to one JSONL file; each line reaches the OS before ``write`` returns.

    A SIGKILL of the writer loses nothing already written (the kernel holds it);
    ``sync=True`` additionally fsyncs, for events that must survive a machine crash.
    """

    def __init__(self, path: Path, **constant: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.constant = constant
        self._lock = threading.Lock()  # background checkpoint threads journal too
        self._f = open(path, "a", buffering=1, encoding="utf-8")

    def write(self, event: str, sync: bool = False, **fields: Any) -> None:
        record = {"t": time.time(), "event": event, **self.constant, **fields}
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            if self._f.closed:
                return
            self._f.write(line)
            if sync:
                self._f.flush()
                os.fsync(self._f.fileno())

    def close(self) -> None:
        with self._lock:
            self._f.close()


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """Events of one file in order; a torn last line (writer killed mid-line) is skipped."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                return
            raise AnalysisError(f"{path}:{i + 1}: not valid JSON: {e}") from None


def _number_incarnations(ranks: dict[int, list[dict[str, Any]]]) -> None:
    """Stamp every event with the job's ``incarnation`` its process belonged to, the ``world`` size it ran in,
    and, only where true (older verdicts' copies of events stay as they were), ``resized``: the world had
    changed by then (from the first incarnation's, at this one or an earlier one).

    An incarnation is one forming of the job: every rank of its world starts once. torchrun's restart count
    is per agent (an agent whose workers are restarted because another node failed does not count it, nor
    does any agent count a node joining), so it cannot line ranks up across nodes; the start events can. The
    rank that started most often (rank 0, whose node never leaves for good) was in every incarnation: its
    k-th start begins incarnation k. A rank that started as often was in every one too; a rank that started
    fewer times was away for some (its node left and joined again), and each of its starts belongs to the
    incarnation of its world size begun nearest in time (in order: never an earlier one than its previous
    start's).
    """
    starts = {rank: [e for e in evs if e.get("event") == "start"] for rank, evs in ranks.items()}
    lead = max(starts, key=lambda r: (len(starts[r]), -r), default=None)
    if lead is None:
        return
    begun = [float(e.get("t", 0.0)) for e in starts[lead]]
    worlds = [e.get("world_size") for e in starts[lead]]
    first = next((w for w in worlds if w is not None), None)
    resized: list[bool] = []
    for w in worlds:
        resized.append((bool(resized) and resized[-1]) or (w is not None and first is not None and w != first))
    gen_of: dict[int, int] = {}
    for rank, evs in starts.items():
        if len(evs) == len(begun):
            gen_of.update((id(e), k) for k, e in enumerate(evs))
            continue
        k = 0
        for i, e in enumerate(evs):
            last = len(begun) - (len(evs) - i)  # leave an incarnation for each start still to come
            t, w = float(e.get("t", 0.0)), e.get("world_size")
            span = range(k, max(k, last) + 1)
            fits = [g for g in span if g < len(worlds) and (w is None or worlds[g] is None or worlds[g] == w)]
            k = min(fits or span, key=lambda g: abs(begun[min(g, len(begun) - 1)] - t))
            gen_of[id(e)] = k
            k += 1
    for evs in ranks.values():
        inc, w, moved = 0, None, False
        for e in evs:
            if e.get("event") == "start":
                inc = gen_of[id(e)]
                w, moved = e.get("world_size"), resized[inc]
            e["incarnation"], e["world"] = inc, w
            if moved:
                e["resized"] = True


def store_events(run_dir: Path) -> list[dict[str, Any]]:
    """Every node store's events of a run (``journal/store-node<N>.jsonl``), ordered by time."""
    files = sorted((Path(run_dir) / "journal").glob("store-node*.jsonl"))
    return sorted((e for f in files for e in read_events(f)), key=lambda e: e["t"])


@dataclass(slots=True)
class Journal:
    """All events of one run, by rank."""

    run_dir: Path
    ranks: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    launcher: list[dict[str, Any]] = field(default_factory=list)
    """The harness's own processes' events: the launcher's and the torchrun agents' (``worker_failed``)."""
    stores: list[dict[str, Any]] = field(default_factory=list)
    """The node stores' events (``journal/store-node<N>.jsonl``), ordered by time."""

    @classmethod
    def load(cls, run_dir: Path) -> Journal:
        run_dir = Path(run_dir)
        root = run_dir / "journal"
        if not root.is_dir():
            raise AnalysisError(f"{run_dir}: no journal/ directory (not a run directory?)")
        j = cls(run_dir=run_dir)
        for d in sorted(root.glob("rank-*")):
            try:
                rank = int(d.name.split("-", 1)[1])
            except ValueError:
                continue
            if (d / "events.jsonl").is_file():
                j.ranks[rank] = list(read_events(d / "events.jsonl"))
        _number_incarnations(j.ranks)
        if launcher_journal(run_dir).is_file():
            j.launcher = list(read_events(launcher_journal(run_dir)))
        agents = [e for f in sorted(root.glob("agent-node*.jsonl")) for e in read_events(f)]
        if agents:
            j.launcher = sorted(j.launcher + agents, key=lambda e: e["t"])
        if not j.ranks:
            raise AnalysisError(f"{root}: no rank journals")
        j.stores = store_events(run_dir)
        return j

    @property
    def world_size(self) -> int:
        """The world size of the last incarnation's workers (the job's size at the end)."""
        starts = [e for e in self.events("start") if e.get("world_size") is not None]
        last = max(starts, key=lambda e: (e["incarnation"], e["t"]), default=None)
        return int(last["world_size"]) if last else len(self.ranks)

    def world_sizes(self) -> list[int]:
        """The world sizes of the job's incarnations in order, each change once (``[4, 2, 4]``); ``[world_size]`` for
        journals whose starts do not say."""
        by_inc = {e["incarnation"]: int(e["world_size"]) for e in sorted(self.events("start"), key=lambda e: e["t"])
                  if e.get("world_size") is not None}
        out: list[int] = []
        for _, w in sorted(by_inc.items()):
            if not out or out[-1] != w:
                out.append(w)
        return out or [self.world_size]

    def events(self, kind: str, rank: int | None = None) -> list[dict[str, Any]]:
        """Events of one kind, of one rank, or of all ranks and the launcher (faults the
        harness drives are journaled there) ordered by time."""
        if rank is not None:
            return [e for e in self.ranks.get(rank, []) if e["event"] == kind]
        out = [e for evs in self.ranks.values() for e in evs if e["event"] == kind]
        out += [e for e in self.launcher if e["event"] == kind]
        return sorted(out, key=lambda e: e["t"])
