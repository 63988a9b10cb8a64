"""The restore path of baft's snapshotter: the newest version every rank can get, from its own shared-memory slots
or a peer node's replica (through the node's store), also after the number of data-parallel replicas changed; and
the discard of a timeline left behind. :class:`~baft.strategies.baft.snapshotter.BubbleSnapshotter` is one."""
from __future__ import annotations

import shutil
import time
from typing import Any

import torch
import torch.distributed as dist

from baft import events
from baft.config import CheckpointConfig
from baft.device.restore import restore_into
from baft.mesh.collective import all_gather, all_min
from baft.mesh.topology import old_ranks, restaged, stages_of
from baft.mesh.tpshared import broadcast_shared
from baft.snapshot.slotfile import COMPLETE, WRITING, discard_newer, slot_of
from baft.snapshot.slotmeta import components as _components
from baft.snapshot.slotmeta import saved_replicas, writer_place
from baft.snapshot.slotmeta import static_meta as _static_meta
from baft.snapshot.slots import Slot, SnapshotBuffer
from baft.state.train import TrainState
from baft.store.client import StoreClient


class SnapshotRestore:
    """The restore half of a snapshotter: what it reads from the slots it (or the rank before it) wrote."""

    state: TrainState
    config: CheckpointConfig
    buffer: SnapshotBuffer
    store: StoreClient | None
    rank: int
    replica: int
    replicas: int
    replica_group: Any
    world: list[tuple[str, int]] | None
    tp: tuple[int, Any] | None
    control: Any
    restored_version: int | None
    _torn: list[int]

    def restore(self, floor: int = -1) -> int | None:
        """Restore the newest version every rank can get: from its own slots, else from a peer
        node's replica (through the node's store). Versions older than ``floor`` (the newest
        persistent checkpoint) are stale. None if there is none (then the caller falls back to
        the persistent tier)."""
        t0 = time.perf_counter()
        events.emit("phase", phase="restore_locate", step=-1, tier="shm")
        complete = self._open_slots()
        for i in self._torn:
            events.emit("checkpoint_rejected", step=i, tier="shm", reason="torn: the writer stopped mid-copy")
        old_world = (_static_meta(self.buffer.slots[complete[max(complete)]]) or {}).get("world") if complete else None
        saved, moved = (max(x) for x in zip(*all_gather([saved_replicas(self.buffer, complete),
                                                         int(restaged(old_world, self.world))], self.control)))
        if moved:  # another stage count: no rank's memory holds a stage of this world; the persistent tier does
            events.emit("restore_candidates", tier="shm", local=sorted(complete), remote=[],
                        restaged_from=len(stages_of(old_world)) if old_world else None)
            self.buffer.close()
            return None
        if saved and saved != self.replicas:
            return self._restore_resized(saved, t0, floor, old_world)
        complete = {v: k for v, k in complete.items() if self._written_as_mine(self.buffer.slots[k])}
        remote = self.store.locate(self.rank) if self.store is not None else []
        events.emit("restore_candidates", tier="shm", local=sorted(complete), remote=sorted(remote))
        everyone = all_gather(sorted(set(complete) | {v for v, _ in remote}), self.control)
        common = set(everyone[0]).intersection(*map(set, everyone[1:])) if everyone else set()
        common = {v for v in common if v >= floor}
        if not common:
            self.buffer.close()
            return None
        version: int = max(common)
        tier = "shm"
        if version not in complete and self.store is not None:
            self.buffer.close()
            events.emit("phase", phase="restore_pull", step=version, tier="peer")
            source = self.store.pull(self.rank, version, self.buffer.path(slot_of(version)))
            complete = {v: k for v, k in self._open_slots().items() if self._written_as_mine(self.buffer.slots[k])}
            tier = "peer" if source is not None and source != self.config.baft.node else "shm"
        if all_min(int(version in complete), self.control) == 0:  # some rank could not get it: all fall back together
            self.buffer.close()
            return None
        events.emit("phase", phase="restore", step=version, tier=tier)
        slot = self.buffer.slots[complete[version]]
        data = slot.data()
        if self.replicas > 1:
            # Each replica holds its own tensors (zeros elsewhere): summing rebuilds the whole.
            data = data.clone()
            dist.all_reduce(data, group=self.replica_group)
        restore_into(self.state, _components(slot.meta(), data)[0])  # on CUDA, through a side stream
        self._fill_shared()
        self.buffer.close()
        self.restored_version = version
        events.emit("checkpoint_restored", step=version, tier=tier, seconds=time.perf_counter() - t0, path=str(self.buffer.root))
        return version

    def _restore_resized(self, saved: int, t0: float, floor: int, old_world: list[list[Any]] | None) -> int | None:
        """Restore after the number of data-parallel replicas changed (an elastic restart).

        The old ranks of this rank's stage are those that held the same pieces of state in the old
        world (``old_world``, recorded with this rank's newest version: every old rank's pieces and
        replica index), in any rank order; without that map, in replica-major order
        (``rank = replica * stages + stage``). Each of the ``saved`` replicas of the stage held its
        own share of the bulk tensors (zeros elsewhere), so their copies of one version, from this
        node's memory or pulled from a store, sum to the whole stage; the small state (RNGs, data
        position, scheduler) comes from the old rank with this rank's replica index (modulo ``saved``).
        """
        olds = old_ranks(self.rank, self.replica, self.replicas, saved, self.world, old_world)
        here = {o: SnapshotBuffer(self.buffer.root, o) for o in olds}
        local = {o: {i.version for i in buf.open_existing() if i.state == COMPLETE} for o, buf in here.items()}
        remote = {o: ({v for v, _ in self.store.locate(o)} if self.store is not None else set()) for o in olds}
        mine = set.intersection(*(local[o] | remote[o] for o in olds)) if olds else set()
        events.emit("restore_candidates", tier="shm", local=sorted(set.intersection(*local.values())) if olds else [],
                    remote=sorted(mine), resized_from=saved)
        everyone = all_gather(sorted(mine), self.control)
        common = {v for v in set(everyone[0]).intersection(*map(set, everyone[1:])) if v >= floor}
        data: torch.Tensor | None = None
        meta, tier, ok = b"", "shm", bool(common)
        pulled = self.buffer.root / f"resize-rank{self.rank}"
        try:
            version = max(common) if common else -1
            for d, o in enumerate(olds):
                if not ok:
                    break
                buf = here[o]
                if version not in local[o]:
                    buf.close()
                    buf = here[o] = SnapshotBuffer(pulled, o)
                    pulled.mkdir(parents=True, exist_ok=True)
                    events.emit("phase", phase="restore_pull", step=version, tier="peer")
                    source = self.store.pull(o, version, buf.path(slot_of(version))) if self.store else None
                    tier = "peer" if source is not None and source != self.config.baft.node else tier
                    buf.open_existing()
                slot = buf.slots.get(slot_of(version))
                info = slot.info(slot_of(version)) if slot is not None else None
                if slot is None or info is None or info.state != COMPLETE or info.version != version:
                    ok = False
                    break
                if writer_place(slot) != (d, saved):
                    ok = False  # not the share this old rank held in the world being restored
                    break
                part = slot.data()
                data = part.clone() if data is None else data.add_(part)
                if d == self.replica % saved:
                    meta = bytes(slot.meta())
        finally:
            for buf in here.values():
                buf.close()
            self.buffer.close()
            shutil.rmtree(pulled, ignore_errors=True)
        if all_min(int(ok), self.control) == 0:
            return None
        events.emit("phase", phase="restore", step=version, tier=tier)
        assert data is not None  # every rank holds a version of every old rank: the loop ran
        self.state.restore(_components(meta, data)[0])
        self._fill_shared()
        self.restored_version = version
        events.emit("checkpoint_restored", step=version, tier=tier, seconds=time.perf_counter() - t0,
                    path=str(self.buffer.root), resized_from=saved, replicas=self.replicas)
        return version

    def _tp_peers(self) -> set[int]:
        """The global ranks of this rank's TP peers (itself left out)."""
        assert self.tp is not None  # asked only with tensor parallelism
        return set(dist.get_process_group_ranks(self.tp[1])) - {dist.get_rank()}

    def _fill_shared(self) -> None:
        """The state the TP ranks hold alike, which only TP rank 0's slots hold: sent to its peers."""
        if self.tp is not None:
            broadcast_shared(self.state, self.tp[1], self._tp_peers())

    def discard_newer(self, version: int) -> None:
        """After the job restored ``version`` (-1: nothing) from any tier: forget this rank's copies of the
        timeline it left, newer than that, in its own slots and (through the node's store) on every node.
        A version is a step number only: without this, the old timeline's v+1 left in one rank's slot could
        be restored later beside the new timeline's v+1 of another rank."""
        dropped = discard_newer(self.buffer.root, self.rank, version)
        if self.store is not None:
            self.store.discard(self.rank, version)
        if dropped:
            events.emit("snapshots_discarded", after=version, versions=dropped, reason="newer than the version restored")

    def _open_slots(self) -> dict[int, int]:
        """Map this rank's slot files; complete versions -> slot index (torn ones in ``_torn``)."""
        infos = self.buffer.open_existing()
        self._torn = [i.version for i in infos if i.state == WRITING]
        return {i.version: i.slot for i in infos if i.state == COMPLETE}

    def _written_as_mine(self, slot: Slot) -> bool:
        """Whether ``slot``'s version was written by this rank's place among this many replicas: a version
        an earlier world wrote (before an elastic restart) holds another share of the tensors."""
        return writer_place(slot) == (self.replica, self.replicas)
