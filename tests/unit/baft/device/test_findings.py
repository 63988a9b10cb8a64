"""What a read of the device path found before its first GPU run (issue 53), each on this CPU, each failing on
the code before its fix: on the simulated device of :mod:`tests.fakes.streams` (copies complete some time after
they were issued, registration can be refused, a copy from pageable memory makes the host wait), and against a
stand-in of ``torch.cuda`` where the bug is in how baft calls CUDA itself."""
from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from baft import Checkpointer, TrainState, events
from baft.device import streams as device_streams
from baft.device.restore import restore_into
from baft.device.streams import CudaStreams
from baft.errors import BaftError
from baft.state.fingerprint import digest_components

from harness.bench import devicecheck as dc
from tests.fakes.streams import FakeStreams, simulated_device

BULK = ("model", "optimizer")


def _checkpointer(root: Path) -> tuple[Checkpointer, Any, TrainState]:
    shape = dc.shape_for(0.001, "cpu")
    model = dc._model(shape, torch.device("cpu"), 0)
    state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-4))
    stage = dc._Stage(model, shape, torch.device("cpu"), {})
    ckpt = Checkpointer(dc._config(root, "baft"), state)
    ckpt.attach(stage)
    return ckpt, stage, state


def test_drain_waits_for_the_seal_of_the_version_in_flight_and_its_copies_are_timed_on_the_device() -> None:
    """The device check read a version right after ``drain()``: on a device the version is sealed only once
    its copies completed, and drain waited for the persister alone ("version N is no longer in shared
    memory"). And the copies' seconds came from nowhere on the device path (the rate was always None)."""
    snaps: list[dict[str, Any]] = []
    unsubscribe = events.subscribe(lambda kind, f: snaps.append(dict(f)) if kind == "snapshot" else None)
    try:
        with simulated_device(latency=60.0) as made, tempfile.TemporaryDirectory() as tmp:  # never done by itself
            ckpt, stage, state = _checkpointer(Path(tmp))
            try:
                for _ in range(5):
                    dc._step(ckpt, stage, state)
                assert made and ckpt.strategy.snap.device is not None  # the device path, on the simulated device
                assert dc._snapshot_exact(ckpt, stage, state)
            finally:
                ckpt.close()
    finally:
        unsubscribe()
    assert snaps
    assert all(s["copy_seconds"] + s["stall_seconds"] > 0 for s in snaps), snaps  # device time, per batch


def _trained(seed: int) -> TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2))
    for i in range(2):
        model(torch.randn(3, 8, generator=torch.Generator().manual_seed(i))).pow(2).mean().backward()
        state.optimizer.step()
        state.optimizer.zero_grad()
        state.step += 1
    return state


def _slot_like(state: TrainState) -> tuple[dict[str, Any], torch.Tensor]:
    """The state's components as views of one host buffer, as a slot's are."""
    flat = [t for t in (*state.model.state_dict().values(),
                        *(v for per in state.optimizer.state_dict()["state"].values() for v in per.values()))
            if t.dim() > 0]
    buf = torch.empty(sum(t.numel() * t.element_size() for t in flat), dtype=torch.uint8)
    comps = state.capture()
    offset = 0

    def view(t: Any) -> Any:
        nonlocal offset
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            return t
        n = t.numel() * t.element_size()
        v = buf[offset : offset + n].view(t.dtype).view(t.shape)
        v.copy_(t)
        offset += n
        return v

    def walk(tree: Any) -> Any:
        return {k: walk(v) for k, v in tree.items()} if isinstance(tree, dict) else view(tree)

    return {k: (walk(v) if k in BULK else v) for k, v in comps.items()}, buf


