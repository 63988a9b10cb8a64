"""Start a run as real torchrun agents, one per node, joined by a c10d rendezvous on loopback.

Each node is one ``torchrun`` elastic agent (``--nnodes N``) running
``nproc = world / N`` workers of the workload; the first agent hosts the
rendezvous store. ``--max-restarts`` lets the agents restart every worker
after a failure: torchrun stops all survivors, re-rendezvous, and each new
worker restores the newest checkpoint by itself.

Measured on this kind of machine: an elastic restart on gloo fails with
"connectFullMesh failed" unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.journal import JournalWriter, agent_journal, launcher_journal

from harness.errors import Cancelled, ConfigValueError, LaunchError
from harness.worker.spec import SPEC_VARIABLE, Placement
from harness.scenario import EXIT_TIMEOUT
from harness.run.agent import JOURNAL_VARIABLE
from harness.run.nodeenv import free_port, worker_env
from harness.run.processes import new_token, stop_owned
from harness.run.watchdog import Watchdog

if TYPE_CHECKING:
    from injectors import FaultConfig
    from injectors.network import Topology

    from harness.run.storefleet import StoreSpec


#: A dead agent is declared gone after 3 missed 1 s keep-alives. torchrun's default, 3 x 5 s, adds
#: 15 s to every restart in which an agent was replaced (an elastic restart, a pod killed on a cluster).
KEEP_ALIVE = ",keep_alive_interval=1,keep_alive_max_attempt=3"


@dataclass(kw_only=True, slots=True)
class LaunchConfig:
    """How a run's torchrun agents are started."""

    nodes: int
    """Nodes, one torchrun agent each (with its workers and, with ``stores``, a store)."""
    world_size: int
    """Ranks in all; each node runs ``world_size / nodes`` workers."""
    max_restarts: int
    """torchrun ``--max-restarts`` of every agent."""
    timeout: float
    """Seconds before the agents are stopped and the run counts as timed out."""
    module: str = "harness.worker.workload"
    """What each worker runs, ``MODULE SPEC`` (forked from a fork server that imported MODULE, see
    :mod:`harness.run.agent`)."""
    script: list[str] | None = None
    """Instead of ``module``: a script and its arguments (it finds the spec in ``BAFT_SPEC``)."""
    cwd: Path | None = None
    """The agents' (and so the workers') working directory (None: this process's)."""
    stores: StoreSpec | None = None
    """The node stores to start before the agents (None: none)."""
    hang_timeout: float | None = None
    """Seconds without progress before the watchdog declares a hang (None: no watchdog)."""
    startup_timeout: float | None = None
    """With the watchdog: seconds from a launch or restart to the first step (None: its default)."""
    exit_timeout: float | None = EXIT_TIMEOUT
    """Seconds a worker may live once every rank journaled ``finish``; then the harness ends the job (a
    teardown hang, journaled; None: wait for it)."""
    topology: Topology | None = None
    """The nodes' network namespaces (None: every node on the host's loopback); node 0's address
    hosts the rendezvous."""
    harness_faults: list[tuple[int, FaultConfig]] = field(default_factory=list)
    """(fault id, config) of the link faults the harness drives; they need a ``topology``."""
    min_nodes: int | None = None
    """Below ``nodes``: elastic agents (``--nnodes MIN:MAX``); when a node is gone for good the
    others re-rendezvous without it after ``last_call`` seconds."""
    last_call: float = 10.0
    """Seconds an elastic rendezvous waits for more nodes once the minimum has joined (torchrun's
    default is 30; every elastic restart pays it, and a node that starts later is left out)."""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ConfigValueError("nodes", "an integer >= 1", self.nodes)
        if self.world_size < self.nodes or self.world_size % self.nodes:
            raise ConfigValueError("world_size", f"a multiple of nodes ({self.nodes})", self.world_size)
        if self.max_restarts < 0:
            raise ConfigValueError("max_restarts", "an integer >= 0", self.max_restarts)
        if self.timeout <= 0:
            raise ConfigValueError("timeout", "a number > 0", self.timeout)
        if self.last_call <= 0:
            raise ConfigValueError("last_call", "a number of seconds > 0", self.last_call)
        if self.exit_timeout is not None and self.exit_timeout <= 0:
            raise ConfigValueError("exit_timeout", "a number of seconds > 0 (or null)", self.exit_timeout)
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.nodes:
            raise ConfigValueError("min_nodes", f"a number of nodes in 1..{self.nodes}", self.min_nodes)
        if self.harness_faults and self.topology is None:
            raise ConfigValueError("harness_faults", "a topology (link faults need the nodes in network namespaces)",
                                   self.harness_faults)

    @property
    def elastic(self) -> bool:
        return self.min_nodes is not None and self.min_nodes < self.nodes


