"""Run a script as the ranks of one real gloo job (``RANK``/``WORLD_SIZE``/``MASTER_*`` in the environment),
for the unit tests of checkpoint decisions that only show with more than one process.

Each rank is a process of its own, started by :mod:`multiprocessing`'s fork server: one server per pytest
process imports torch, DCP, DTensor and baft once (about 5 s of CPU here), and every rank after that is a
fork of it, a fresh process that runs the script as ``python -c SCRIPT ARGS`` would (``__main__``,
``sys.argv``, the rank's environment, its own exit code) without importing torch again."""
from __future__ import annotations

import json
import multiprocessing
import os
import sys
import tempfile
import traceback
from pathlib import Path

from harness.run.nodeenv import free_port

ROOT = Path(__file__).resolve().parents[1]

#: What the fork server imports once: what the ranks' scripts import.
PRELOAD = ["torch", "torch.distributed.checkpoint", "torch.distributed.tensor", "torch.distributed.fsdp",
           "numpy", "baft", "baft.strategies", "tests.rank_step"]

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(PRELOAD)


def _rank_main(script: str, args: list[str], env: dict[str, str], log: str) -> None:
    """In the forked rank: its output to ``log``, its environment, then the script as ``__main__``."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # The server's sys.stdout need not write to fd 1 (a server forked from a pytest process has pytest's
    # captured streams): the rank's own streams on its log.
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.update(env)
    import torch
    torch.set_num_threads(1)  # as OMP_NUM_THREADS=1 would: two ranks share the cores with other tests
    sys.argv = ["-c", *args]
    try:
        exec(compile(script, "<rank script>", "exec"), {"__name__": "__main__"})
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        raise SystemExit(1)


def run_ranks(script: str, *args: str, world: int = 2, timeout: float = 120) -> list[tuple[int | None, str]]:
    """``python -c script args`` once per rank; each rank's exit code and output. A rank still running
    after ``timeout`` (e.g. waiting in a collective nobody else joined) is killed: its code is then -9."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="gloo-ranks-") as logs:
        procs = []
        try:
            for rank in range(world):
                env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"}
                p = _CONTEXT.Process(target=_rank_main, args=(script, list(args), env, f"{logs}/{rank}.log"),
                                     name=f"gloo-rank{rank}")
                p.start()
                procs.append(p)
            results = []
            for rank, p in enumerate(procs):
                p.join(timeout)
                killed = p.exitcode is None
                if killed:
                    p.kill()
                    p.join()
                out = Path(f"{logs}/{rank}.log").read_text(errors="replace")
                results.append((p.exitcode, out + ("\n(killed after the timeout)" if killed else "")))
            return results
        finally:
            for p in procs:
                if p.exitcode is None:
                    p.kill()
                    p.join()


def run_phase(script: str, out: Path, phase: str, *args: str, world: int) -> dict[int, dict]:
    """One phase of a multi-phase rank test: ``script OUT PHASE ARGS`` on ``world`` ranks, each of which must
    exit 0 having written ``OUT/PHASE-RANK.json``; those files, by rank."""
    results = run_ranks(script, str(out), phase, *args, world=world)
    assert all(code == 0 for code, _ in results), [text for _, text in results]
    return {r: json.loads((out / f"{phase}-{r}.json").read_text()) for r in range(world)}
