"""Profiler drift detection, shared-memory slots, and the baft snapshotter in one process."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from baft import CheckpointConfig, TrainState, digest_components, events
from baft.bubbles.profiler import BubbleProfiler, ProfilerConfig
from baft.config import BaftConfig
from baft.snapshot.slotfile import COMPLETE, HEAD, HEADER, SLOTS, WRITING, own_slot
from baft.snapshot.slots import SnapshotBuffer
from baft.state.layout import layout, rebuild, split, total_bytes
from baft.strategies.baft.snapshotter import BubbleSnapshotter

BAFT = CheckpointConfig(strategy="baft")


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def iterate(prof: BubbleProfiler, clock: FakeClock, step: int, windows: list[float]) -> None:
    prof.begin_iteration(step)
    for w in windows:
        clock.t += 0.01  # compute
        with prof.waiting():
            clock.t += w
    prof.end_iteration()


def test_profiler_measures_windows_and_detects_drift() -> None:
    clock = FakeClock()
    prof = BubbleProfiler(ProfilerConfig(warmup=2, drift_threshold=0.3, patience=2), clock=clock)
    iterate(prof, clock, 0, [0.005, 0.002])
    assert prof.drift() is None  # still warming up
    iterate(prof, clock, 1, [0.005, 0.002])
    assert prof.drift() == "initial profile"
    assert prof.accept() == pytest.approx([0.005, 0.002])
    assert prof.history[-1].windows == pytest.approx([0.005, 0.002])
    iterate(prof, clock, 2, [0.0051, 0.002])  # noise, no drift
    assert prof.drift() is None
    iterate(prof, clock, 3, [0.02, 0.002])  # the loader got slow: one drifted iteration
    assert prof.drift() is None
    iterate(prof, clock, 4, [0.02, 0.002])  # second in a row: re-plan
    reason = prof.drift()
    assert reason is not None and "drifted" in reason
    prof.accept()
    iterate(prof, clock, 5, [0.02, 0.002, 0.001])
    assert "window count" in (prof.drift() or "")


def test_slots_survive_the_writer_and_torn_ones_show(tmp_path: Path) -> None:
    buf = SnapshotBuffer(tmp_path, rank=3)
    buf.allocate(128, 4096)
    s = buf.slot_for(7)
    s.begin(7)
    s.data()[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    s.complete(7, b"meta-7")
    buf.slot_for(8).begin(8)  # a writer killed mid-copy
    buf.close()

    again = SnapshotBuffer(tmp_path, rank=3)
    infos = {i.version: i for i in again.open_existing()}
    assert infos[7].state == COMPLETE and infos[8].state == WRITING
    assert again.slots[1].meta() == b"meta-7" and again.slots[1].data()[:4].tolist() == [1, 2, 3, 4]
    again.close()
    # Re-allocating the same size keeps the complete version (a restarted worker relies on it).
    third = SnapshotBuffer(tmp_path, rank=3)
    third.allocate(128, 4096)
    assert third.slots[1].info(1).state == COMPLETE
    third.close()


def test_layout_split_and_rebuild_round_trip() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    st = TrainState(model=model, optimizer=opt)
    comps = st.capture()
    skeleton, tensors = split(comps)
    specs = layout(tensors)
    data = torch.zeros(total_bytes(specs), dtype=torch.uint8)
    for s, (_, t) in zip(specs, tensors):
        data[s.offset : s.offset + s.nbytes] = t.detach().reshape(-1).view(torch.uint8)
    assert digest_components(rebuild(skeleton, specs, data)) == digest_components(comps)


def make_state(seed: int) -> TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return TrainState(model=model, optimizer=opt)


def step(st: TrainState, snap: BubbleSnapshotter) -> None:
    snap.begin(st.step)
    loss = st.model(torch.randn(4, 64)).pow(2).mean()
    st.optimizer.zero_grad()
    loss.backward()
    snap.seal()
    st.optimizer.step()
    st.step += 1
    snap.end()


def restore_into(state: TrainState, shm: Path) -> int | None:
    """What a restarted worker's snapshotter restores from ``shm`` into ``state``."""
    other = BubbleSnapshotter(state, BAFT, shm, rank=0)
    try:
        return other.restore()
    finally:
        other.close()


