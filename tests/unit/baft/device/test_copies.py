"""The order of the device path's copies (baft.device.copies), checked on CPU with a simulated device.

:class:`FakeStreams` runs each stream's work in FIFO order, a wait only once its event completed, and the
streams interleaved as the test chooses; a copy moves the bytes when the device runs it, and the training's
optimizer step is a 'kernel' on the compute stream that changes the state when it runs. A version's slot
must then hold exactly that version's bytes whatever the interleaving, and the log must show the order the
CUDA path promises (see :func:`check_order`)."""
from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from baft import CheckpointConfig, TrainState, digest_components, events
from baft.bubbles.copier import CopyEngine, CopyJob
from baft.bubbles.profiler import BubbleProfiler
from baft.device import copies as devicecopy
from baft.device.copies import DeviceCopies, StagingRing, VersionCopy
from baft.device.restore import DeviceRestore
from baft.snapshot.slotfile import SLOTS, slot_of
from baft.snapshot.slots import SnapshotBuffer
from baft.strategies.baft.snapshotter import BubbleSnapshotter

from tests.fakes.streams import FakeStreams

CHUNK = 16


class Run:
    """A stage's state (``chunks`` chunks of bytes), its SLOTS slots, and a log of what the test saw."""

    def __init__(self, chunks: int, streams: FakeStreams, ring: int | None) -> None:
        self.fake = streams
        self.state = torch.arange(chunks * CHUNK, dtype=torch.uint8)  # the live state (on the 'device')
        self.base = self.state.clone()
        self.slots = {k: torch.zeros_like(self.state) for k in range(SLOTS)}
        self.jobs = {k: [CopyJob(i, self.state[i * CHUNK : (i + 1) * CHUNK], self.slots[k][i * CHUNK : (i + 1) * CHUNK])
                         for i in range(chunks)] for k in range(SLOTS)}
        self.device = DeviceCopies(streams, ring_buffers=ring or 1)
        if ring is not None:
            self.device.ring = StagingRing(streams, ring, CHUNK)
        self.sealed: list[int] = []
        self.copies: dict[int, VersionCopy] = {}
        self.marks: dict[int, dict[str, int]] = {}  # log positions: begin, defer, optimizer kernel
        self.undone_at_step: dict[int, list[int]] = {}  # done events not complete when the step was ordered

    def seal(self, version: int) -> None:
        copies = self.copies[version]
        assert all(e.done for e in copies.dones), f"version {version} sealed before its last copy completed"
        assert version not in self.sealed, f"version {version} sealed twice"
        assert torch.equal(self.slots[slot_of(version)], self.base + version), f"version {version}'s slot is wrong"
        self.sealed.append(version)

    def optimizer_step(self, version: int) -> None:
        self.fake.kernel("compute", f"optimizer{version}", lambda: self.state.add_(1))


def drive(run: Run, versions: int, windows: list[list[float]], rng: random.Random, steps: list[int]) -> None:
    """``versions`` iterations: begin (``ready``), the windows (the engine issues what each budget allows),
    the seal, the optimizer step; the device runs ``steps[i]`` pieces of work in between, in ``rng``'s order."""
    fake = run.fake
    engine = CopyEngine("inline", budget=lambda w: windows[v % len(windows)][w])
    engine.bandwidth = CHUNK  # a chunk's estimate: 1 second
    choose = lambda runnable: rng.randrange(len(runnable))  # noqa: E731
    for v in range(versions):
        run.marks[v] = {"begin": len(fake.log)}
        copies = run.copies[v] = run.device.begin(v)
        engine.start(list(run.jobs[slot_of(v)]), sink=copies)
        for w in range(len(windows[v % len(windows)])):
            fake.kernel("compute", f"forward{v}.{w}", lambda: None)  # reads the state, changes nothing
            engine.on_wait(True, w)
            run.device.on_wait(True, w)
            fake.run(choose, steps[(v + w) % len(steps)])
            engine.on_wait(False, w)
        left, _ = engine.finish()
        engine.run_now(left)
        run.marks[v]["defer"] = len(fake.log)
        run.undone_at_step[v] = [e.id for e in copies.dones if not e.done]
        assert run.device.defer(copies, lambda v=v: run.seal(v))
        run.marks[v]["optimizer"] = len(fake.log)
        run.optimizer_step(v)
        fake.run(choose, steps[v % len(steps)])
    run.device.close()


