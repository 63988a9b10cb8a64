"""The ``baft`` strategy: a snapshot of every iteration, copied inside the pipeline bubbles.

Per iteration of one stage:

``begin(v)``   at the step boundary v: capture the small state (RNGs, data
               position, scheduler, step) whole, mark shared-memory slot
               ``v % 2`` as being written, and queue this replica's chunks of
               the bulk state (parameters, buffers, optimizer tensors) for the
               copier, which copies them while the stage waits on the pipeline.
``seal()``     just before the optimizer step, the last moment version v
               exists: copy what did not fit (the stall, measured and
               reported), write the skeleton, mark the slot complete.
``end()``      after the optimizer step: close the iteration's profile, and
               re-plan if the windows drifted or the state layout changed.

The plan (``planner.plan``) predicts what fits where from the measured windows
and copy bandwidth; the copy itself takes the real windows as they come, in
plan order, so an early-ending window only moves chunks to the next one.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from . import codec, events
from .collective import all_gather
from .engine import CopyEngine, CopyJob, CopyStats, Item, Task
from .layout import TensorSpec, as_bytes, layout, rebuild, split, total_bytes
from .planner import Chunk, Plan, PlannerConfig, make_chunks, owned, plan
from .profiler import BubbleProfiler, ProfilerConfig
from .snapshot import COMPLETE, WRITING, SnapshotBuffer
from .state import COMPONENTS, TrainState

META_CAPACITY = 4 << 20
#: Captured at the step boundary itself; everything else is captured inside the bubbles.
BOUNDARY_COMPONENTS = ("rng", "data", "step")
#: How long the copier may hold the GIL when the training thread wants it back.
SWITCH_INTERVAL = 0.0005
INITIAL_BANDWIDTH = 5e9


def _specs(meta: dict[str, Any]) -> list[TensorSpec]:
    return [TensorSpec(name=n, dtype=d, shape=tuple(s), offset=o, nbytes=b) for n, d, s, o, b in meta["layout"]]


class BubbleSnapshotter:
    """Snapshots one stage's state into shared memory, inside its idle windows."""

    def __init__(
        self,
        state: TrainState,
        shm_dir: Path,
        *,
        rank: int,
        replica: int = 0,
        replicas: int = 1,
        replica_group: Any = None,
        profiler: ProfilerConfig | None = None,
        planner: PlannerConfig | None = None,
        omit: tuple[str, ...] = (),
    ) -> None:
        self.state = state
        self.rank, self.replica, self.replicas, self.replica_group = rank, replica, replicas, replica_group
        self.planner_config = planner or PlannerConfig()
        self.omit = omit
        self.profiler = BubbleProfiler(profiler)
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        self.engine = CopyEngine(self.planner_config.copier, budget=self._window_budget)
        self.profiler.listeners.append(self.engine.on_wait)
        self.buffer = SnapshotBuffer(shm_dir, rank)
        self.specs: list[TensorSpec] | None = None
        self.chunks: list[Chunk] = []
        self.mine: list[Chunk] = []
        self.plan: Plan | None = None
        self.bandwidth = INITIAL_BANDWIDTH
        self.restored_version: int | None = None
        self._pending: dict[str, Any] | None = None
        self._jobs: dict[int, tuple[tuple, list[CopyJob]]] = {}
        self.last_stats: CopyStats | None = None
        self.last_sealed: int | None = None
        self.pinned: set[int] = set()
        """Slots a reader (the persister) still needs; a version due for a pinned slot is skipped."""

    def attach(self, stage: Any) -> None:
        self.profiler.attach(stage)

    def close(self) -> None:
        self.profiler.detach()
        self.engine.close()
        self.buffer.close()

    # -- the iteration ----------------------------------------------------------------------
    def due(self, version: int) -> bool:
        every = self.plan.every if self.plan else 1
        return version % every == 0

    def begin(self, version: int) -> None:
        """At boundary ``version``: capture what changes during the iteration, queue the rest."""
        self.profiler.begin_iteration(version)
        self._pending = None
        if version == self.restored_version or not self.due(version):
            return  # already in shared memory (we restored from it) / the plan skips it
        if version % 2 in self.pinned:
            events.emit("snapshot_skipped", step=version, tier="shm", reason="slot still being persisted")
            return
        # The RNGs move in the first forward and the data position with the next batch:
        # these are taken now. Parameters, optimizer and scheduler stay put until the
        # optimizer step, so capturing them is part of the work done inside the bubbles.
        boundary = self.state.capture(only=BOUNDARY_COMPONENTS, omit=self.omit)
        pending: dict[str, Any] = {"version": version}
        self._pending = pending
        self.engine.start([Task("prepare", lambda: self._prepare(version, boundary, pending))])

    def _window_budget(self, window: int) -> float:
        """Seconds of snapshot work the current plan allows in the window at ``window``."""
        if self.plan is None or window >= len(self.plan.windows):
            return 0.0
        return self.plan.windows[window] * self.planner_config.fill

    def _prepare(self, version: int, boundary: dict[str, Any], pending: dict[str, Any]) -> list[Item]:
        """Runs in a bubble (or in the stall): lay out the state and make the copy jobs."""
        rest = self.state.capture(only=tuple(c for c in COMPONENTS if c not in BOUNDARY_COMPONENTS), omit=self.omit)
        components = {c: (boundary[c] if c in boundary else rest[c]) for c in COMPONENTS if c in boundary or c in rest}
        skeleton, tensors = split(components)
        specs = layout(tensors)
        if specs != self.specs:
            self._relayout(specs)
        slot = self.buffer.slot_for(version)
        slot.begin(version)
        pending["slot"] = slot
        # Parameters and optimizer tensors are updated in place, so the same storages
        # come back every iteration: reuse the copy jobs while they do.
        signature = tuple((t.data_ptr(), t.numel()) for _, t in tensors)
        cached = self._jobs.get(version % 2)
        if cached is None or cached[0] != signature:
            data = slot.data()
            jobs = []
            for c in self.mine:
                src = as_bytes(tensors[c.tensor][1])[c.tensor_offset : c.tensor_offset + c.nbytes]
                jobs.append(CopyJob(index=c.index, src=src, dst=data[c.offset : c.offset + c.nbytes]))
            cached = (signature, jobs)
            self._jobs[version % 2] = cached
        items: list[Item] = list(cached[1])
        items.append(Task("metadata", lambda: self._metadata(version, skeleton, pending)))
        return items

    def _metadata(self, version: int, skeleton: Any, pending: dict[str, Any]) -> None:
        pending["meta"] = codec.encode({
            "skeleton": skeleton,
            "layout": [(s.name, s.dtype, s.shape, s.offset, s.nbytes) for s in self.specs or []],
            "version": version,
            "replica": self.replica,
            "replicas": self.replicas,
        })

    def _relayout(self, specs: list[TensorSpec]) -> None:
        reason = "first snapshot" if self.specs is None else "state layout changed"
        self.specs = specs
        self.chunks = make_chunks([(s.offset, s.nbytes) for s in specs], self.planner_config.chunk_bytes)
        self.mine = owned(self.chunks, self.replica, self.replicas)
        self.buffer.allocate(total_bytes(specs), META_CAPACITY)
        self._jobs.clear()
        self._replan(reason)

    def seal(self) -> None:
        """Finish version v before the optimizer step changes it: run what the bubbles left, commit."""
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        left, stats = self.engine.finish()
        if left:
            self.engine.run_now(left)
        version = pending["version"]
        pending["slot"].complete(version, pending["meta"])
        self.last_sealed = version
        self.last_stats = stats
        if stats.bandwidth > 0:
            self.bandwidth = 0.7 * self.bandwidth + 0.3 * stats.bandwidth
        events.emit(
            "snapshot", step=version, tier="shm", bytes=stats.window_bytes + stats.stall_bytes,
            window_bytes=stats.window_bytes, stall_bytes=stats.stall_bytes,
            copy_seconds=stats.window_seconds, stall_seconds=stats.stall_seconds,
            task_seconds=stats.task_seconds,
        )

    def end(self) -> None:
        prof = self.profiler.end_iteration()
        reason = self.profiler.drift()
        if reason:
            self._replan(reason, iteration_seconds=prof.seconds)
        if self.last_stats is not None and prof.idle > 0:
            used = min(self.last_stats.window_seconds, prof.idle)
            st = self.last_stats
            copied = st.window_bytes + st.stall_bytes
            events.emit("bubbles", step=prof.step, idle_seconds=prof.idle, windows=len(prof.windows),
                        copy_in_windows_seconds=used, utilisation=used / prof.idle,
                        in_window_fraction=st.window_bytes / copied if copied else 1.0,
                        iteration_seconds=prof.seconds)
        self.last_stats = None

    def _replan(self, reason: str, iteration_seconds: float = 0.0) -> None:
        windows = self.profiler.accept() if self.profiler.warm else []
        self.plan = plan(self.mine, windows, self.bandwidth, self.planner_config,
                         iteration_seconds=iteration_seconds, reason=reason)
        events.emit("replan", **self.plan.describe())

    def owned_tensors(self) -> set[int] | None:
        """Indices (in layout order) of the bulk tensors this replica copies; None: all."""
        return None if self.replicas == 1 else {c.tensor for c in self.mine}

    def read_version(self, version: int) -> dict[str, Any]:
        """A private copy of sealed ``version``'s components (only this replica's tensors are real)."""
        slot = self.buffer.slot_for(version)
        info = slot.info(version % 2)
        if info is None or info.state != COMPLETE or info.version != version:
            raise RuntimeError(f"version {version} is no longer in shared memory")
        meta = codec.decode(slot.meta())
        return rebuild(meta["skeleton"], _specs(meta), slot.data())

    # -- restore ----------------------------------------------------------------------------
    def restore(self) -> int | None:
        """Restore the newest version complete in every rank's shared memory; None if there is none."""
        t0 = time.perf_counter()
        infos = self.buffer.open_existing()
        complete = {i.version: i.slot for i in infos if i.state == COMPLETE}
        for i in infos:
            if i.state == WRITING:
                events.emit("checkpoint_rejected", step=i.version, tier="shm", reason="torn: the writer stopped mid-copy")
        everyone = all_gather(sorted(complete))
        common = set(everyone[0]).intersection(*map(set, everyone[1:])) if everyone else set()
        if not common:
            self.buffer.close()
            return None
        version = max(common)
        slot = self.buffer.slots[complete[version]]
        meta = codec.decode(slot.meta())
        specs = _specs(meta)
        data = slot.data()
        if meta["replicas"] > 1:
            # Each replica holds its own 1/D of the chunks (zeros elsewhere): summing rebuilds the whole.
            data = data.clone()
            dist.all_reduce(data, group=self.replica_group)
        self.state.restore(rebuild(meta["skeleton"], specs, data))
        self.buffer.close()
        self.restored_version = version
        events.emit("checkpoint_restored", step=version, tier="shm", seconds=time.perf_counter() - t0, path=str(self.buffer.root))
        return version
