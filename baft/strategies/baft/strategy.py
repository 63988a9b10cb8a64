"""``baft``: a snapshot of every iteration in shared memory, persisted in the background.

Tiers, nearest first:

1. shared memory (``BubbleSnapshotter``): every iteration, copied inside the
   pipeline bubbles into slots that outlive the worker;
2. persistent storage (DCP format, ``dcpformat``): every ``every`` steps a
   background thread has the rank's writer process (``persist.writer``) write the
   sealed version straight from its slot (pinned meanwhile) into the rank's DCP
   data file (``dcpwrite``; ``baft.writer: thread`` writes from the thread,
   ``dcp`` with ``dcp.save`` of a copy), the ranks exchange what they wrote over a
   process group of their own, and rank 0 writes DCP's metadata and commits
   (checksums, manifest, ``latest`` moved only after the files are durable).

Restore takes the newest version every rank holds in shared memory (or can pull
from a peer's replica) unless the newest persistent checkpoint is newer, else the
newest persistent checkpoint every rank can verify.

Persistence is collective, so it is never skipped on one rank alone: when a
persist is due while the previous one still runs, the training thread waits
for it and reports the wait (``persist_backpressure``) — choose a larger
``every`` when that shows up.
"""
from __future__ import annotations

import contextlib
import hashlib
import time
from pathlib import Path
from typing import Any

from baft import events
from baft.bubbles.idlegate import IdleGate
from baft.mesh.collective import all_gather, all_gather_ints, all_min, rank_world
from baft.mesh.control import host_twin, own_group
from baft.persist import commits as persist
from baft.persist import dcpformat, dcpwrite, storage
from baft.persist.background import OneInFlight
from baft.persist.writer import WriterProcess
from baft.snapshot.slotfile import SLOTS, slot_of
from baft.state.dtensor import HostShard, local_view
from baft.strategies.baft.snapshotter import BubbleSnapshotter
from baft.strategies.base import WRITE_ERRORS, Strategy, commit_agreed, persist_failed
from baft.strategies.restore import place_map, restore_dcp


def persistent_floor(root: Any) -> int:
    """The newest committed persistent step (-1: none)."""
    steps = persist.committed_steps(root)
    return steps[0] if steps else -1


