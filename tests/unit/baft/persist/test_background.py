"""The background writer: one job in flight, failures surfaced, and a thread priority of its own."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

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


def test_close_finishes_the_job_in_flight_and_ends_the_thread() -> None:
    done = threading.Event()
    w = OneInFlight("test-close")
    w.submit(lambda: (threading.Event().wait(0.2), done.set()))
    w.close()
    assert done.is_set() and not any(t.name == "test-close" for t in threading.enumerate())


def test_a_process_that_dies_of_an_exception_does_not_wait_for_a_stuck_persist(tmp_path: Path) -> None:
    """Found in CI (elastic-restage, restart 64 s instead of ~7): a rank raised as its pipeline peer was lost,
    but its persist in flight waited in a collective for ranks that were gone (the group's timeout is 30
    minutes by default), and the interpreter's exit joined that thread: the failed rank stayed alive with its
    sockets open, its node's other rank waited on it, and only the harness's hang watchdog ended both."""
    script = tmp_path / "stuck.py"
    script.write_text(
        "import threading\n"
        "from baft.persist.background import OneInFlight\n"
        "w = OneInFlight('stuck-persist')\n"
        "w.submit(threading.Event().wait)  # a collective whose peers are gone: it never returns\n"
        "raise RuntimeError('Connection closed by peer')\n")
    try:  # a process held by its thread never exits: the 30 s only keep it from holding the test
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the process stayed alive behind its background thread")
    assert proc.returncode == 1 and "Connection closed by peer" in proc.stderr