def check_order(run: Run, versions: int, chunks: int) -> None:
    """What the CUDA path promises, read from the log."""
    log = run.fake.log
    copy_stream = run.device.stream
    assert run.sealed == list(range(versions)), "every version sealed once, in order"
    ran = Counter(e[2][1] for e in log if e[0] == "ran" and e[1] == copy_stream and e[2][0] == "copy")
    assert sum(ran.values()) == versions * chunks, "every chunk of every version copied once"
    for v in range(versions):
        copies, marks = run.copies[v], run.marks[v]
        ready = copies.ready.id
        start, end = marks["begin"], marks.get("optimizer", len(log))
        here = log[start:end]
        # (1) ready recorded on the compute stream after the previous optimizer step; the copy stream waits on
        # it before the version's first copy
        assert [e for e in here if e[0] in ("record", "wait", "copy")][0] == ("record", "compute", ready)
        if v > 0:
            assert log.index(("kernel", "compute", f"optimizer{v - 1}")) < start
        issued = [i for i, e in enumerate(here) if e[0] == "copy"]
        assert len(issued) == chunks and len({here[i][2] for i in issued}) == chunks, "each chunk issued once"
        assert ("wait", copy_stream, ready) in here[: issued[0]], "a copy issued before the wait on ready"
        # (2) the optimizer step is ordered after every copy not yet complete when it was issued: the compute
        # stream waits on the last done (the copy stream completes it after all earlier ones) ...
        waits = [e[2] for e in log[marks["defer"] : end] if e[:2] == ("wait", "compute")]
        last = copies.dones[-1].id
        assert max(e.id for e in copies.dones) == last
        if run.undone_at_step[v]:
            assert waits == [last], f"version {v}: the step waits on {waits}, copies {run.undone_at_step[v]} undone"
        else:  # ... and on nothing when they had all completed
            assert waits == []
    # the host never waits for the compute stream
    computed = {e[2] for e in log if e[0] == "record" and e[1] == "compute"}
    assert not [e for e in log if e[0] == "sync" and e[1] in computed]


@settings(max_examples=60, deadline=None)
@given(chunks=st.integers(1, 9), versions=st.integers(1, 5),
       windows=st.lists(st.lists(st.floats(0, 4), max_size=4), min_size=1, max_size=3),
       steps=st.lists(st.integers(0, 12), min_size=1, max_size=5), seed=st.integers(0, 2**16),
       ring=st.one_of(st.none(), st.integers(1, 3)))
def test_copies_follow_ready_and_the_step_follows_the_copies(chunks: int, versions: int, windows: list[list[float]],
                                                            steps: list[int], seed: int, ring: int | None) -> None:
    run = Run(chunks, FakeStreams(), ring)
    drive(run, versions, windows, random.Random(seed), steps)
    check_order(run, versions, chunks)
    if ring is not None:
        assert run.device.ring is not None and run.device.ring.made <= ring  # bounded


def test_a_version_is_sealed_only_when_its_last_copy_completed() -> None:
    fake = FakeStreams()
    run = Run(3, fake, None)
    copies = run.copies[0] = run.device.begin(0)
    for job in run.jobs[0][:2]:
        copies.copy(job)
    copies.flush()  # a window's batch
    assert not copies.sealable()  # before the optimizer step: never
    copies.copy(run.jobs[0][2])  # the rest, at the step (the engine's stall)
    run.device.defer(copies, lambda: run.seal(0))
    assert len(copies.dones) == 2 and run.sealed == []
    assert ("wait", "compute", copies.dones[-1].id) in fake.log  # nothing ran yet: the step waits on the last
    run.optimizer_step(0)
    fake.step(fake.current())  # `ready` completes
    while not copies.dones[0].done:  # the wait on ready, the batch's timing mark, two copies, its done
        assert fake.step(run.device.stream)
    assert copies.dones[0].done and not copies.dones[-1].done
    run.device.settle()
    assert run.sealed == []
    assert not fake.step("compute")  # the optimizer step waits for the last copy
    fake.drain()
    run.device.on_wait(True, 0)  # a window: sealed now
    assert run.sealed == [0]
    run.device.settle(block=True)
    assert run.sealed == [0]  # never twice