def test_snapshotter_restores_the_last_sealed_version(tmp_path: Path) -> None:
    st = make_state(0)
    seen: list[tuple[str, dict]] = []
    unsub = events.subscribe(lambda k, f: seen.append((k, f)))
    snap = BubbleSnapshotter(st, BAFT, tmp_path, rank=0)
    try:
        for _ in range(3):
            step(st, snap)
        at_3 = digest_components(st.capture())  # what version 3 (sealed in the next step) must hold
        step(st, snap)
        # Version 4 begins but the process "dies" before sealing it.
        expected = digest_components(st.capture())
        snap.begin(st.step)
        st.model(torch.randn(4, 64)).sum().backward()
    finally:
        snap.engine.close()
        snap.buffer.close()
        unsub()
    kinds = [k for k, _ in seen]
    assert kinds.count("snapshot") == 4 and "replan" in kinds
    # No pipeline here: no windows, so everything is copied in the (reported) stall.
    last = [f for k, f in seen if k == "snapshot"][-1]
    assert last["stall_bytes"] == last["bytes"] > 0

    fresh = make_state(1)
    version = restore_into(fresh, tmp_path)
    # Version 4 was torn (its slot marked WRITING); version 3 is the newest complete one.
    assert version == 3
    assert fresh.step == 3
    # Exactly the state of version 3 (a fresh model of another seed differed in every component).
    assert digest_components(fresh.capture()) == at_3 and at_3["model"] != expected["model"]


def test_snapshotter_version_matches_live_state(tmp_path: Path) -> None:
    st = make_state(2)
    snap = BubbleSnapshotter(st, BAFT, tmp_path, rank=0)
    try:
        step(st, snap)
        step(st, snap)
        snap.begin(st.step)
        expected = digest_components(st.capture())
        snap.seal()  # sealed before the optimizer step: exactly the live state now
    finally:
        snap.engine.close()
        snap.buffer.close()
    fresh = make_state(5)
    assert restore_into(fresh, tmp_path) == 2
    assert digest_components(fresh.capture()) == expected


def test_the_snapshotter_takes_its_policy_from_the_checkpoint_config(tmp_path: Path) -> None:
    from baft.bubbles.planner import PlannerConfig

    st = make_state(3)
    config = CheckpointConfig(strategy="baft", baft=BaftConfig(planner=PlannerConfig(chunk_bytes=4096)))
    snap = BubbleSnapshotter(st, config, tmp_path, rank=0)
    try:
        step(st, snap)
        assert snap.store is None  # no store address in the config: no peers
        assert max(c.nbytes for c in snap.chunks) <= 4096 < sum(c.nbytes for c in snap.chunks)
        components = snap.read_version(0)
        assert {"model", "optimizer", "rng", "step"} <= set(components)
    finally:
        snap.close()


def test_inline_work_that_overruns_shrinks_the_window() -> None:
    clock = FakeClock()
    prof = BubbleProfiler(ProfilerConfig(warmup=1), clock=clock)
    work = {"seconds": 0.0}

    def listener(entering: bool, index: int) -> None:
        if entering:
            clock.t += work["seconds"]

    prof.listeners.append(listener)
    prof.begin_iteration(0)
    work["seconds"] = 0.002
    with prof.waiting():
        clock.t += 0.003  # the wait still blocked after the work: the window is exact
    work["seconds"] = 0.004
    with prof.waiting():
        pass  # returned at once: the work overran a window of unknown length
    it = prof.end_iteration()
    assert it.windows == pytest.approx([0.005, 0.003])
    assert prof.overruns == 1
    assert [s.kind for s in it.spans] == ["snapshot", "wait", "snapshot", "wait"]


def test_profiler_times_the_optimizer_step() -> None:
    clock = FakeClock()

    class SlowSGD(torch.optim.SGD):
        def step(self, closure=None):  # type: ignore[override]
            clock.t += 0.25  # the step "takes" 250 ms on the fake clock
            return super().step(closure)

    prof = BubbleProfiler(clock=clock)
    model = torch.nn.Linear(2, 2)
    opt = SlowSGD(model.parameters(), lr=0.1)
    prof.attach_optimizer(opt)
    prof.begin_iteration(0)
    model(torch.ones(1, 2)).sum().backward()
    clock.t = 1.0
    opt.step()
    it = prof.end_iteration()
    spans = [s for s in it.spans if s.kind == "optimizer"]
    assert len(spans) == 1 and spans[0].duration == pytest.approx(0.25) and it.compute == pytest.approx(0.25)
    prof.detach()
    prof.begin_iteration(1)
    opt.step()
    assert not [s for s in prof.end_iteration().spans if s.kind == "optimizer"]  # hooks removed