class BaftStrategy(Strategy):
    """Bubble-aware snapshots plus asynchronous persistence."""

    name = "baft"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.snap: BubbleSnapshotter | None = None
        self.group: Any = None
        """Checkpoint traffic of the persister thread (DCP's collectives, the commit)."""
        self.decisions: Any = None
        """The training thread's agreement on which version to persist (:attr:`control`, not :attr:`group`:
        the persister thread may be inside a collective on :attr:`group` meanwhile)."""
        self._writer = OneInFlight("baft-persist", self.config.persist_nice)
        self._persisted = -1
        self._committed = -1  # the newest version the persistent tier holds committed (the store's measure)
        ms = self.config.baft.persist_window_ms
        self.gate = IdleGate(ms / 1e3 if ms > 0 else -1.0, lambda: self.snap.profiler.expected if self.snap else None)
        """What the persister thread passes before each step of a persist (``persist_window_ms``); open until
        :meth:`attached` gives it the training thread's waits."""
        self._files: WriterProcess | None = None
        """The rank's writer process (``baft.writer: process``), started by the training thread at the
        first persist (a process started from the persister's thread would die with that thread)."""

    @property
    def shm_dir(self) -> Path:
        if self.config.baft.shm_dir:
            return Path(self.config.baft.shm_dir)
        root = self.root
        key = str(root.resolve()) if isinstance(root, Path) else root
        tag = hashlib.blake2b(key.encode(), digest_size=6).hexdigest()
        return Path("/dev/shm") / f"baft-{tag}"

    def attached(self, stage: Any) -> None:
        rank, _ = rank_world()
        t = self.topology
        world = self.places = self.gather_places()  # recorded with every version, in memory and persistent
        # the snapshotter's collectives send host tensors (a slot's bytes): over gloo twins of the job's groups
        replica_group = host_twin(t.replica_group, self.control)
        tp_group = host_twin(t.tp_group, self.control) if t.tp_size > 1 else None
        self.snap = BubbleSnapshotter(self.state, self.config, self.shm_dir, rank=rank, replica=t.replica,
                                      replicas=t.replicas, replica_group=replica_group, world=world,
                                      tp=(t.tp_rank, tp_group) if t.tp_size > 1 else None, control=self.control)
        # what the node's store compares its replicas' age with: the newest *committed* persistent version, so
        # the persistent tier's age includes its writes' lag, as a replica's includes its travel
        self.snap.persistent = lambda: (self.interval.every, self._committed)
        self.snap.attach(stage)
        self.snap.profiler.listeners.append(self.gate.listener)
        self.group = own_group()
        self.decisions = self.control
        self.interval.group = self.decisions
        self.interval.background = self._background_cpu

    def _background_cpu(self) -> float:
        """CPU seconds of this rank's persisting so far: the persister thread's and the writer process's."""
        return self._writer.cpu_seconds + (self._files.cpu_seconds() if self._files is not None else 0.0)

    def _snap(self) -> BubbleSnapshotter:
        if self.snap is None:
            raise RuntimeError("baft: call attach(stage) before training")
        return self.snap

    def restore(self) -> int | None:
        # A shared-memory or peer version older than the newest persistent checkpoint is stale
        # (replication can lag persistence): then the persistent tier is the fresher copy.
        floor = all_min(persistent_floor(self.root), self.control)
        self._committed = floor
        version = self._snap().restore(floor=floor)
        if version is None:
            version = restore_dcp(self, self.group)
        if version is not None:
            self._persisted = version
        self._snap().discard_newer(-1 if version is None else version)
        return version

    def begin_iteration(self) -> None:
        self._snap().begin(self.state.step)

    def before_optimizer_step(self) -> None:
        self._snap().seal()

    def after_step(self) -> bool:
        """At each due boundary, persist the newest version that every rank holds sealed.

        Whether a version is persisted is decided together: ranks seal different versions when
        their plans snapshot every k-th iteration with different k or a pinned slot skips one, and
        DCP's save is collective, so a rank that decided alone could enter it for another version
        than its peers (a mixed-step checkpoint) or alone (a hang)."""
        snap = self._snap()
        snap.end()
        version = self.state.step - 1  # what this iteration sealed, on a rank that snapshots every iteration
        if version <= self._persisted or not self.due(version):
            return False  # the same on every rank: steps and _persisted are agreed
        t_due = time.perf_counter()
        try:
            return self._start_persist(snap, version)
        finally:
            self.interval.charge(time.perf_counter() - t_due)  # back-pressure, the decision, the submit

    def _start_persist(self, snap: BubbleSnapshotter, version: int) -> bool:
        if self._writer.busy:
            t = time.perf_counter()
            self.drain()
            events.emit("persist_backpressure", step=version, seconds=time.perf_counter() - t)
        # surfaces a failure of the previous persist (nothing is pinned now); on a device it seals the versions in
        # flight first (a wait on the copy stream, never the training stream), or an older version would be persisted
        self.drain()
        mine = sorted(s for s in snap.sealed_versions() if self._persisted < s <= version)
        common = set.intersection(*(set(vs) for vs in all_gather_ints(mine, SLOTS, self.decisions)))
        if not common:
            events.emit("persist_skipped", step=version, reason="no version newer than the last persisted one is "
                        "sealed on every rank")
            return False
        v = max(common)
        if self.config.baft.writer == "process" and self._files is None:
            self._files = WriterProcess(self.config.persist_nice, self.config.baft.writer_priority)
            events.emit("background_priority", process="writer", pid=self._files.pid, **self._files.applied.fields())
        snap.pinned.add(slot_of(v))
        self._persisted = v
        # the gate may hold the persist's steps for half the time until the next persist is due
        self._writer.submit(self._persist, v, None, time.perf_counter() + 0.5 * self.interval.every * self.interval.iteration_seconds)
        return True

    def _persist(self, version: int, components: dict[str, Any] | None = None, until: float | None = None) -> None:
        """Write ``version`` (from its slot unless ``components`` are given) and commit it; its steps wait
        for the training thread's bubbles (:attr:`gate`) until ``until`` (``time.perf_counter()``) at most."""
        snap = self._snap()
        gate = self.gate
        t0, gated = time.perf_counter(), gate.waited
        events.emit("phase", phase="persist", step=version)
        rank, world = rank_world()
        direct = self.config.baft.writer != "dcp"
        try:
            # direct: written from views of the pinned slot (no copy; the slot stays pinned while its
            # bytes go to the file); dcp: a private copy, the slot released once its state dict is made
            with contextlib.nullcontext(components) if components is not None else \
                    snap.sealed_version(version, copy=not direct) as comps:
                gate.wait(until=until)  # each step's Python inside a bubble of the training thread (idlegate)
                sd = dcpformat.to_state_dict(comps, rank, self.stage_key, snap.owned_tensors(),
                                             shard_key=self.shard_key, placements=snap.placements,
                                             param_names=snap.param_names, process_group=self.group,
                                             exchange_keys=not direct, host_shards=direct)
                if direct:
                    slot = snap.buffer.slot_for(version) if components is None else None
                    gate.wait(until=until)
                    written = self._write_direct(version, rank, sd, slot)
        finally:
            snap.pinned.discard(slot_of(version))
        if direct:
            gate.wait(until=until)
            reports = all_gather(written, self.group)  # the one exchange: what every rank wrote, or why not
            failed = next((r for r in reports if isinstance(r, str)), None)
            if failed is not None:
                persist_failed(version, failed)
                return
        else:
            try:
                dcpformat.save(self.root, version, sd, self.group)  # DCP raises a write error on every rank
            except WRITE_ERRORS as e:
                persist_failed(version, e)
                return

        def commit() -> None:
            extra = {"format": "dcp", "strategy": "baft", **place_map(self.places)}
            if not direct:
                dcpformat.commit(self.root, version, world, extra)
                persist.prune(self.root, self.config.keep)
                return
            ops, shared = dcpwrite.commit_ops(version, reports, extra)
            self._run_ops(ops + persist.prune_ops(self.root, self.config.keep, committing=version))
            if shared:
                dcpformat.announce_stage_keys(shared)

        # the persister threads of all ranks run the same saves in the same order on self.group
        gate.wait(until=until)
        if (reason := commit_agreed(commit, self.group)) is not None:
            persist_failed(version, reason)
            return
        self._committed = max(self._committed, version)
        events.emit("checkpoint_saved", step=version, tier="persistent",
                    bytes=sum(t.nbytes if isinstance(t, HostShard) else local_view(t).numel() * t.element_size()
                              for t in sd.values()),
                    seconds=time.perf_counter() - t0, gated_seconds=round(gate.waited - gated, 6),
                    path=str(persist.step_dir(self.root, version)))

    def _run_ops(self, ops: list[persist.FileOp]) -> None:
        """Run a commit's file operations: in the writer process where there is one and the storage is local
        (the system calls and their waits out of the training process), else here."""
        st = storage.at(self.root)
        if self._files is not None and isinstance(st, storage.LocalStorage):
            self._files.run([(op.kind, str(st.location(op.rel)), op.size, op.data, op.sync_dir) for op in ops])
        else:
            persist.run_ops(self.root, ops)

    def _write_direct(self, version: int, rank: int, sd: dict[str, Any], slot: Any) -> dcpwrite.RankReport | str:
        """This rank's file of ``version`` (:func:`dcpwrite.write_rank`, by the writer process when there is
        one, reading the tensors of ``slot`` from its file), or why it could not be written."""
        try:
            return dcpwrite.write_rank(self.root, version, rank, self.stage_key, sd, writer=self._files, slot=slot)
        except WRITE_ERRORS as e:
            return f"rank {rank}: {type(e).__name__}: {e}"

    def drain(self) -> None:
        """Wait for the background work: on a device, the copies in flight (each version sealed once they
        completed: the copy stream's events, never the training stream's), then the persist in flight."""
        if self.snap is not None and self.snap.device is not None:
            self.snap.device.settle(block=True)
        with self.gate.held_open():
            self._writer.drain()

    def flush(self) -> int | None:
        """Finish the persist in flight, then persist the state after the last step (the newest sealed
        version's contents) unless it already is."""
        self.drain()
        step = self.state.step
        if self.snap is None or step <= self._persisted:
            return None
        self._persisted = step
        with self.gate.held_open():
            self._persist(step, self.state.capture())  # on the training thread: nothing to wait for
        return step

    def close(self) -> None:
        """Finish the persist in flight, persist the final state if it is due, release everything."""
        try:
            with self.gate.held_open():
                self._writer.close()
            step = self.state.step
            if self.snap is not None and step > self._persisted and self.due(step):
                # The state after the last step never passes a boundary inside the loop.
                self._persisted = step
                with self.gate.held_open():
                    self._persist(step, self.state.capture())  # on the training thread: nothing to wait for
        finally:
            if self._files is not None:
                self._files.close()
                self._files = None
            if self.snap is not None:
                self.snap.close()
                self.snap = None