def test_the_step_does_not_wait_for_copies_already_done() -> None:
    fake = FakeStreams()
    run = Run(2, fake, None)
    copies = run.copies[0] = run.device.begin(0)
    for job in run.jobs[0]:
        copies.copy(job)
    copies.flush()
    fake.drain()  # the copies finished inside the bubbles
    run.device.defer(copies, lambda: run.seal(0))
    assert not [e for e in fake.log if e[:2] == ("wait", "compute")]
    assert run.sealed == [0]  # and it is sealed at once


def test_the_checks_catch_copies_issued_before_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """The order check fails when the copy stream does not wait on ``ready``."""
    real = FakeStreams.wait

    def wait(self: FakeStreams, stream: str, event: Any) -> None:
        if stream == "compute":
            real(self, stream, event)

    monkeypatch.setattr(FakeStreams, "wait", wait)
    run = Run(2, FakeStreams(), None)
    with pytest.raises(AssertionError, match="before the wait on ready|slot is wrong"):
        drive(run, 3, [[0.0]], random.Random(1), [0, 20])
        check_order(run, 3, 2)


def test_the_checks_catch_a_seal_before_the_last_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(VersionCopy, "sealable", lambda self: self.closed)
    run = Run(2, FakeStreams(), None)
    with pytest.raises(AssertionError, match="before its last copy"):
        drive(run, 2, [[0.0]], random.Random(0), [0])


def test_the_checks_catch_a_step_not_ordered_after_the_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    real = FakeStreams.wait

    def wait(self: FakeStreams, stream: str, event: Any) -> None:
        if stream != "compute":
            real(self, stream, event)

    monkeypatch.setattr(FakeStreams, "wait", wait)
    failed = 0
    for seed in range(20):
        run = Run(3, FakeStreams(), None)
        try:
            drive(run, 3, [[1.0]], random.Random(seed), [4])
            check_order(run, 3, 3)
        except AssertionError:
            failed += 1
    assert failed == 20


def test_registered_slots_or_the_staging_ring(tmp_path: Path) -> None:
    buf = SnapshotBuffer(tmp_path, rank=0)
    buf.allocate(4096, 4096)
    fake = FakeStreams()
    device = DeviceCopies(fake)
    device.attach(BubbleProfiler(), buf)
    assert device.layout(buf, 1024) == "registered"
    assert fake.registered == {s.data().data_ptr(): 4096 for s in buf.slots.values()}
    assert device.layout(buf, 1024) == "registered" and len(fake.log) == 0  # the same mapping: nothing redone
    slot = buf.slots[0]
    slot.grow_meta(slot.meta_capacity * 4)  # remapped: its old mapping unlocked first
    assert len(fake.registered) == 2
    assert device.layout(buf, 1024) == "registered" and len(fake.registered) == 3
    buf.close()
    assert fake.registered == {}

    refusing = FakeStreams(refuse_register=True)
    again = DeviceCopies(refusing)
    buf = SnapshotBuffer(tmp_path, rank=1)
    buf.allocate(4096, 4096)
    again.attach(BubbleProfiler(), buf)
    assert again.layout(buf, 1024) == "staging" and again.ring is not None and again.ring.nbytes == 1024
    assert refusing.registered == {}
    buf.close()


