"""Run a script as the ranks of one real gloo job (``RANK``/``WORLD_SIZE``/``MASTER_*`` in the environment),
for the unit tests of checkpoint decisions that only show with more than one process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.run.nodeenv import free_port

ROOT = Path(__file__).resolve().parents[1]


def run_ranks(script: str, *args: str, world: int = 2, timeout: float = 120) -> list[tuple[int | None, str]]:
    """``python -c script args`` once per rank; each rank's exit code and output. A rank still running
    after ``timeout`` (e.g. waiting in a collective nobody else joined) is killed: its code is then -9."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-c", script, *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = []
    try:
        for p in procs:
            try:
                out = p.communicate(timeout=timeout)[0]
            except subprocess.TimeoutExpired:
                p.kill()
                out = p.communicate()[0] + "\n(killed after the timeout)"
            results.append((p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return results
