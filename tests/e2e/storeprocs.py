"""Two real node-store processes on loopback, as the harness starts them, for the tests that watch what stores do
to the machine (their CPU, their scheduling group)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from baft.store.config import ReplicationConfig
from baft.store.wire import SECRET_VARIABLE, new_secret
from baft.store.wire import request as ask

from harness.run.nodeenv import free_port


@contextlib.contextmanager
def two_stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, priority: str, name: str,
               own_sessions: bool = False) -> Iterator[tuple[list[subprocess.Popen], list[str], Path]]:
    """Two stores at ``priority`` (``own_sessions``: each leading its session, as the harness starts them),
    journaling to ``tmp_path/storeN.jsonl``, answering pings; (processes, addresses, their shared-memory base).
    Stopped and their files removed after."""
    monkeypatch.setenv(SECRET_VARIABLE, new_secret())
    base = Path("/dev/shm") / f"baft-test-{name}-{os.getpid()}-{tmp_path.name}"
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "baft.store", "--root", str(base / f"node{n}"), "--node", str(n),
                               "--addresses", ",".join(addresses), "--journal", str(tmp_path / f"store{n}.jsonl"),
                               "--replication", ReplicationConfig(priority=priority).to_json()],
                              env=dict(os.environ), start_new_session=own_sessions)
             for n in range(2)]
    try:
        for a in addresses:
            deadline = time.monotonic() + 30
            while True:
                try:
                    ask(a, {"op": "ping"}, timeout=1)
                    break
                except OSError:
                    assert time.monotonic() < deadline, "the store did not start"
                    time.sleep(0.05)
        yield procs, addresses, base
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
        subprocess.run(["rm", "-rf", str(base)], check=False)
