"""The background writer: one job in flight, failures surfaced, and a thread priority of its own."""
from __future__ import annotations

import os
import threading

import pytest

from baft.persist.background import OneInFlight


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.serial  # CI runs the rest at nice 19, where no thread can go lower
def test_the_writer_thread_runs_at_a_lower_priority_and_training_keeps_its_own() -> None:
    before = _nice()
    assert before + 5 <= 19, f"this test needs a nice value of at most 14 to see a change (found {before})"
    seen: list[int] = []
    w = OneInFlight("test-nice", nice=5)
    w.submit(lambda: seen.append(_nice()))
    w.close()
    assert seen == [min(19, before + 5)] and _nice() == before
    plain = OneInFlight("test-plain")
    plain.submit(lambda: seen.append(_nice()))
    plain.close()
    assert seen[-1] == before


def test_a_failed_job_surfaces_at_the_next_drain() -> None:
    w = OneInFlight("test-fail")
    w.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        w.drain()
    w.close()
