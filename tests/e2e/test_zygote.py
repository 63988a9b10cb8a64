"""The agent zygote: agents forked from one warm process look and end as agents started with exec."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.run.nodeenv import free_port
from harness.run.processes import TOKEN_VARIABLE, new_token, owned
from harness.run.zygote import Zygote

from .conftest import ROOT

pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def zygote() -> Zygote:
    z = Zygote([])  # nothing preloaded: these agents do not get as far as torch
    yield z
    z.close()


def _wait_for(cond, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_an_agent_shows_its_launch_in_proc_and_its_kill_comes_back_as_its_status(zygote: Zygote, tmp_path: Path) -> None:
    token = new_token()
    # torchrun waiting in its rendezvous for a second node that never comes: an agent that stays
    argv = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-conf", "is_host=1", "-m", "json.tool"]
    env = {**os.environ, TOKEN_VARIABLE: token, "BAFT_SPEC": str(tmp_path / "spec.json")}
    with open(tmp_path / "agent.log", "ab") as log:
        agent = zygote.spawn(argv, env, str(tmp_path), log)
    _wait_for(lambda: agent.pid in owned(token))  # what stop_owned and baft cleanup find it by
    cmdline = Path(f"/proc/{agent.pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[1:3] == [b"-m", b"harness.run.agent"] and b"json.tool" in cmdline
    environ = Path(f"/proc/{agent.pid}/environ").read_bytes().split(b"\0")
    assert f"BAFT_SPEC={tmp_path / 'spec.json'}".encode() in environ
    assert os.readlink(f"/proc/{agent.pid}/cwd") == str(tmp_path)
    assert os.getsid(agent.pid) == agent.pid  # a session of its own, as the launcher gives each agent
    assert agent.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        agent.wait(timeout=0.2)
    agent.kill()
    assert agent.wait(timeout=30) == -signal.SIGKILL


def test_an_agent_that_exits_reports_its_code_and_its_message(zygote: Zygote, tmp_path: Path) -> None:
    with open(tmp_path / "agent.log", "ab") as log:
        agent = zygote.spawn(["--preload"], dict(os.environ), str(tmp_path), log)
    assert agent.wait(timeout=30) == 1
    assert "--preload needs a module" in (tmp_path / "agent.log").read_text()


def test_the_zygote_ends_with_the_harness_that_started_it(tmp_path: Path) -> None:
    harness = subprocess.Popen([sys.executable, "-c", "import time; from harness.run.zygote import Zygote; "
                                "z = Zygote([]); print(z.process.pid, flush=True); time.sleep(120)"],
                               cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        pid = int(harness.stdout.readline())
        assert Path(f"/proc/{pid}").exists()
        harness.kill()  # SIGKILL: no atexit, no close; the kernel closes the connection
        harness.wait()
        _wait_for(lambda: not Path(f"/proc/{pid}").exists() or
                  Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", timeout=10)
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