def test_a_partly_refused_registration_unlocks_what_it_locked() -> None:
    fake = FakeStreams()
    calls = []

    def register(ptr: int, nbytes: int) -> bool:
        calls.append(ptr)
        return len(calls) < 3

    fake.register = register  # type: ignore[method-assign]
    fake.unregister = lambda ptr: calls.append(-ptr)  # type: ignore[method-assign]
    pinned = devicecopy.PinnedRegions(fake)
    assert not pinned.register([(10, 1), (20, 1), (30, 1)])
    assert calls == [10, 20, 30, -10, -20] and pinned.regions == {}


def test_the_ring_is_bounded_and_waits_for_its_oldest_batch() -> None:
    fake = FakeStreams()
    run = Run(5, fake, 2)
    copies = run.copies[0] = run.device.begin(0)
    for job in run.jobs[0]:
        copies.copy(job)  # the third chunk finds both buffers lent: the host waits for the first batch
    ring = run.device.ring
    assert ring is not None and ring.made == 2 and ring.waits >= 1
    syncs = [e for e in fake.log if e[0] == "sync"]
    assert syncs and all(any(e[1] == d.id for d in copies.dones) for e in syncs)  # copy-stream events only
    run.device.defer(copies, lambda: run.seal(0))
    run.optimizer_step(0)
    run.device.close()
    assert run.sealed == [0]


def test_a_slot_still_in_flight_is_waited_for_before_it_is_reused() -> None:
    fake = FakeStreams()
    run = Run(2, fake, None)
    for v in range(SLOTS + 1):  # the device never runs on its own: version 0 is still in flight at version 3
        copies = run.copies[v] = run.device.begin(v)
        for job in run.jobs[slot_of(v)]:
            copies.copy(job)
        run.device.defer(copies, lambda v=v: run.seal(v))
        run.optimizer_step(v)
        if v < SLOTS:
            assert run.sealed == []
    assert run.sealed == [0] and run.device.slot_waits == 1
    run.device.close()
    assert run.sealed == list(range(SLOTS + 1))


def test_a_host_tensor_is_copied_by_the_host() -> None:
    fake = FakeStreams(device_tensors=False)
    copies = VersionCopy(fake, fake.side(), 0)
    src, dst = torch.arange(8, dtype=torch.uint8), torch.zeros(8, dtype=torch.uint8)
    copies.copy(CopyJob(0, src, dst))
    assert torch.equal(dst, src) and copies.host_copies == 1 and not [e for e in fake.log if e[0] == "copy"]
    copies.before_optimizer_step()
    assert copies.sealable()


@settings(max_examples=40, deadline=None)
@given(chunks=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_restore_copies_in_after_the_last_use_and_before_training_goes_on(chunks: int, seed: int) -> None:
    fake = FakeStreams()
    live = torch.zeros(chunks * CHUNK, dtype=torch.uint8)
    slot = torch.arange(chunks * CHUNK, dtype=torch.uint8)
    seen: list[torch.Tensor] = []
    fake.kernel("compute", "last use", lambda: seen.append(live.clone()))
    restore = DeviceRestore(fake, fake.side())
    restore.run([CopyJob(i, slot[i * CHUNK : (i + 1) * CHUNK], live[i * CHUNK : (i + 1) * CHUNK]) for i in range(chunks)])
    fake.kernel("compute", "training", lambda: seen.append(live.clone()))
    rng = random.Random(seed)
    fake.run(lambda r: rng.randrange(len(r)), 10_000)
    assert restore.finished()
    assert torch.equal(seen[0], torch.zeros_like(live)) and torch.equal(seen[1], slot)
    assert not [e for e in fake.log if e[0] == "sync"]


# -- the snapshotter on the device path ----------------------------------------------------------------
BAFT = CheckpointConfig(strategy="baft")


def make_state(seed: int, device: str = "cpu") -> TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).to(device)
    return TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2))