@pytest.mark.parametrize("refuse", [False, True])
def test_a_restore_copies_from_page_locked_memory_only(refuse: bool) -> None:
    """A host-to-device copy from pageable memory is not asynchronous: the host waits for it. The slot's memory
    is registered for the restore (or, refused, staged through pinned buffers), never copied from as it is."""
    source = _trained(0)
    want = digest_components(source.capture(only=BULK))
    components, _buf = _slot_like(source)
    target = _trained(1)
    fake = FakeStreams(strict_pinned=True, refuse_register=refuse)
    # the host: the slot and the pinned buffers; the device: the target's tensors (Adam's made by the restore)
    fake.device_tensors = lambda t: not _in(t, _buf) and not fake.page_locked(t)
    flight = restore_into(target, components, fake)
    assert flight is not None and flight.path == ("staging" if refuse else "registered")
    assert [e for e in fake.log if e[0] == "pageable"] == []
    assert digest_components(target.capture(only=BULK)) == want
    assert fake.registered == {}  # released once the copies completed


def _in(t: torch.Tensor, buf: torch.Tensor) -> bool:
    start = buf.data_ptr()
    return start <= t.data_ptr() < start + buf.numel()


# -- a stand-in of torch.cuda, for how CudaStreams calls CUDA ------------------------------------------------
class _Cudart:
    """``torch.cuda.cudart()`` as torch 2.11 and 2.13 bind it: no ``cudaGetLastError``. A refused registration
    leaves its error as the last one, which the next launch check would raise."""

    def __init__(self, refuse: bool) -> None:
        self.refuse, self.calls, self.last_error = refuse, 0, 0

    def cudaHostRegister(self, ptr: int, nbytes: int, flags: int) -> int:  # noqa: N802 (CUDA's name)
        self.calls += 1
        if self.refuse:
            self.last_error = 712  # cudaErrorHostMemoryAlreadyRegistered, say
            return 712
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
        return 0


@contextlib.contextmanager
def _fake_cuda(monkeypatch: pytest.MonkeyPatch, cudart: Any = None) -> Iterator[dict[str, Any]]:
    """torch.cuda's calls that CudaStreams makes, recording each thread's current device (CUDA's default: 0;
    a thread that uses a device it never chose makes a context on device 0)."""
    seen: dict[str, Any] = {"contexts": set(), "set": []}
    local = threading.local()

    def current() -> int:
        return getattr(local, "device", 0)

    def set_device(d: Any) -> None:
        local.device = torch.device(d).index if not isinstance(d, int) else d
        seen["set"].append((threading.current_thread().name, local.device))

    def used() -> None:
        seen["contexts"].add(current())

    class Stream:
        def __init__(self, device: Any = None) -> None:
            used()

        def wait_event(self, event: Any) -> None:
            used()

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            pass

        def record(self, stream: Any = None) -> None:
            used()

        def query(self) -> bool:
            used()
            return True

    @contextlib.contextmanager
    def stream(s: Any) -> Iterator[None]:
        used()
        yield

    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "current_device", current)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: used() or Stream())
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    yield seen


def test_a_copier_thread_uses_the_ranks_device_not_device_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """``copier: thread`` issued copies from a thread that never chose a device: CUDA's default, device 0, for
    a rank on another GPU (a context and memory on someone else's GPU)."""
    with _fake_cuda(monkeypatch) as seen:
        streams = CudaStreams(torch.device("cuda", 3))

        def copier() -> None:
            s = streams.side()
            streams.record(s)
            streams.copy(s, torch.zeros(4), torch.ones(4))

        t = threading.Thread(target=copier, name="baft-copier")
        t.start()
        t.join()
    assert seen["contexts"] == {3}, seen
    assert ("baft-copier", 3) in seen["set"]