class LoaderState:
    """A data loader whose state holds numpy scalars and a history longer than 1 MiB of metadata."""

    def __init__(self) -> None:
        self.position = np.int64(0)
        self.history = [float(i) for i in range(200_000)]  # ~2 MiB as JSON: over the old fixed cap
        self.weights = np.linspace(0.0, 1.0, 5000, dtype=np.float32)

    def state_dict(self) -> dict:
        return {"position": self.position, "history": list(self.history), "weights": self.weights.copy(),
                "epoch_mean": np.float32(0.25)}

    def load_state_dict(self, sd: dict) -> None:
        assert isinstance(sd["position"], np.int64) and sd["weights"].dtype == np.float32
        self.position, self.history, self.weights = sd["position"], list(sd["history"]), sd["weights"].copy()


def test_a_loader_state_with_numpy_scalars_and_megabytes_of_metadata_seals_and_restores(tmp_path: Path) -> None:
    """Hole f: the codec refused numpy scalars (the seal raised inside a pipeline wait) and the slots'
    metadata had a fixed 1 MiB capacity."""
    st = make_state(0)
    st.data = LoaderState()
    snap = BubbleSnapshotter(st, BAFT, tmp_path, rank=0)
    try:
        for _ in range(2):
            st.data.position += 1
            st.data.history.append(-1.0)
            step(st, snap)
        expected = digest_components(st.capture())
        snap.begin(st.step)
        snap.seal()  # version 2: the live state now
    finally:
        snap.engine.close()
        snap.buffer.close()
    fresh = make_state(5)
    fresh.data = LoaderState()
    assert restore_into(fresh, tmp_path) == 2
    assert digest_components(fresh.capture()) == expected
    assert fresh.data.position == np.int64(2) and type(fresh.data.position) is np.int64
    # The slots grew past the old cap, and a restarted writer that maps them again keeps them whole.
    paths = [own_slot(tmp_path, 0, k) for k in range(SLOTS)]
    heads = [HEAD.unpack(p.read_bytes()[: HEAD.size]) for p in paths]
    sealed = [(h, p) for h, p in zip(heads, paths) if h[1] == COMPLETE]
    assert len(sealed) >= 2 and all(h[4] > (1 << 20) for h, _ in sealed), heads  # metadata beyond the old cap
    assert all(h[5] >= h[4] and p.stat().st_size == HEADER + h[3] + h[5] for h, p in sealed), heads
    again = SnapshotBuffer(tmp_path, rank=0)
    again.allocate(heads[0][3], 1 << 20)
    try:
        assert 2 in {again.slots[k].info(k).version for k in again.slots if again.slots[k].info(k).state == COMPLETE}
    finally:
        again.close()


def test_the_switch_interval_is_said_and_put_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import sys

    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)  # Python's default
    try:
        with caplog.at_level(logging.INFO, logger="baft"):
            snap = BubbleSnapshotter(make_state(0), BAFT, tmp_path, rank=0)
        assert sys.getswitchinterval() == 0.0005 and "setswitchinterval(0.0005) (was 0.005)" in caplog.text
        snap.close()
        assert sys.getswitchinterval() == 0.005
    finally:
        sys.setswitchinterval(before)