def test_the_snapshotter_seals_a_version_once_its_device_copies_completed(tmp_path: Path) -> None:
    """The wiring, with the simulated device: the copies go to the copy stream, the seal waits for them,
    the optimizer step (a kernel) runs after them, and close seals what is still in flight."""
    st = make_state(0)
    fake = FakeStreams()
    seen: list[tuple[str, dict[str, Any]]] = []
    unsub = events.subscribe(lambda k, f: seen.append((k, f)))
    snap = BubbleSnapshotter(st, BAFT, tmp_path, rank=0)
    snap.device = device = DeviceCopies(fake)
    device.attach(snap.profiler, snap.buffer)
    expected: dict[int, dict[str, Any]] = {}
    try:
        for i in range(5):
            v = st.step
            snap.begin(v)
            expected[v] = digest_components(st.capture())
            with snap.profiler.waiting():  # a pipeline wait: a moment to issue and to seal
                pass
            st.optimizer.zero_grad()
            st.model(torch.randn(4, 64)).pow(2).mean().backward()
            snap.seal()
            assert v not in snap.sealed_versions()  # issued on the copy stream, not copied yet
            fake.kernel("compute", f"optimizer{v}", st.optimizer.step)
            if i < 4:
                fake.drain()  # the device runs: the copies, then (it waits for them) the step
                st.step += 1
                snap.end()
                assert v in snap.sealed_versions() and snap.last_sealed == v
                assert digest_components(snap.read_version(v)) == expected[v]
        assert device.path == "registered" and len(fake.registered) == SLOTS
        assert [e for e in fake.log if e[0] == "copy"]
    finally:
        snap.close()  # version 4 is still in flight: sealed first (a host wait on the copy stream)
        unsub()
    assert fake.registered == {}
    assert [f["step"] for k, f in seen if k == "snapshot"] == list(range(5))
    fresh = make_state(1)
    other = BubbleSnapshotter(fresh, BAFT, tmp_path, rank=0)
    try:
        assert other.restore() == 4
    finally:
        other.close()
    assert digest_components(fresh.capture()) == expected[4]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_cuda_path_snapshots_bit_for_bit_without_synchronising_training(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    st = make_state(0, "cuda")
    synced: list[str] = []
    real_sync = torch.cuda.Stream.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: synced.append("device"))
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", lambda self: synced.append("stream"))
    snap = BubbleSnapshotter(st, BAFT, tmp_path, rank=0)
    expected: dict[int, dict[str, Any]] = {}
    try:
        for _ in range(6):
            v = st.step
            snap.begin(v)
            expected[v] = {k: t.detach().to("cpu", copy=True) for k, t in st.model.state_dict().items()}
            st.optimizer.zero_grad()
            st.model(torch.randn(4, 64, device="cuda")).pow(2).mean().backward()
            snap.seal()
            st.optimizer.step()
            st.step += 1
            snap.end()
        assert snap.device is not None and snap.device.path in ("registered", "staging")
        assert synced == []  # neither the device nor a stream was synchronised by baft
    finally:
        snap.close()
        monkeypatch.setattr(torch.cuda.Stream, "synchronize", real_sync)
    assert snap.last_sealed == 5
    fresh = make_state(1)
    other = BubbleSnapshotter(fresh, BAFT, tmp_path, rank=0)
    try:
        assert other.restore() == 5
    finally:
        other.close()
    for k, t in fresh.model.state_dict().items():
        assert torch.equal(t.view(torch.uint8), expected[5][k].view(torch.uint8)), k  # bit for bit


def test_the_copier_thread_issues_inside_the_window_and_ends_its_batch() -> None:
    import time

    fake = FakeStreams()
    run = Run(6, fake, None)
    engine = CopyEngine("thread")
    try:
        copies = run.copies[0] = run.device.begin(0)
        engine.start(list(run.jobs[0]), sink=copies)
        engine.on_wait(True, 0)
        deadline = time.monotonic() + 5
        while (engine._queue or engine._busy or copies._unflushed) and time.monotonic() < deadline:
            time.sleep(0.001)
        engine.on_wait(False, 0)
        left, stats = engine.finish()
        engine.run_now(left)
        assert copies.issued == 6 and len(copies.dones) >= 1 and stats.window_seconds == 0.0
        run.device.defer(copies, lambda: run.seal(0))
        run.optimizer_step(0)
        run.device.close()
    finally:
        engine.close()
    assert run.sealed == [0]
