"""A launch's torchrun agents, one per node: started, replaced one at a time, or restarted all together.

Each node is one ``torchrun`` elastic agent (``python -m harness.run.agent``) joined to a c10d rendezvous
whose store the agent of node 0 hosts. A node that comes back after a preemption gets a new agent that
joins the same rendezvous (the others' workers failed with the node's and re-rendezvous with it); when
node 0 goes, the rendezvous goes with it and every node's agent is started again on a new one, as a
job controller restarts a job whose master pod is gone.
"""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.journal import JournalWriter, agent_journal
from harness.run.agent import JOURNAL_VARIABLE
from harness.run.nodeenv import free_port, worker_env
from harness.worker.spec import SPEC_VARIABLE

if TYPE_CHECKING:
    from harness.run.cpugroups import CpuGroups
    from harness.run.launchconfig import LaunchConfig

#: A dead agent is declared gone after 3 missed 1 s keep-alives. torchrun's default, 3 x 5 s, adds
#: 15 s to every restart in which an agent was replaced (an elastic restart, a preempted node, a pod
#: killed on a cluster).
KEEP_ALIVE = ",keep_alive_interval=1,keep_alive_max_attempt=3"


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """Where the agents meet: node 0's address, a port, the job's id."""

    host: str
    port: int
    run_id: str

    @classmethod
    def new(cls, host: str) -> Rendezvous:
        return cls(host=host, port=free_port(), run_id=uuid.uuid4().hex[:12])


class AgentSet:
    """The agents of one launch (``procs[node]`` is node ``node``'s current agent)."""

    def __init__(self, config: LaunchConfig, run_dir: Path, spec_path: Path, token: str, secret: dict[str, str],
                 journal: JournalWriter, groups: CpuGroups | None = None) -> None:
        self.config, self.run_dir, self.spec_path, self.token = config, run_dir, spec_path, token
        self.secret, self.journal = secret, journal
        self.groups = groups
        """The launch's CPU groups: each agent joins its node's ``job`` group (None: none made)."""
        self.rendezvous = Rendezvous.new(config.topology.address(0) if config.topology else "127.0.0.1")
        self.procs: list[Any] = []
        """The current agent of each node (a ``subprocess.Popen`` or a zygote's ``Forked``)."""

    def command(self, node: int) -> list[str]:
        """torchrun (harness.run.agent) for ``node``: a module's workers (the reference workload, the bench)
        forked from a server that has imported it; a user's script in fresh interpreters."""
        c, r = self.config, self.rendezvous
        keep_alive = KEEP_ALIVE if c.elastic or c.preemptions else ""
        conf = f"is_host={1 if node == 0 else 0}" + (f",last_call_timeout={c.last_call:g}" if c.elastic else "")
        cmd = [
            sys.executable, "-m", "harness.run.agent", *([] if c.script else ["--preload", c.module]),
            "--nnodes", f"{c.min_nodes}:{c.nodes}" if c.elastic else str(c.nodes),
            "--nproc-per-node", str(c.world_size // c.nodes),
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{r.host}:{r.port}",
            "--rdzv-id", r.run_id,
            "--rdzv-conf", conf + keep_alive,
            "--max-restarts", str(c.max_restarts),
            "--monitor-interval", "0.2",
            # torchrun's own files (a worker's error.json) in the run, not in a temporary directory left behind
            "--log-dir", str(self.run_dir.resolve() / "logs" / "torchelastic" / f"node{node}"),
        ] + (list(c.script) if c.script else ["-m", c.module, str(self.spec_path.resolve())])
        if c.topology is not None:
            at = cmd.index("--nnodes")
            cmd[at:at] = ["--local-addr", c.topology.address(node)]  # what the other nodes dial
            cmd = c.topology.exec_prefix(node) + cmd
        return cmd

    def start(self, node: int, **why: Any) -> None:
        """Start node ``node``'s agent (in its place if it had one); ``why`` goes into the journal."""
        cmd = self.command(node)
        env = {**worker_env(node, self.config.topology, self.token), SPEC_VARIABLE: str(self.spec_path.resolve()),
               **self.secret, JOURNAL_VARIABLE: str(agent_journal(self.run_dir.resolve(), node)),
               **(self.groups.env(node, "job") if self.groups is not None else {})}
        with open(self.run_dir / "logs" / f"node{node}.log", "ab") as log:
            proc = start_agent(cmd, env, log, warm=self.config.topology is None, cwd=self.config.cwd)
        if node < len(self.procs):
            self.procs[node] = proc  # the list is shared with the watchdog: replaced in place
        else:
            self.procs.append(proc)
        self.journal.write("agent_start", node=f"node{node}", pid=proc.pid, cmd=cmd, **why)

    def start_all(self) -> None:
        for node in range(self.config.nodes):
            self.start(node)

    def journal_exit(self, node: int, **why: Any) -> None:
        """Reap node ``node``'s agent (stopped by now) and journal how it ended."""
        p = self.procs[node]
        try:
            p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        self.journal.write("agent_exit", node=f"node{node}", returncode=p.returncode, **why)

    def restart_all(self, skip: set[int] | frozenset[int] = frozenset(), **why: Any) -> None:
        """Every node's agent again (but those in ``skip``: nodes lost for good), on a new rendezvous (the old
        one's store is gone with node 0's agent). Each agent must have ended."""
        for node in range(len(self.procs)):
            if node not in skip:
                self.journal_exit(node, **why)
        self.rendezvous = Rendezvous.new(self.rendezvous.host)
        for node in range(len(self.procs)):
            if node not in skip:
                self.start(node, **why)

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs)


def start_agent(cmd: list[str], env: dict[str, str], log: Any, warm: bool, cwd: Path | None = None) -> Any:
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