def test_a_relayout_waits_for_a_reader_of_the_slots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Hole e: the persister thread reads a sealed version from its slot while the training thread may
    # re-lay the slots out (the state's layout changed): the remap unmapped the slots under the reader.
    import threading

    import baft.strategies.baft.snapshotter as bubble

    st = make_state(0)
    snap = BubbleSnapshotter(st, BAFT, tmp_path, rank=0)
    try:
        for _ in range(3):
            step(st, snap)
        reading, release = threading.Event(), threading.Event()
        real = bubble._components

        def slow(meta: bytes, data: torch.Tensor, copy: bool = True, views: object = None):
            reading.set()
            release.wait(10)
            return real(meta, data, copy, views)

        monkeypatch.setattr(bubble, "_components", slow)
        got: list[object] = []
        reader = threading.Thread(target=lambda: got.append(snap.read_version(2)))
        reader.start()
        assert reading.wait(10)
        relaid = threading.Thread(target=lambda: snap._relayout(snap.specs[:-1]))  # one tensor fewer
        relaid.start()
        relaid.join(0.3)
        assert relaid.is_alive()  # it waits for the reader, instead of unmapping what the reader reads
        release.set()
        reader.join(10)
        relaid.join(10)
        assert isinstance(got[0], dict) and "model" in got[0] and not relaid.is_alive()
    finally:
        snap.close()


def test_a_relayout_waits_while_the_persister_writes_from_views_of_a_slot(tmp_path: Path) -> None:
    # The direct persister writes a sealed version from views of its slot (no copy): the slots may not be
    # remapped under those views until it leaves sealed_version's block.
    import threading

    st = make_state(0)
    snap = BubbleSnapshotter(st, BAFT, tmp_path, rank=0)
    try:
        for _ in range(3):
            step(st, snap)
        inside, release, sums = threading.Event(), threading.Event(), []

        def persister() -> None:
            with snap.sealed_version(2) as components:
                inside.set()
                release.wait(10)
                sums.append(sum(float(t.double().sum()) for t in components["model"].values()))

        reader = threading.Thread(target=persister)
        reader.start()
        assert inside.wait(10)
        relaid = threading.Thread(target=lambda: snap._relayout(snap.specs[:-1]))
        relaid.start()
        relaid.join(0.3)
        assert relaid.is_alive()
        release.set()
        reader.join(10)
        relaid.join(10)
        assert not relaid.is_alive() and len(sums) == 1  # the views were read whole before the remap
    finally:
        snap.close()


class _Done:
    def wait(self) -> None:
        pass


def test_the_waits_go_to_the_profiler_whose_iteration_runs() -> None:
    """Two profilers on one stage (a benchmark's baft arms taking turns): each receives the waits of
    its own iterations, and the schedule's wait helper is restored only when the last detaches.
    (Before, the waits went to whichever was attached last, and the other planned with no windows.)"""
    from torch.distributed.pipelining import schedules

    original = schedules._wait_batch_p2p
    a, b = BubbleProfiler(), BubbleProfiler()
    a.attach([])
    b.attach([])
    try:
        for prof, other in ((a, b), (b, a), (a, b)):
            prof.begin_iteration(0)
            schedules._wait_batch_p2p([_Done()])
            waits = [s for s in prof.end_iteration().spans if s.kind == "wait"]
            assert len(waits) == 1 and other._current is None
        a.detach()
        assert schedules._wait_batch_p2p is not original  # b still listens
        b.begin_iteration(1)
        schedules._wait_batch_p2p([_Done()])
        assert [s.kind for s in b.end_iteration().spans].count("wait") == 1
    finally:
        a.detach()
        b.detach()
    assert schedules._wait_batch_p2p is original


def test_a_due_snapshot_waits_for_the_persist_that_holds_its_slot_instead_of_skipping(tmp_path: Path) -> None:
    # Found by CI under load: a persist still held version 5's slot when version 8 was due; version 8 was
    # skipped and a hang at step 9 restored 7 (two steps lost).
    import threading

    from baft.snapshot.slotfile import slot_of

    st = make_state(2)
    snap = BubbleSnapshotter(st, BAFT, tmp_path, rank=0)
    seen: list[tuple[str, int]] = []
    unsubscribe = events.subscribe(lambda kind, f: seen.append((kind, f.get("step")))
                                   if kind in ("snapshot_skipped", "persist_backpressure") else None)
    try:
        for _ in range(3):
            step(st, snap)
        snap.pinned.add(slot_of(3))  # a persist of version 0 still holds the slot version 3 is due in
        threading.Timer(0.2, lambda: snap.pinned.discard(slot_of(3))).start()
        step(st, snap)
        assert ("persist_backpressure", 3) in seen and ("snapshot_skipped", 3) not in seen
        assert 3 in snap.sealed_versions()
    finally:
        unsubscribe()
        snap.close()
