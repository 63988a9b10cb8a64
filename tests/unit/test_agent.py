"""harness.run.agent: torchrun's arguments for warm workers, and the exception text torch's formatter needs."""
from __future__ import annotations

import subprocess
import sys

import pytest

from harness.run.agent import PRELOAD, forked, split_preload


def test_leading_preload_pairs_are_the_agents_own() -> None:
    assert split_preload(["--preload", "a.b", "--preload", "c", "--nnodes", "1", "-m", "a.b", "x"]) == (
        ["a.b", "c"], ["--nnodes", "1", "-m", "a.b", "x"])
    # only leading pairs: a --preload later belongs to the worker's arguments
    assert split_preload(["--nnodes", "1", "s.py", "--preload", "x"]) == ([], ["--nnodes", "1", "s.py", "--preload", "x"])
    with pytest.raises(SystemExit, match="--preload needs a module"):
        split_preload(["--preload"])


def test_a_module_becomes_its_source_file_run_in_a_forked_worker() -> None:
    from torch.distributed.run import parse_args

    args = forked(parse_args(["--nnodes", "1", "--nproc-per-node", "2", "-m", "harness.worker.workload", "spec.json"]))
    assert args.start_method == "forkserver" and args.run_path and not args.module
    assert args.training_script.endswith("harness/worker/workload.py") and args.training_script_args == ["spec.json"]
    assert args.nproc_per_node == "2"  # everything else as torchrun parsed it
    with pytest.raises(SystemExit, match="no Python source for module 'no.such.module'"):
        forked(parse_args(["-m", "no.such.module"]))
    assert "torch" in PRELOAD


def test_a_script_is_refused_with_preload(capsys: pytest.CaptureFixture[str]) -> None:
    from multiprocessing import forkserver

    from harness.run.agent import main

    server = forkserver._forkserver._forkserver_pid
    with pytest.raises(SystemExit, match="a script runs under plain torchrun"):
        main(["--preload", "harness.worker.workload", "--nnodes", "1", "train.py"])
    # Refused before the fork server starts. Started first, it was a fork of this pytest process that
    # outlived the refusal and became every later forkserver Process's server here: the gloo ranks of
    # tests/gloo_ranks.py were forked from it, with pytest's captured sys.stdout, and their output was lost.
    assert forkserver._forkserver._forkserver_pid == server


LOG_A_FAILURE = """
import logging, sys
import torch.distributed.run  # torch attaches its handlers and formatter
if sys.argv[1] == "filtered":
    from harness.run.agent import ExceptionText
    for h in logging.getLogger("torch.distributed").handlers:
        h.addFilter(ExceptionText())
try:
    raise ValueError("boom")
except ValueError:
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").exception("failed (exitcode: 1)")
print("torch._dynamo" in sys.modules)
"""


@pytest.mark.parametrize("mode", ["plain", "filtered"])
def test_a_logged_exception_is_printed_without_importing_dynamo(mode: str) -> None:
    """torch's log formatter imports torch._dynamo (seconds) to format a record's exception; torchrun
    logs one when a forked worker fails. Rendered beforehand, the same text is printed without it."""
    proc = subprocess.run([sys.executable, "-c", LOG_A_FAILURE, mode], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "failed (exitcode: 1)" in proc.stderr and "ValueError: boom" in proc.stderr and "Traceback" in proc.stderr
    assert proc.stdout.strip() == ("True" if mode == "plain" else "False")


def test_a_free_port_is_outside_the_range_the_kernel_hands_out() -> None:
    """The rendezvous port is bound by the agent seconds after it was chosen; one from the ephemeral range
    was taken meanwhile by another run's connection in CI (EADDRINUSE)."""
    import socket

    from harness.run.nodeenv import _ephemeral, free_port

    ports = {free_port() for _ in range(20)}
    assert not ports & set(_ephemeral()) and len(ports) > 10
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free, as promised


def test_the_worker_stores_port_of_every_round_is_drawn_outside_the_ephemeral_range(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's own choice for rank 0's store (bind(0), then closed until the worker binds it) comes from the
    ephemeral range; a restart of the accelerate test once failed on it with EADDRINUSE."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import api

    from harness.run.agent import store_ports_outside_ephemeral
    from harness.run.nodeenv import _ephemeral

    monkeypatch.setattr(api, "get_free_port", api.get_free_port)  # put back after the test
    before = {api.RendezvousStoreInfo.build(0, dist.HashStore(), local_addr="127.0.0.1").master_port
              for _ in range(5)}
    assert before <= set(_ephemeral())  # what torchrun does by itself
    store_ports_outside_ephemeral()
    after = {api.RendezvousStoreInfo.build(0, dist.HashStore(), local_addr="127.0.0.1").master_port
             for _ in range(5)}
    assert not after & set(_ephemeral())


def test_an_error_file_cut_short_reads_as_none_and_does_not_end_the_job(tmp_path, monkeypatch) -> None:
    """A worker killed while it wrote its error file left it empty; torchrun's agent raised JSONDecodeError on it
    and the job ended instead of restarting (baft check, kill-during-restart on a script that fails to resume)."""
    import json as json_module

    from torch.distributed.elastic.multiprocessing import errors

    from harness.run.agent import tolerate_cut_error_files

    cut = tmp_path / "error.json"
    cut.write_text("")
    with pytest.raises(json_module.JSONDecodeError):
        errors.ProcessFailure(local_rank=0, pid=1, exitcode=-15, error_file=str(cut))
    monkeypatch.setattr(errors.ProcessFailure, "__post_init__", errors.ProcessFailure.__post_init__)
    tolerate_cut_error_files()
    failure = errors.ProcessFailure(local_rank=0, pid=1, exitcode=-15, error_file=str(cut))
    assert "Signal 15" in failure.message and (tmp_path / "error.json.cut").exists() and not cut.exists()
    good = tmp_path / "good.json"
    good.write_text(json_module.dumps({"message": {"message": "RuntimeError: boom", "extraInfo": {"timestamp": "1"}}}))
    assert "boom" in str(errors.ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(good)).message)
