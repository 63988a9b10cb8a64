"""A node's torchrun agent whose workers start warm: forked from a server that has imported torch.

``python -m harness.run.agent --preload MODULE [TORCHRUN OPTIONS] -m MODULE ARGS...`` is stock
torchrun (its argument parser and ``run``: the same elastic agent, rendezvous, monitoring and
restarts) given ``--start-method forkserver --run-path FILE ARGS``, where FILE is MODULE's source
file. torchrun then starts each worker with :mod:`multiprocessing`'s fork server instead of a fresh
interpreter. The agent imports MODULE and :data:`PRELOAD` first, then forks the server from itself
(:func:`serve_forks_from_here`), so one import serves the agent, the server and every worker
(MODULE must do nothing but define things when imported). Without ``--preload`` it is
plain torchrun: how a user's own script runs, in a fresh interpreter, as the user's job runs it.

Why: on a small machine a worker spends most of its start importing torch (about 4 s of CPU here,
with pipelining and DCP), and every restart starts every worker of the node again. A forked worker
starts in a fraction of a second, at the first start and at each restart, since the server lives as
long as the agent. The worker is still a process of its own under torchrun, with its own rank
variables, process group and exit code; a signal, a crash or a kill ends it as before.

Until the fork the agent imports modules only: it has run no operator and started no thread, so
forking it is safe (no OpenMP pool, no CUDA context, no lock held by another thread is inherited).

Either way the agent leaves out the interpreter's teardown once torchrun is done, and renders a
logged exception before torch's formatter would import ``torch._dynamo`` for it (see
:class:`ExceptionText`). With :data:`JOURNAL_VARIABLE` set it journals every failure of its workers
that torchrun sees (:func:`journal_failures`), so a verdict can say why a job restarted.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import logging
import os
import socket
import sys
import traceback
from multiprocessing import connection, forkserver, resource_tracker, util
from pathlib import Path
from typing import Any

from baft.priority import CPU_GROUP_VARIABLE, join_cpu_group

from injectors.process import FORK_SERVER_NAME

#: The file (``journal/agent-node<N>.jsonl``) where the agent journals its workers' failures; set by the launcher.
JOURNAL_VARIABLE = "BAFT_AGENT_JOURNAL"

#: The harness's own code: never the frame a worker's failure is blamed on (its hooks wrap the job's calls).
HARNESS = str(Path(__file__).resolve().parents[1]) + os.sep

#: Imported by the fork server besides the modules named with ``--preload``: what a worker imports lazily.
PRELOAD = ("torch", "torch.distributed.pipelining", "torch.distributed.checkpoint", "numpy")


def split_preload(argv: list[str]) -> tuple[list[str], list[str]]:
    """The modules of the leading ``--preload MODULE`` pairs, and the rest (torchrun's arguments)."""
    preload, i = [], 0
    while i < len(argv) and argv[i] == "--preload":
        if i + 1 >= len(argv):
            raise SystemExit("harness.run.agent: --preload needs a module")
        preload.append(argv[i + 1])
        i += 2
    return preload, argv[i:]


def serve_forks_from_here(modules: list[str]) -> int:
    """Import ``modules`` here, then start :mod:`multiprocessing`'s fork server as a fork of this
    process (returns its pid): the agent and the server share one import of torch instead of
    making it twice (about 2.5 s of CPU per node and run here). Call it before anything starts a
    thread: the fork copies this process as it is, and so does every worker forked from the server."""
    for name in modules:
        importlib.import_module(name)
    server = forkserver._forkserver
    resource_tracker.ensure_running()  # what ForkServer.ensure_running does first
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]  # private, as below
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()  # every client holds the write end; the server ends at its EOF
        pid = os.fork()
        if pid == 0:  # the server: serves until the agent (and every worker) has gone
            code = 0
            try:
                os.close(alive_w)
                _name_this_process(FORK_SERVER_NAME)  # how the injectors tell it from the agent
                forkserver.main(listener.fileno(), alive_r, [])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0
            except BaseException:
                traceback.print_exc()
                code = 1
            os._exit(code)
        os.close(alive_r)
    # What ForkServer.ensure_running records of a server it spawned; it finds this one alive and uses it.
    server._forkserver_address = address  # type: ignore[attr-defined]
    server._forkserver_alive_fd = alive_w  # type: ignore[attr-defined]
    server._forkserver_pid = pid  # type: ignore[attr-defined]
    return pid


def _name_this_process(name: bytes) -> None:
    """Set this process's name (``/proc/self/comm``; ``prctl(PR_SET_NAME)``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0) != 0:  # 15: PR_SET_NAME
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NAME) failed")


def forked(args: argparse.Namespace) -> argparse.Namespace:
    """torchrun's parsed arguments for ``-m MODULE ARGS`` turned into ``--start-method forkserver
    --run-path FILE ARGS``, FILE being MODULE's source."""
    try:
        spec = importlib.util.find_spec(args.training_script)
    except ImportError:  # a parent package is missing
        spec = None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise SystemExit(f"harness.run.agent: no Python source for module {args.training_script!r}")
    return argparse.Namespace(**{**vars(args), "module": False, "run_path": True, "start_method": "forkserver",
                                 "training_script": spec.origin})


