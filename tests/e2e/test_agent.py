"""harness.run.agent end to end: real torchrun agents whose workers are forked from a warm server."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.run.nodeenv import free_port, worker_env

from .conftest import ROOT

pytestmark = [pytest.mark.e2e]

WORKER = """
import json, os, signal, sys, time
import torch.distributed as dist
from injectors.process import agent_of, workers_of

def main():
    dist.init_process_group("gloo")
    dist.barrier()  # both workers of this attempt are up
    me = os.getpid()
    agent = agent_of(me)
    record = {"rank": dist.get_rank(), "attempt": int(os.environ["TORCHELASTIC_RESTART_COUNT"]), "pid": me,
              "parent": os.getppid(), "agent": agent, "workers": sorted(p for p, _ in workers_of(agent)),
              "parent_name": open(f"/proc/{os.getppid()}/comm").read().strip()}
    with open(os.environ["OUT"], "a") as f:
        f.write(json.dumps(record) + "\\n")
    dist.barrier()
    if record["attempt"] == 0 and record["rank"] == 1:
        os.kill(me, signal.SIGKILL)  # the first attempt fails: torchrun restarts both
    dist.barrier()
    dist.destroy_process_group()
    return int(os.environ.get("EXIT", "0"))

if __name__ == "__main__":
    sys.exit(main())
"""


def _agent(tmp_path: Path, *, restarts: int, exit_code: int = 0) -> tuple[subprocess.Popen, str, list[dict]]:
    (tmp_path / "warmworker.py").write_text(WORKER)
    out = tmp_path / "records.jsonl"
    env = {**worker_env(0), "OUT": str(out), "EXIT": str(exit_code),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    cmd = [sys.executable, "-m", "harness.run.agent", "--preload", "warmworker", "--nnodes", "1",
           "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
           "--rdzv-conf", "is_host=1", "--max-restarts", str(restarts), "--monitor-interval", "0.2",
           "-m", "warmworker"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    log, _ = proc.communicate(timeout=240)
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.is_file() else []
    return proc, log, records


def test_workers_fork_from_one_warm_server_and_are_restarted(tmp_path: Path) -> None:
    proc, log, records = _agent(tmp_path, restarts=1)
    assert proc.returncode == 0, log
    assert sorted((r["attempt"], r["rank"]) for r in records) == [(0, 0), (0, 1), (1, 0), (1, 1)], log
    # Every worker of both attempts is the child of one fork server, itself the agent's child.
    servers = {r["parent"] for r in records}
    assert len(servers) == 1 and servers != {proc.pid}
    assert all(r["parent_name"] == "baft-forkserver" for r in records)
    # The injectors find the agent through the server, and the workers without it.
    assert {r["agent"] for r in records} == {proc.pid}
    for attempt in (0, 1):
        pids = sorted(r["pid"] for r in records if r["attempt"] == attempt)
        assert all(r["workers"] == pids for r in records if r["attempt"] == attempt), records
    assert "SIGKILL" in log or "exitcode: -9" in log or "failed (exitcode" in log, log


def test_a_failed_job_is_the_agents_exit_code(tmp_path: Path) -> None:
    proc, log, records = _agent(tmp_path, restarts=0, exit_code=0)
    assert proc.returncode == 1 and "ChildFailedError" in log, log  # no restart left after the kill
    assert {r["attempt"] for r in records} == {0}
