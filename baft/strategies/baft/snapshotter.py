"""The ``baft`` strategy: a snapshot of every iteration, copied inside the pipeline bubbles.

Per iteration of one stage:

``begin(v)``   at the step boundary v: capture the small state (RNGs, data
               position, scheduler, step) whole, mark shared-memory slot
               ``v % SLOTS`` as being written, and queue this replica's chunks of
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

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from baft import events
from baft.bubbles.copier import CopyEngine, CopyJob, CopyStats, Item, Task
from baft.bubbles.planner import Chunk, Plan, make_chunks, owned, plan
from baft.bubbles.profiler import BubbleProfiler
from baft.config import CheckpointConfig
from baft.device.copies import DeviceCopies
from baft.mesh.tpshared import shared_tensors
from baft.snapshot.slotfile import COMPLETE, slot_of
from baft.snapshot.slotmeta import components as _components
from baft.snapshot.slotmeta import only_markers as _only_markers
from baft.snapshot.slotmeta import pack as _pack
from baft.snapshot.slotmeta import static_meta as _static_meta
from baft.snapshot.slots import Slot, SnapshotBuffer, owner_tag
from baft.state import codec
from baft.state.dtensor import local_view
from baft.state.layout import (
    BULK_COMPONENTS,
    TensorSpec,
    as_bytes,
    layout,
    split,
    total_bytes,
)
from baft.state.train import TrainState
from baft.store.client import StoreClient
from baft.store.traffic import TRAFFIC_FILE, TrafficFlag
from baft.strategies.baft.snaprestore import SnapshotRestore

log = logging.getLogger("baft")

META_CAPACITY = 1 << 20
#: Captured at the step boundary itself; everything else is captured inside the bubbles.
BOUNDARY_COMPONENTS = ("rng", "data", "step")
#: How long the copier may hold the GIL when the training thread wants it back.
SWITCH_INTERVAL = 0.0005
INITIAL_BANDWIDTH = 5e9
#: Every this many iterations (and after each re-plan) the iteration's spans are announced as a
#: ``timeline`` event: compute, waits (the bubbles) and the snapshot work done inside them.
TIMELINE_EVERY = 10
#: The longest a due snapshot waits for the persist that holds its slot (then it is skipped): skipping
#: would leave the previous version as the newest, and a fault then would lose two steps.
PIN_WAIT = 2.0


def _acts_on_state_dict(module: torch.nn.Module) -> bool:
    if module._state_dict_pre_hooks:
        return True
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(module, FSDPModule)


class BubbleSnapshotter(SnapshotRestore):
    """Snapshots one stage's state into shared memory, inside its idle windows (and restores from them:
    :class:`~baft.strategies.baft.snaprestore.SnapshotRestore`)."""

    def __init__(self, state: TrainState, config: CheckpointConfig, shm_dir: Path, *, rank: int, replica: int = 0,
                 replicas: int = 1, replica_group: Any = None, world: list[tuple[str, int]] | None = None,
                 tp: tuple[int, Any] | None = None, control: Any = None) -> None:
        """``config``: the checkpoint policy (its profiler, planner, node store and
        replication stride); ``shm_dir``: where the slots live; ``rank`` and its place among the
        stage's data-parallel ``replicas`` (which chunks it copies; ``replica_group`` reduces them);
        ``world``: every rank's (the pieces it holds, its replica index), recorded with each version
        so a restore in a resized world finds the old ranks of its stage (None: rank-major order);
        ``tp``: this rank's place along tensor parallelism and the group of its TP peers (the state they
        hold alike is copied by TP rank 0 only, :mod:`baft.mesh.tpshared`); ``control``: the gloo group over
        all ranks the restore agrees over. The groups given must take host tensors (gloo: a slot's bytes are
        host memory; :mod:`baft.mesh.control`)."""
        self.state = state
        self.config = config
        self.rank, self.replica, self.replicas, self.replica_group = rank, replica, replicas, replica_group
        self.world = world
        self.tp = tp
        self.control = control
        self.profiler = BubbleProfiler(config.baft.profiler)
        # Process-wide: the copier thread must hand the GIL back within half a millisecond when the
        # training thread wants it. Said in the log, and put back by close().
        self._switch_interval = sys.getswitchinterval()
        if self._switch_interval > SWITCH_INTERVAL:
            sys.setswitchinterval(SWITCH_INTERVAL)
            log.info("baft: sys.setswitchinterval(%g) (was %g) while the snapshotter is attached, so the copier "
                     "thread yields the GIL to training quickly", SWITCH_INTERVAL, self._switch_interval)
        self.engine = CopyEngine(config.baft.planner.copier, budget=self._window_budget)
        self.profiler.listeners.append(self.engine.on_wait)
        self.buffer = SnapshotBuffer(shm_dir, rank)
        self.specs: list[TensorSpec] | None = None
        self.chunks: list[Chunk] = []
        self.mine: list[Chunk] = []
        self.plan: Plan | None = None
        self.bandwidth = INITIAL_BANDWIDTH
        self.restored_version: int | None = None
        self._pending: dict[str, Any] | None = None
        self._jobs: dict[int, list[CopyJob]] = {}
        self._staged: dict[str, torch.Tensor] = {}  # the model's buffers at the last boundary (_stage_buffers)
        self._static: tuple[tuple[Any, ...], bytes | None] | None = None
        self.store = StoreClient(config.baft.store) if config.baft.store else None
        self.traffic: TrafficFlag | None = None
        if self.store is not None:  # tell the node's store when pipeline traffic is in flight
            traffic = self.traffic = TrafficFlag(Path(shm_dir) / TRAFFIC_FILE, rank)
            self.profiler.listeners.insert(0, lambda entering, _window: traffic.set(entering))
        self._torn: list[int] = []
        self._owner = ""  # this writer's owner_tag, once the layout is known
        self.placements: dict[str, Any] = {}  # where the bulk tensors' DTensors lie (TrainState.placements)
        self.param_names: dict[int, str] = {}  # the optimizer's parameter index -> name (TrainState.param_names)
        self._layout_at_boundary = False  # the model's state dict only at the step boundary (see attach)
        self._foreign: set[int] = set()
        """Slots another ownership filled (an elastic restart changed the replicas): zeroed before their next
        version, or the bytes this replica does not own would keep theirs."""
        self.last_stats: CopyStats | None = None
        self.last_sealed: int | None = None
        self.persistent: Callable[[], tuple[int, int]] | None = None
        """The strategy's persistent interval now and its newest persistent checkpoint (-1: none), told to
        the store with each sealed version."""
        self._slots_lock = threading.Lock()  # held by a reader of a slot (the persister) and while remapping
        self.pinned: set[int] = set()  # slots a reader still needs: a version due in one is skipped
        self.device: DeviceCopies | None = None  # the CUDA path: taken once the state is on CUDA

    def attach(self, stage: Any) -> None:
        # A module with state-dict pre-hooks may act when its state dict is taken: FSDP2's reshards
        # the parameters it gathered for the forward, which inside a bubble would free what the
        # backward needs and make this rank gather again on its own (a collective its peers never
        # join: the job hangs). Such a model's state dict is taken only at the step boundary. FSDP2
        # registers its hooks at the first forward, after this: its modules are recognised by type.
        self._layout_at_boundary = any(_acts_on_state_dict(m) for m in self.state.model.modules())
        self.profiler.attach(stage)
        if self.state.optimizer is not None:
            self.profiler.attach_optimizer(self.state.optimizer)

    def close(self) -> None:
        if sys.getswitchinterval() == SWITCH_INTERVAL < self._switch_interval:
            sys.setswitchinterval(self._switch_interval)
        self.profiler.detach()
        self.engine.close()
        self.buffer.close()  # on CUDA, first seals the versions in flight (DeviceCopies.attach)
        if self.store is not None:
            self.store.close()
        if self.traffic is not None:
            self.traffic.close()

    # -- the iteration ----------------------------------------------------------------------
    def due(self, version: int) -> bool:
        every = self.plan.every if self.plan else 1
        return version % every == 0

    def begin(self, version: int) -> None:
        """At boundary ``version``: capture what changes during the iteration, queue the rest."""
        if self.device is None and self._static is None:  # the layout is not known yet, or changed: on CUDA?
            self.device = DeviceCopies.for_state([*self.state.model.parameters(), *self.state.model.buffers()], self)
        self.profiler.begin_iteration(version)
        self._pending = None
        if version == self.restored_version or not self.due(version):
            return  # already in shared memory (we restored from it) / the plan skips it
        if slot_of(version) in self.pinned:
            t = time.perf_counter()
            while slot_of(version) in self.pinned and time.perf_counter() - t < PIN_WAIT:
                time.sleep(0.001)
            events.emit("persist_backpressure", step=version, seconds=time.perf_counter() - t)
            if slot_of(version) in self.pinned:
                events.emit("snapshot_skipped", step=version, tier="shm",
                            reason=f"slot still being persisted after {PIN_WAIT:g} s")
                return
        # The RNGs move in the first forward and the data position with the next batch:
        # these are taken now. Parameters, optimizer and scheduler stay put until the
        # optimizer step, so capturing them is part of the work done inside the bubbles.
        boundary = self.state.capture(only=BOUNDARY_COMPONENTS)
        self._stage_buffers()
        if self._layout_at_boundary:
            self._current_layout()
            if self._static is not None and self._static[1] is None:
                boundary["bulk_skeleton"] = split(self.state.capture(only=BULK_COMPONENTS))[0]
        pending: dict[str, Any] = {"version": version}
        self._pending = pending
        pending["copies"] = copies = self.device.begin(version) if self.device is not None else None  # `ready` now
        self.engine.start([Task("prepare", lambda: self._prepare(version, boundary, pending))], sink=copies)

    def _stage_buffers(self) -> None:
        """Copy the model's buffers aside now, at the step boundary; the bubbles copy them from there.

        Buffers may change in the forward (BatchNorm's running statistics move with every
        microbatch): copied from the live tensors inside the bubbles, a version would mix
        microbatches of the next step. They are small, so the copy costs little on the training
        thread. A buffer that appears or changes shape gets new staging, and the copy jobs are
        rebuilt (they read from it)."""
        for name, buf in self.state.model.named_buffers():
            buf = local_view(buf)
            staged = self._staged.get(f"model.{name}")
            if staged is None or staged.shape != buf.shape or staged.dtype != buf.dtype:
                self._staged[f"model.{name}"] = buf.detach().clone()
                self._static = None
            else:
                staged.copy_(buf)

    def _window_budget(self, window: int) -> float:
        """Seconds of snapshot work the current plan allows in the window at ``window``."""
        if self.plan is None or window >= len(self.plan.windows):
            return 0.0
        return self.plan.windows[window] * self.config.baft.planner.fill

    def _bulk_identity(self) -> tuple[Any, ...]:
        """Which storages hold the bulk state: unchanged while training updates them in place.

        It changes when the optimizer creates its state (after the first step) or
        when a tensor is reallocated; then the layout and the copy jobs are rebuilt.
        """
        def key(t: torch.Tensor) -> tuple[Any, ...]:
            t = local_view(t)
            return (id(t.untyped_storage()), t.data_ptr(), t.numel())

        ids: list[Any] = [key(t) for t in self.state.model.state_dict(keep_vars=True).values()
                          if isinstance(t, torch.Tensor)]
        opt = self.state.optimizer
        if opt is not None:
            for per_param in opt.state.values():
                ids.append(len(per_param))
                ids.extend(key(t) for t in per_param.values() if isinstance(t, torch.Tensor))
        return tuple(ids)

    def _prepare(self, version: int, boundary: dict[str, Any], pending: dict[str, Any]) -> list[Item]:
        """Runs in a bubble (or in the stall): make sure the layout is current, queue the copies."""
        if not self._layout_at_boundary:
            self._current_layout()
        assert self._static is not None  # the layout (current now) made it
        static_meta = self._static[1]
        pending["slot"] = self._open_slot(version)
        dynamic = self._dynamic(boundary, full=static_meta is None)
        items: list[Item] = list(self._jobs[slot_of(version)])
        items.append(Task("metadata", lambda: pending.__setitem__("meta", _pack(static_meta or b"", codec.encode(dynamic)))))
        return items

    def _open_slot(self, version: int) -> Slot:
        """Mark ``version``'s slot as being written (cleared first if another ownership filled it)."""
        slot = self.buffer.slot_for(version)
        slot.begin(version)
        if slot_of(version) in self._foreign:
            slot.data().zero_()
            self._foreign.discard(slot_of(version))
        events.emit("phase", phase="snapshot", step=version)  # the slot is now being written
        return slot

    def _current_layout(self) -> None:
        """Rebuild the layout and copy jobs if the bulk tensors moved (or their skeleton cannot be cached)."""
        identity = self._bulk_identity()
        if self._static is None or self._static[0] != identity or self._static[1] is None:
            self._build_static(identity)

    def _build_static(self, identity: tuple[Any, ...]) -> None:
        """Lay out the bulk tensors, make every slot's copy jobs, encode what does not change."""
        components = self.state.capture(only=BULK_COMPONENTS)
        skeleton, tensors = split(components)
        self.placements = self.state.placements()
        self.param_names = self.state.param_names()
        specs = layout(tensors)
        # a buffer is copied from its staging (the boundary's value), everything else from the live tensor
        sources = [as_bytes(self._staged.get(name, t)) for name, t in tensors]
        self.device = self.device or DeviceCopies.for_state(sources, self)
        if specs != self.specs:
            self._relayout(specs)
        if self.device is not None:  # page-lock the slots' data as mapped now (else: staging buffers)
            self.device.layout(self.buffer, self.config.baft.planner.chunk_bytes)
        self._jobs = {}
        for k, slot in self.buffer.slots.items():
            data = slot.data()
            self._jobs[k] = [
                CopyJob(index=c.index, src=sources[c.tensor][c.tensor_offset : c.tensor_offset + c.nbytes],
                        dst=data[c.offset : c.offset + c.nbytes])
                for c in self.mine
            ]
        static = {"model": skeleton.get("model"), "optimizer_state": (skeleton.get("optimizer") or {}).get("state")}
        meta_static = {
            "layout": [(s.name, s.dtype, s.shape, s.offset, s.nbytes) for s in self.specs or []],
            "replica": self.replica, "replicas": self.replicas, "owner": self._owner, **static,
            "world": [list(p) for p in self.world] if self.world is not None else None,
        }
        # Only markers and structure may be cached; any other leaf could change between steps.
        self._static = (identity, codec.encode(meta_static) if _only_markers(static) else None)

    def _dynamic(self, boundary: dict[str, Any], full: bool) -> dict[str, Any]:
        """What must be written with every version besides the bulk tensors."""
        rest = self.state.capture(only=("optimizer", "scheduler", "scaler"))
        out = dict(boundary)
        for c in ("scheduler", "scaler"):
            if c in rest:
                out[c] = rest[c]
        if "optimizer" in rest:
            out["optimizer_groups"] = rest["optimizer"]["param_groups"]
        if full and "bulk_skeleton" not in out:  # the bulk skeleton has non-tensor leaves: write it every time
            skeleton, _ = split(self.state.capture(only=BULK_COMPONENTS))
            out["bulk_skeleton"] = skeleton
        return out

    def _relayout(self, specs: list[TensorSpec]) -> None:
        reason = "first snapshot" if self.specs is None else "state layout changed"
        self.specs = specs
        self.chunks = make_chunks([(s.offset, s.nbytes) for s in specs], self.config.baft.planner.chunk_bytes)
        self.mine = owned(self.chunks, self.replica, self.replicas)
        if self.tp is not None and self.tp[0] != 0:  # TP rank 0 copies what the TP ranks hold alike
            shared = shared_tensors(specs, self.state, self.placements, self._tp_peers())
            self.mine = [c for c in self.mine if c.tensor not in shared]
        self._owner = owner_tag(self.replica, self.replicas, [c.tensor for c in self.mine], specs)
        with self._slots_lock:  # a persister reading a sealed version finishes first
            self.buffer.allocate(total_bytes(specs), META_CAPACITY)
        self._foreign = {k for k, slot in self.buffer.slots.items()
                         if not slot.fresh and (_static_meta(slot) or {}).get("owner") != self._owner}
        self._replan(reason)

    def seal(self) -> None:
        """Finish version v before the optimizer step changes it: run what the bubbles left, commit."""
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        left, stats = self.engine.finish()
        copies = pending["copies"]
        pending["window_batches"] = len(copies.dones) if copies is not None else 0  # the rest is the stall's
        if left:
            self.engine.run_now(left)
        if not (self.device and self.device.defer(pending["copies"], lambda: self._complete(pending, stats))):
            self._complete(pending, stats)  # on CUDA, once the copies issued on the copy stream completed

    def _complete(self, pending: dict[str, Any], stats: CopyStats) -> None:
        version, slot = pending["version"], pending["slot"]
        copies = pending["copies"]
        seconds = copies.batch_seconds() if copies is not None else None
        if seconds is not None:  # on a device: the copies' time on the copy stream, not the host's issuing them
            n = pending["window_batches"]
            stats.window_seconds, stats.stall_seconds = sum(seconds[:n]), sum(seconds[n:])
        mapped = slot.data().data_ptr()
        slot.complete(version, pending["meta"])
        self._static = self._static if slot.data().data_ptr() == mapped else None  # remapped: the jobs held the old map
        self.last_sealed = version
        if (self.store is not None and version % self.config.baft.replicate_every == 0
                and self.store.sealed(self.rank, version, self.buffer.path(slot_of(version)),
                                      *(self.persistent() if self.persistent is not None else (None, None)))):
            events.emit("phase", phase="replicate", step=version)  # the store is now copying it to a peer
        self.last_stats = stats
        if stats.bandwidth > 0:
            self.bandwidth = 0.7 * self.bandwidth + 0.3 * stats.bandwidth
        events.emit("snapshot", step=version, tier="shm", bytes=stats.window_bytes + stats.stall_bytes,
                    window_bytes=stats.window_bytes, stall_bytes=stats.stall_bytes, copy_seconds=stats.window_seconds,
                    stall_seconds=stats.stall_seconds, task_seconds=stats.task_seconds)

    def end(self) -> None:
        if self.device is not None:
            self.device.settle()
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
        if prof.step % TIMELINE_EVERY == 0 or reason:
            events.emit("timeline", step=prof.step, seconds=prof.seconds,
                        spans=[[sp.kind, sp.index, round(sp.start, 6), round(sp.end, 6)] for sp in prof.spans])

    def _replan(self, reason: str, iteration_seconds: float = 0.0) -> None:
        windows = self.profiler.accept() if self.profiler.warm else []
        if iteration_seconds <= 0 and self.profiler.history:
            iteration_seconds = self.profiler.history[-1].seconds  # e.g. a layout change between profiles
        self.plan = plan(self.mine, windows, self.bandwidth, self.config.baft.planner,
                         iteration_seconds=iteration_seconds, reason=reason)
        events.emit("replan", step=self.state.step, **self.plan.describe())

    def sealed_versions(self) -> set[int]:
        """The versions this rank's slots hold complete (what it could persist or restore now)."""
        return {info.version for k, slot in self.buffer.slots.items()
                if (info := slot.info(k)) is not None and info.state == COMPLETE}

    def owned_tensors(self) -> set[int] | None:
        """Indices (in layout order) of the bulk tensors this replica copies; None: all."""
        return None if len(self.mine) == len(self.chunks) else {c.tensor for c in self.mine}

    def read_version(self, version: int) -> dict[str, Any]:
        """A private copy of sealed ``version``'s components (only this replica's tensors are real)."""
        with self.sealed_version(version, copy=True) as components:
            return components

    @contextlib.contextmanager
    def sealed_version(self, version: int, copy: bool = False) -> Iterator[dict[str, Any]]:
        """Sealed ``version``'s components, its tensors views of its slot (or copies) that stay valid
        inside the block: the slots are not remapped meanwhile (a layout change waits). Pin the slot
        (:attr:`pinned`) first, or the next version due in it may overwrite them."""
        with self._slots_lock:
            slot = self.buffer.slot_for(version)
            info = slot.info(slot_of(version))
            if info is None or info.state != COMPLETE or info.version != version:
                raise RuntimeError(f"version {version} is no longer in shared memory")
            yield _components(slot.meta(), slot.data(), copy, slot.views)[0]
