"""Stopping a launch's processes: nothing they made is left behind in /dev/shm."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from harness.run.processes import TOKEN_VARIABLE, new_token, owned, stop_owned

#: A process of a launch that made a multiprocessing semaphore (spawn context: registered with the resource
#: tracker, which unlinks it once its processes are gone) and ignores SIGTERM, so only the SIGKILL stops it.
HOLDER = """
import multiprocessing, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
lock = multiprocessing.get_context("spawn").Lock()
print(lock._semlock.name, flush=True)
time.sleep(600)
"""


def test_the_resource_tracker_outlives_its_processes_and_unlinks_their_semaphores() -> None:
    """A fresh-clone CI run left 18 /dev/shm/sem.mp-* behind: the tracker was SIGKILLed with its processes."""
    token = new_token()
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], env={**os.environ, TOKEN_VARIABLE: token},
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        name = proc.stdout.readline().strip()
        sem = Path("/dev/shm") / ("sem." + name.lstrip("/"))
        assert sem.exists()
        deadline = time.monotonic() + 30
        while len(owned(token)) < 2 and time.monotonic() < deadline:  # the holder and its tracker
            time.sleep(0.05)
        assert len(owned(token)) == 2
        killed = stop_owned(token, grace=0.5)
        assert proc.pid in killed
        assert not owned(token) and not sem.exists()
    finally:
        proc.kill()
        proc.wait()