def test_a_refused_registration_leaves_no_error_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's cudart binding has no ``cudaGetLastError``: a refused ``cudaHostRegister`` left its error for
    torch's next check to raise. The runtime's own ``cudaGetLastError`` clears it; without it, registration is
    not tried at all (the staging ring instead)."""
    cudart = _Cudart(refuse=True)
    with _fake_cuda(monkeypatch, cudart):
        monkeypatch.setattr(device_streams, "_loaded_libcudart", lambda: None)
        assert CudaStreams(torch.device("cuda", 0)).register(0x1000, 4096) is False
        assert cudart.calls == 0 and cudart.last_error == 0  # not tried: nothing could clear a refusal

        def clear() -> int:
            err, cudart.last_error = cudart.last_error, 0
            return err

        monkeypatch.setattr(device_streams, "_error_clearer", lambda _cudart: clear)
        assert CudaStreams(torch.device("cuda", 0)).register(0x1000, 4096) is False
        assert cudart.calls == 1 and cudart.last_error == 0  # tried, refused, cleared
        cudart.refuse = True
        ok = _Cudart(refuse=False)
        monkeypatch.setattr(torch.cuda, "cudart", lambda: ok)
        assert CudaStreams(torch.device("cuda", 0)).register(0x1000, 4096) is True


def test_cuda_rng_states_restore_into_a_process_that_sees_fewer_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Saved where a rank saw 8 GPUs (its own current: 5), restored where it sees one (CUDA_VISIBLE_DEVICES):
    ``set_rng_state_all`` indexed devices it does not have (IndexError). Its own device's state goes to the
    device it has; where the counts agree, each device gets its own."""
    from baft.state.train import rng_state, set_rng_state

    restored: dict[int, torch.Tensor] = {}

    def set_state(state: torch.Tensor, device: int | str | torch.device = "cuda") -> None:
        index = device if isinstance(device, int) else torch.device(device).index or 0
        if index >= torch.cuda.device_count():
            raise IndexError(f"device {index} of {torch.cuda.device_count()}")
        restored[index] = state

    host = rng_state()
    saved = {**host, "cuda": {str(i): torch.full((4,), i, dtype=torch.uint8) for i in range(8)}, "cuda_current": 5}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_state)
    set_rng_state(saved)
    assert list(restored) == [0] and restored[0].tolist() == [5] * 4
    restored.clear()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    set_rng_state(saved)
    assert {i: t[0].item() for i, t in restored.items()} == {i: i for i in range(8)}


# -- the private pipelining hooks, guarded by version --------------------------------------------------------
def test_the_profiler_refuses_a_torch_whose_pipelining_it_cannot_hook() -> None:
    """The profiler wraps a private helper of torch.distributed.pipelining: a release without it, or whose
    schedules no longer call it, would leave every wait unseen (no bubble, no error). It says so."""
    import types

    from torch.distributed.pipelining import schedules

    from baft.bubbles.profiler import check_pipelining

    check_pipelining(schedules)  # this torch: supported
    without = types.SimpleNamespace(**{k: v for k, v in vars(schedules).items() if k != "_wait_batch_p2p"})
    with pytest.raises(BaftError, match="lacks"):
        check_pipelining(without)

    class Schedule:
        def _step_microbatches(self) -> None:
            pass

    unused = types.SimpleNamespace(_wait_batch_p2p=lambda work: None, Schedule=Schedule)
    with pytest.raises(BaftError, match="no schedule calls"):
        check_pipelining(unused)


# -- on a GPU (scripts/device-check runs these on a lent machine) ---------------------------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_a_refused_registration_on_cuda_leaves_the_next_launch_clean() -> None:
    """The same memory registered twice: CUDA refuses the second, and the next kernel launch and synchronise
    must not raise that refusal as their own."""
    streams = CudaStreams(torch.device("cuda", torch.cuda.current_device()))
    buf = torch.empty(1 << 20, dtype=torch.uint8)
    registered = streams.register(buf.data_ptr(), buf.numel())
    try:
        assert streams.register(buf.data_ptr(), buf.numel()) is False
        x = torch.ones(1024, device="cuda") * 2  # a launch: torch checks the last error here
        torch.cuda.synchronize()
        assert x.sum().item() == 2048
    finally:
        if registered:
            streams.unregister(buf.data_ptr())


@pytest.mark.gpu
@needs_cuda
def test_a_cuda_restore_is_bit_for_bit_from_registered_memory() -> None:
    state = _trained(0)
    want = digest_components(state.capture(only=BULK))
    components, _buf = _slot_like(state)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).cuda()
    target = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2))
    flight = restore_into(target, components)
    assert flight is not None and flight.path in ("registered", "staging")
    def host(tree: Any) -> Any:
        if isinstance(tree, dict):
            return {k: host(v) for k, v in tree.items()}
        return tree.cpu() if isinstance(tree, torch.Tensor) else tree

    assert digest_components(host(target.capture(only=BULK))) == want
