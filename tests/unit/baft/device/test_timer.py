"""Bubbles timed on the device (baft.device.timer), one iteration late, with fake timing events."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baft.bubbles.profiler import BubbleProfiler, ProfilerConfig
from baft.device.timer import DeviceTimer


@dataclass(eq=False)
class Ev:
    id: int
    time: float | None = None  # set when the 'device' reaches it


class FakeTiming:
    """Timing events the test completes (gives times) when it chooses; every call logged."""

    def __init__(self) -> None:
        self.recorded: list[Ev] = []
        self.log: list[tuple[str, int]] = []

    def record(self) -> Ev:
        e = Ev(len(self.recorded))
        self.recorded.append(e)
        self.log.append(("record", e.id))
        return e

    def query(self, event: Ev) -> bool:
        self.log.append(("query", event.id))
        return event.time is not None

    def elapsed(self, start: Ev, end: Ev) -> float:
        assert start.time is not None and end.time is not None, "read before the device got there"
        self.log.append(("elapsed", end.id))
        return end.time - start.time

    def run_until(self, n: int, clock: list[float]) -> None:
        """The device reaches the first ``n`` events recorded (1 ms apart)."""
        for e in self.recorded[:n]:
            if e.time is None:
                clock[0] += 1e-3
                e.time = clock[0]


def iteration(timer: DeviceTimer, step: int, spans: list[str]) -> None:
    timer.begin_iteration(step)
    for i, kind in enumerate(spans):
        timer.stop(kind, i, timer.start())


@settings(max_examples=80, deadline=None)
@given(iterations=st.lists(st.lists(st.sampled_from(["forward", "wait", "backward", "optimizer"]), max_size=6),
                           min_size=1, max_size=8),
       lag=st.lists(st.integers(0, 12), min_size=1, max_size=8))
def test_spans_come_back_one_iteration_late_and_nothing_waits(iterations: list[list[str]], lag: list[int]) -> None:
    events = FakeTiming()
    timer = DeviceTimer(events)
    clock = [0.0]
    back: dict[int, int] = {}  # iteration -> the end_iteration call that returned it
    for k, spans in enumerate(iterations):
        iteration(timer, k, spans)
        # the device lags behind the host by a few events
        events.run_until(max(0, len(events.recorded) - lag[k % len(lag)]), clock)
        for prof in timer.end_iteration():
            assert prof.step not in back, "read back twice"
            assert prof.step < k, "read back in the iteration that recorded it"
            back[prof.step] = k
            recorded = iterations[prof.step]
            assert [(s.kind, s.index) for s in prof.spans] == list(zip(recorded, range(len(recorded))))
            assert all(0 <= s.start <= s.end <= prof.seconds for s in prof.spans)
    assert sorted(back) == list(range(len(back))), "in order, none skipped"
    for step, at in back.items():
        # read at the first end_iteration after its events completed, one iteration late at the earliest
        assert at >= step + 1
    assert all(kind != "sync" for kind, _ in events.log)
    # nothing was read before it completed (elapsed asserts it) and only completed events were read
    assert timer.behind == len(iterations) - len(back)


def test_a_lagging_iteration_is_read_when_its_events_complete() -> None:
    events = FakeTiming()
    timer = DeviceTimer(events)
    clock = [0.0]
    iteration(timer, 0, ["forward", "wait"])
    assert timer.end_iteration() == []  # never the iteration just closed
    iteration(timer, 1, ["forward"])
    assert timer.end_iteration() == []  # iteration 0 not complete on the device: not read, not waited for
    events.run_until(len(events.recorded), clock)
    iteration(timer, 2, [])
    got = timer.end_iteration()
    assert [p.step for p in got] == [0, 1]
    first = got[0]
    # origin at 1 ms, forward 2-3 ms, wait 4-5 ms, end at 6 ms
    assert [(s.kind, s.index) for s in first.spans] == [("forward", 0), ("wait", 1)]
    assert [(s.start, s.end) for s in first.spans] == [pytest.approx((1e-3, 2e-3)), pytest.approx((3e-3, 4e-3))]
    assert first.seconds == pytest.approx(5e-3) and first.idle == pytest.approx(1e-3)

def test_an_idle_device_still_gives_an_iteration_back_only_at_the_next_one() -> None:
    events = FakeTiming()
    clock = [0.0]
    real = events.record

    def record() -> Ev:  # the device is idle: each event completes as soon as it is recorded
        e = real()
        events.run_until(len(events.recorded), clock)
        return e

    events.record = record  # type: ignore[method-assign]
    timer = DeviceTimer(events)
    for k in range(3):
        iteration(timer, k, ["forward"])
        assert [p.step for p in timer.end_iteration()] == ([k - 1] if k else [])


class Stage:
    def forward_one_chunk(self, mb: int, *args: Any) -> str:
        return f"f{mb}"

    def backward_one_chunk(self, mb: int, *args: Any) -> str:
        return f"b{mb}"


class Opt:
    def __init__(self) -> None:
        self.pre: list[Any] = []
        self.post: list[Any] = []

    def register_step_pre_hook(self, fn: Any) -> Any:
        self.pre.append(fn)
        return _Handle()

    def register_step_post_hook(self, fn: Any) -> Any:
        self.post.append(fn)
        return _Handle()

    def step(self) -> None:
        for fn in self.pre:
            fn(self, (), {})
        for fn in self.post:
            fn(self, (), {})


class _Handle:
    def remove(self) -> None:
        pass


def test_the_profiler_takes_its_profiles_from_the_device_one_iteration_late() -> None:
    host = [0.0]
    prof = BubbleProfiler(ProfilerConfig(warmup=1), clock=lambda: host[0])
    stage, opt = Stage(), Opt()
    prof.attach(stage)
    prof.attach_optimizer(opt)
    events = FakeTiming()
    heard: list[tuple[bool, int]] = []
    prof.listeners.append(lambda entering, w: heard.append((entering, w)))
    try:
        prof.use_device(DeviceTimer(events))
        clock = [0.0]
        for k in range(3):
            prof.begin_iteration(k)
            assert stage.forward_one_chunk(0) == "f0"
            with prof.waiting():
                host[0] += 1.0  # the host's clock moves: it must not show up in the profile
            assert stage.backward_one_chunk(0) == "b0"
            opt.step()
            out = prof.end_iteration()
            if k == 0:
                assert out.step == -1 and prof.history == [] and prof.drift() is None
            else:
                assert out.step == k - 1
                assert [(s.kind, s.index) for s in out.spans] == [("forward", 0), ("wait", 0), ("backward", 0),
                                                                   ("optimizer", 0)]
                assert all(abs(d - 1e-3) < 1e-12 for d in out.windows)  # the device's time, not the host's 1 s
                assert prof.history[-1] is out
            events.run_until(len(events.recorded), clock)  # the device catches up after the host moved on
        assert heard == [(True, 0), (False, 0)] * 3
        assert prof.drift() == "initial profile"
    finally:
        prof.detach()
