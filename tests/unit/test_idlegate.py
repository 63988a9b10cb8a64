"""The persister's gate (``baft.bubbles.idlegate``): open exactly while the training thread waits in a long enough window
or waits for the persister itself; a pass never waits past its bound, and never at all without long windows."""
from __future__ import annotations

import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from baft.bubbles.idlegate import IdleGate

LONG, SHORT = 0.004, 0.0005


class Recorded(threading.Event):
    """The gate's event, remembering each wait of a pass: (the timeout it was given, woken: True, or timed
    out: False), so a test reads which way a pass ended instead of timing it."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[tuple[float | None, bool]] = []
        self.entered = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.entered.set()
        woken = super().wait(timeout)
        self.waits.append((timeout, woken))
        return woken


def recorded(gate: IdleGate) -> Recorded:
    event = Recorded()
    gate._open = event
    return event


def test_a_pass_waits_for_a_long_window_and_goes_when_it_opens() -> None:
    gate = IdleGate(0.002, lambda: [SHORT, LONG])
    opened = recorded(gate)
    passed: list[float] = []
    t = threading.Thread(target=lambda: passed.append(gate.wait(5.0)))
    t.start()
    assert opened.entered.wait(5.0)  # the pass sleeps on the gate (the 5 s only keep a broken gate from hanging)
    gate.listener(True, 0)  # a short wait: stays shut
    assert not opened.is_set()
    gate.listener(False, 0)
    gate.listener(True, 1)  # the long one
    t.join(5)
    assert passed and opened.waits == [(5.0, True)]  # woken by the window, not at its timeout
    assert gate.wait() == 0.0  # still inside it: the next step goes at once
    gate.listener(False, 1)
    waited = gate.wait(0.05)
    assert opened.waits[-1] == (0.05, False)  # outside again: the pass ended at its timeout
    assert gate.waited == passed[0] + waited  # the passes' waits add up


def test_no_long_window_no_wait() -> None:
    for expected in (None, [], [SHORT, SHORT]):
        assert IdleGate(0.002, lambda e=expected: e).wait(1.0) == 0.0
    assert IdleGate(-1.0, lambda: [LONG]).wait(1.0) == 0.0  # persist_window_ms: 0, no gate


def test_held_open_while_training_waits_for_the_persister_then_shut() -> None:
    gate = IdleGate(0.002, lambda: [LONG])
    with gate.held_open():
        assert gate.wait(1.0) == 0.0
        gate.listener(True, 0)
        gate.listener(False, 0)  # a window ending inside a drain does not shut it
        assert gate.wait(1.0) == 0.0
    opened = recorded(gate)
    gate.wait(0.02)
    assert opened.waits == [(0.02, False)]  # shut again after the drain (training computes): it waited


Event = st.one_of(st.tuples(st.just("enter"), st.integers(0, 3)), st.just(("exit", 0)),
                  st.just(("hold", 0)), st.just(("release", 0)))


@settings(max_examples=200, deadline=None)
@given(windows=st.lists(st.sampled_from([SHORT, LONG]), min_size=4, max_size=4), events=st.lists(Event, max_size=30))
def test_open_exactly_inside_a_long_window_or_while_held(windows: list[float], events: list[tuple[str, int]]) -> None:
    gate = IdleGate(0.002, lambda: windows)
    held: list[object] = []
    inside: int | None = None  # the window the training thread is in (waits do not nest)
    for kind, w in events:
        if kind == "enter" and inside is None:
            gate.listener(True, w)
            inside = w
        elif kind == "exit" and inside is not None:
            gate.listener(False, inside)
            inside = None
        elif kind == "hold":
            cm = gate.held_open()
            cm.__enter__()
            held.append(cm)
        elif kind == "release" and held:
            held.pop().__exit__(None, None, None)  # type: ignore[attr-defined]
        in_long = inside is not None and windows[inside] >= 0.002
        assert gate._open.is_set() == (bool(held) or in_long), (kind, w, inside, len(held))


def test_a_pass_never_waits_past_the_persists_deadline() -> None:
    gate = IdleGate(0.002, lambda: [LONG])
    opened = recorded(gate)
    assert gate.wait(5.0, until=time.perf_counter() - 1) == 0.0 and opened.waits == []  # already late: go now
    gate.wait(5.0, until=time.perf_counter() + 0.05)
    ((timeout, woken),) = opened.waits
    assert timeout is not None and timeout <= 0.05 and not woken  # slept until the deadline, not the 5 s