class ExceptionText(logging.Filter):
    """Renders a record's exception as text before torch's log formatter sees it.

    torch's formatter (``torch._logging._internal.TorchLogsFormatter``) imports ``torch._dynamo``
    the first time it formats a record with an exception, about 2 s here; torchrun logs one (with
    ``logger.exception``) when a worker started with a start method fails, so every first restart
    waited for that import. With the text already rendered the formatter prints it unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        return True


def failure_fields(failure: Any) -> dict[str, Any]:
    """What a ``worker_failed`` event says of one of torchrun's ``ProcessFailure``: the exit code, the
    signal that ended the worker (None for an exit), and the first line of the message with the innermost
    frame of the job's own code when the worker wrote an error file (torch's ``record`` does, for an
    uncaught exception)."""
    message = failure.message
    where: str | None = None
    if isinstance(message, dict):  # an error file: {"message": "Type: text", "extraInfo": {"py_callstack": ...}}
        stack = str(message.get("extraInfo", {}).get("py_callstack", ""))
        frames = [line.strip() for line in stack.splitlines() if line.strip().startswith("File ")]
        # the innermost frame of the job's own code (the line that called into a library), else the innermost
        own = [f for f in frames if not any(m in f for m in ("site-packages", "dist-packages", "<frozen", HARNESS))]
        where = (own or frames or [None])[-1]  # type: ignore[list-item]
        message = message.get("message", "")
    text = str(message).strip().splitlines()
    return {"exitcode": failure.exitcode, "signal": failure.signal_name() if failure.exitcode < 0 else None,
            "message": text[0][:500] if text else "", "where": where}


def journal_failures(path: str, node: str) -> None:
    """Journal each failure of this agent's workers as torchrun's monitor reports it (``worker_failed``:
    node, attempt, rank, local_rank, pid and :func:`failure_fields`), before torchrun restarts the
    group or gives up. ``attempt`` is the workers' ``TORCHELASTIC_RESTART_COUNT``."""
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    from analysis.journal import JournalWriter

    writer = JournalWriter(Path(path))
    monitor = LocalElasticAgent._monitor_workers

    def monitored(self: Any, worker_group: Any) -> Any:
        result = monitor(self, worker_group)
        if result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY):
            attempt = worker_group.spec.max_restarts - self._remaining_restarts
            for rank, failure in sorted(result.failures.items()):
                writer.write("worker_failed", sync=True, node=node, attempt=attempt, rank=rank,
                             local_rank=failure.local_rank, pid=failure.pid, **failure_fields(failure))
        return result

    LocalElasticAgent._monitor_workers = monitored  # type: ignore[method-assign]  # the journal's hook


def store_ports_outside_ephemeral() -> None:
    """Make torchrun draw the port of each round's worker store (rank 0's ``TCPStore``, a new one at
    every restart with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) with :func:`~harness.run.nodeenv.free_port`.

    torchrun takes it with ``bind(0)`` and closes the socket; rank 0 binds it only once its worker has
    started (seconds for a script: a fresh interpreter imports torch), and meanwhile the kernel may hand
    that ephemeral port to any outgoing connection: a restart then failed with EADDRINUSE ("The server
    socket has failed to listen on any local network address", seen once in 24 runs of the accelerate
    test, four at a time), and the job restarted once more than its faults explain."""
    from torch.distributed.elastic.rendezvous import api

    from harness.run.nodeenv import free_port

    api.get_free_port = free_port


def tolerate_cut_error_files() -> None:
    """Read a worker's error file that is empty or cut short as no error file.

    A worker killed while it writes its error file (a gloo error raised as its peer died, then the agent's
    SIGTERM) leaves it empty; torchrun's agent then raises ``JSONDecodeError`` reading it and the whole job
    ends instead of restarting (seen by ``baft check``'s kill-during-restart case). The file is renamed aside
    (``.cut``), and the failure is read as a worker that left none."""
    from torch.distributed.elastic.multiprocessing import errors

    original = errors.ProcessFailure.__post_init__

    def post_init(self: Any) -> None:
        path = self.error_file
        if path and os.path.isfile(path):
            try:
                with open(path) as f:
                    json.load(f)
            except ValueError:
                os.replace(path, path + ".cut")
        original(self)

    errors.ProcessFailure.__post_init__ = post_init  # type: ignore[method-assign]


def join_node_group() -> str:
    """Join the node's CPU group the launcher named (:mod:`harness.run.cpugroups`), and take its name out of the
    environment: a process the ranks start (a writer, a floor replicator) applying a priority must not take the
    node's group for its own (at ``lowest`` it would mark the ranks' group idle). '' or why not (then the
    autogroups decide)."""
    path = os.environ.pop(CPU_GROUP_VARIABLE, "")
    return join_cpu_group(path) if path else "no group named"


def main(argv: list[str] | None = None) -> int:
    join_node_group()  # first: every process it starts is then in the node's group too
    preload, rest = split_preload(sys.argv[1:] if argv is None else argv)
    from torch.distributed.elastic.multiprocessing.errors import record
    from torch.distributed.run import parse_args, run  # imports torch, starts no thread

    args = parse_args(rest)
    if preload:
        if not args.module:  # refused before the fork server starts: a refusal leaves no process behind
            raise SystemExit("harness.run.agent: --preload is for a worker module (-m MODULE); "
                             "a script runs under plain torchrun")
        serve_forks_from_here([*PRELOAD, *preload])
        args = forked(args)
    store_ports_outside_ephemeral()
    tolerate_cut_error_files()
    if os.environ.get(JOURNAL_VARIABLE):
        journal_failures(os.environ[JOURNAL_VARIABLE], os.environ.get("BAFT_NODE", "node0"))
    for name in ("torch", "torch.distributed"):  # where torch attaches its handlers
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(ExceptionText())
    try:
        record(run)(args)  # what torchrun's main does with the parsed arguments
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except Exception:  # a failed job (ChildFailedError), said as torchrun's CLI says it
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    # The workers are gone and the rendezvous closed: skip the interpreter's teardown of torch
    # (over a second per agent here), which the launcher would wait for.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
