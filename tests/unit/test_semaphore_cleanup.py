"""The e2e helper that removes the semaphores a killed pod's agent left keeps the ones live processes use:
a fresh semaphore is mapped by its creator under a temporary name, so it is matched by inode (matching names
removed a concurrent run's semaphores before its workers opened them: FileNotFoundError at their start)."""
from __future__ import annotations

import multiprocessing
import os

from tests.e2e.conftest import shm_semaphores, unlink_unmapped_semaphores


def test_a_semaphore_this_process_just_created_is_kept_and_a_leaked_one_goes() -> None:
    before = shm_semaphores()
    lock = multiprocessing.get_context("forkserver").Lock()  # a named POSIX semaphore, mapped here
    live = shm_semaphores() - before
    assert live, "multiprocessing made no named semaphore"
    leaked = "sem.mp-baft-test-leak"
    fd = os.open(os.path.join("/dev/shm", leaked), os.O_CREAT | os.O_WRONLY, 0o600)
    os.close(fd)  # a file nobody maps: what a SIGKILLed tracker leaves
    try:
        assert unlink_unmapped_semaphores(live | {leaked}) == [leaked]
        assert live <= shm_semaphores() and leaked not in shm_semaphores()
    finally:
        del lock
        if os.path.exists(os.path.join("/dev/shm", leaked)):
            os.unlink(os.path.join("/dev/shm", leaked))