@dataclass(kw_only=True, slots=True)
class LaunchResult:
    """How the agents ended."""

    returncodes: list[int]
    seconds: float
    timed_out: bool
    ended_after_finish: list[int] = field(default_factory=list)
    """Nodes whose agent the harness ended after every rank had finished (a teardown hang, journaled as
    ``teardown_hang``): their return codes are no failure."""

    def failed_nodes(self) -> list[int]:
        """Nodes whose agent ended badly, those ended after the job finished left out."""
        return [n for n, rc in enumerate(self.returncodes) if rc != 0 and n not in self.ended_after_finish]

    @property
    def ok(self) -> bool:
        return not self.timed_out and not self.failed_nodes()


def launch(run_dir: Path, spec: Placement, config: LaunchConfig) -> LaunchResult:
    """Start the node stores (if any), write the worker spec (``spec`` placed: the stores' addresses,
    the run directory, the start time), start one torchrun agent per node, wait for all of them;
    stop the stores.

    With a ``topology`` every node (agent, workers, store) runs in its own network
    namespace and rendezvous on node 0's address; ``harness_faults`` (fault id, config)
    are then driven on its links by a :class:`~harness.run.linkfaults.FaultController`.
    """
    from harness.run.linkfaults import FaultController
    from baft.wire import SECRET_VARIABLE, new_secret

    from harness.run.storefleet import StoreFleet

    run_dir.mkdir(parents=True, exist_ok=True)
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    journal = JournalWriter(launcher_journal(run_dir))
    token = new_token()  # in the environment of every process this launch starts (stop_owned finds them)
    procs: list[subprocess.Popen] = []
    t0 = time.monotonic()
    timed_out = False
    # Undone in reverse order whatever happens (an error, a timeout, SIGINT/SIGTERM): link faults
    # rolled back, watchdog and store fleet stopped, then every process of the launch, wherever
    # it went; one step that fails does not skip the others.
    # The stores answer only processes that prove this secret (baft.wire): this launch's workers and stores.
    secret = {SECRET_VARIABLE: new_secret()} if config.stores is not None else {}
    fleet = (StoreFleet(config.stores, config.nodes, run_dir, journal, config.topology, token=token,
                        secret=secret[SECRET_VARIABLE], world_size=config.world_size)
             if config.stores is not None else None)
    watchdog: Watchdog | None = None
    with contextlib.ExitStack() as undo:
        undo.callback(journal.close)
        undo.callback(_journal_exits, journal, procs)
        if fleet is not None:
            undo.callback(fleet.stop)  # its memory removed once nothing can write there
        undo.callback(stop_owned, token)  # agents, workers and stores at once, stopped ones continued
        try:
            if fleet is not None:
                undo.callback(fleet.stop_monitor)  # no store replaced while the run is stopped
                spec = replace(spec, stores=fleet.addresses, node_memory=str(config.stores.base))
                fleet.start()
            spec_path = run_dir / "worker-spec.json"
            # started_at: the origin of the faults' time triggers, shared by every worker and restart.
            started_at = time.time()
            spec_path.write_text(replace(spec, run_dir=str(run_dir.resolve()), started_at=started_at).dumps())
            host = config.topology.address(0) if config.topology else "127.0.0.1"
            port = free_port()
            run_id = uuid.uuid4().hex[:12]
            for node in range(config.nodes):
                # torchrun (harness.run.agent): a module's workers (the reference workload, the bench)
                # forked from a server that has imported it; a user's script in fresh interpreters.
                cmd = [
                    sys.executable, "-m", "harness.run.agent", *([] if config.script else ["--preload", config.module]),
                    "--nnodes", f"{config.min_nodes}:{config.nodes}" if config.elastic else str(config.nodes),
                    "--nproc-per-node", str(config.world_size // config.nodes),
                    "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"{host}:{port}",
                    "--rdzv-id", run_id,
                    "--rdzv-conf", f"is_host={1 if node == 0 else 0}" + (f",last_call_timeout={config.last_call:g}{KEEP_ALIVE}" if config.elastic else ""),
                    "--max-restarts", str(config.max_restarts),
                    "--monitor-interval", "0.2",
                ] + (list(config.script) if config.script else ["-m", config.module, str(spec_path.resolve())])
                if config.topology is not None:
                    at = cmd.index("--nnodes")
                    cmd[at:at] = ["--local-addr", config.topology.address(node)]  # what the other nodes dial
                    cmd = config.topology.exec_prefix(node) + cmd
                # what a Session reads
                env = {**worker_env(node, config.topology, token), SPEC_VARIABLE: str(spec_path.resolve()), **secret,
                       JOURNAL_VARIABLE: str(agent_journal(run_dir.resolve(), node))}
                with open(logs / f"node{node}.log", "ab") as log:
                    procs.append(_start_agent(cmd, env, log, warm=config.topology is None, cwd=config.cwd))
                journal.write("agent_start", node=f"node{node}", pid=procs[-1].pid, cmd=cmd)
            if config.hang_timeout is not None or config.exit_timeout is not None:
                watchdog = Watchdog(run_dir, procs, journal, config.hang_timeout, config.startup_timeout,
                                    config.exit_timeout)
                undo.callback(watchdog.stop)
                watchdog.start()
            if config.harness_faults and config.topology is not None:  # (LaunchConfig: no link fault without one)
                controller = FaultController(run_dir, config.harness_faults, config.topology, journal, started_at)
                undo.callback(controller.stop)  # rolls back every link fault still in place
                controller.start()
            deadline = t0 + config.timeout
            for p in procs:
                remaining = deadline - time.monotonic()
                try:
                    p.wait(timeout=max(0.1, remaining))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    break
        except Cancelled as c:
            journal.write("aborted", signal=c.name, seconds=round(time.monotonic() - t0, 3))
            raise
    if not procs:
        raise LaunchError("no torchrun agent started")
    return LaunchResult(returncodes=[p.returncode for p in procs], seconds=time.monotonic() - t0, timed_out=timed_out,
                        ended_after_finish=watchdog.ended_after_finish if watchdog is not None else [])


def _start_agent(cmd: list[str], env: dict[str, str], log: Any, warm: bool, cwd: Path | None = None) -> Any:
    """Start one torchrun agent (``cmd`` is ``python -m harness.run.agent ARGS``): forked by this
    process's zygote (:mod:`harness.run.zygote`, torch imported once for every agent) when ``warm``
    and not switched off (``BAFT_ZYGOTE=0``), else a fresh interpreter in a session of its own."""
    if warm and os.environ.get("BAFT_ZYGOTE", "1") != "0":
        from harness.run.agent import PRELOAD
        from harness.run.zygote import ZygoteError, shared

        try:
            return shared([*PRELOAD, "harness.run.agent", "harness.worker.workload"]).spawn(
                cmd[3:], env, str(cwd or os.getcwd()), log)
        except ZygoteError as e:
            log.write(f"harness: no agent zygote ({e}); starting the agent in a fresh interpreter\n".encode())
            log.flush()
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd)


def _journal_exits(journal: JournalWriter, procs: list[subprocess.Popen]) -> None:
    """Reap the agents (stopped by now) and journal how each ended."""
    for i, p in enumerate(procs):
        try:
            p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        journal.write("agent_exit", node=f"node{i}", returncode=p.returncode)
