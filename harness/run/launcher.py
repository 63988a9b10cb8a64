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
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from analysis.journal import JournalWriter, launcher_journal
from harness.errors import Cancelled, LaunchError
from harness.run.agents import (  # KEEP_ALIVE: importable here as before
    KEEP_ALIVE,
    AgentSet,
)
from harness.run.join import JoinController
from harness.run.launchconfig import LaunchConfig
from harness.run.preempt import PreemptController
from harness.run.processes import new_token, stop_owned
from harness.run.watchdog import Watchdog
from harness.worker.spec import LaunchFacts

__all__ = ["KEEP_ALIVE", "LaunchConfig", "LaunchResult", "launch"]


@dataclass(kw_only=True, slots=True)
class LaunchResult:
    """How the agents ended."""

    returncodes: list[int]
    seconds: float
    timed_out: bool
    ended_after_finish: list[int] = field(default_factory=list)
    """Nodes whose agent the harness ended after every rank had finished (a teardown hang, journaled as
    ``teardown_hang``): their return codes are no failure."""

    errors: list[str] = field(default_factory=list)
    """What went wrong in the harness's own part of the launch (a preemption it could not carry out)."""

    def failed_nodes(self) -> list[int]:
        """Nodes whose agent ended badly, those ended after the job finished left out."""
        return [n for n, rc in enumerate(self.returncodes) if rc != 0 and n not in self.ended_after_finish]

    @property
    def ok(self) -> bool:
        return not self.timed_out and not self.failed_nodes() and not self.errors


def _wait(agents: AgentSet, preempt: PreemptController | None, deadline: float) -> bool:
    """Wait until every agent ended and no preemption is bringing a node back (busy is read before and after
    the agents: it clears only once a replacement agent is up); False if ``deadline`` (monotonic) came first."""
    def busy() -> bool:
        return preempt is not None and preempt.busy and preempt.error is None

    while busy() or agents.alive() or busy():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def launch(run_dir: Path, spec: LaunchFacts, config: LaunchConfig) -> LaunchResult:
    """Start the node stores (if any), write the worker spec (``spec`` placed: the stores' addresses,
    the run directory, the start time), start one torchrun agent per node, wait for all of them;
    stop the stores.

    With a ``topology`` every node (agent, workers, store) runs in its own network
    namespace and rendezvous on node 0's address; ``harness_faults`` (fault id, config)
    are then driven on its links by a :class:`~harness.run.linkfaults.FaultController`.
    """
    from baft.store.wire import SECRET_VARIABLE, new_secret

    from harness.run.cpugroups import CpuGroups
    from harness.run.linkfaults import FaultController
    from harness.run.storefleet import StoreFleet

    run_dir.mkdir(parents=True, exist_ok=True)
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    journal = JournalWriter(launcher_journal(run_dir))
    token = new_token()  # in the environment of every process this launch starts (stop_owned finds them)
    t0 = time.monotonic()
    timed_out = False
    # Undone in reverse order whatever happens (an error, a timeout, SIGINT/SIGTERM): link faults
    # rolled back, watchdog and store fleet stopped, then every process of the launch, wherever
    # it went; one step that fails does not skip the others.
    # The stores answer only processes that prove this secret (baft.store.wire): this launch's workers and stores.
    secret = {SECRET_VARIABLE: new_secret()} if config.stores is not None else {}
    groups = CpuGroups(token, config.nodes, journal)  # each node's processes in one group, its store idle in it
    fleet = (StoreFleet(config.stores, config.nodes, run_dir, journal, config.topology, token=token,
                        secret=secret[SECRET_VARIABLE], world_size=config.world_size, groups=groups)
             if config.stores is not None else None)
    watchdog: Watchdog | None = None
    agents: AgentSet | None = None
    preempt: PreemptController | None = None
    joins: JoinController | None = None
    with contextlib.ExitStack() as undo:
        undo.callback(journal.close)
        undo.callback(groups.close)  # once every process of the launch is gone
        undo.callback(lambda: _journal_exits(agents) if agents is not None else None)
        if fleet is not None:
            undo.callback(fleet.stop)  # its memory removed once nothing can write there
        undo.callback(stop_owned, token)  # agents, workers and stores at once, stopped ones continued
        try:
            if fleet is not None:
                undo.callback(fleet.stop_monitor)  # no store replaced while the run is stopped
                assert config.stores is not None  # the fleet is made from it
                spec = replace(spec, stores=fleet.addresses, node_memory=str(config.stores.base))
                fleet.start()
            spec_path = run_dir / "worker-spec.json"
            # started_at: the origin of the faults' time triggers, shared by every worker and restart.
            started_at = time.time()
            spec_path.write_text(replace(spec, run_dir=str(run_dir.resolve()), started_at=started_at).dumps())
            agents = AgentSet(config, run_dir, spec_path, token, secret, journal, groups)
            agents.start_all()
            if config.hang_timeout is not None or config.exit_timeout is not None:
                watchdog = Watchdog(run_dir, agents.procs, journal, config.hang_timeout, config.startup_timeout,
                                    config.exit_timeout)
                undo.callback(watchdog.stop)
                watchdog.start()
            if config.preemptions:
                preempt = PreemptController(run_dir, agents, journal, token, fleet=fleet, watchdog=watchdog)
                undo.callback(preempt.stop)
                preempt.start()
            if config.joins:
                joins = JoinController(run_dir, agents, journal, fleet=fleet, watchdog=watchdog)
                undo.callback(joins.stop)
                joins.start()
            if config.harness_faults and config.topology is not None:  # (LaunchConfig: no link fault without one)
                controller = FaultController(run_dir, config.harness_faults, config.topology, journal, started_at)
                undo.callback(controller.stop)  # rolls back every link fault still in place
                controller.start()
            timed_out = not _wait(agents, preempt, t0 + config.timeout)
        except Cancelled as c:
            journal.write("aborted", signal=c.name, seconds=round(time.monotonic() - t0, 3))
            raise
    if agents is None or not agents.procs:
        raise LaunchError("no torchrun agent started")
    errors = [f"{what}: {type(e).__name__}: {e}" for what, c in (("preempt", preempt), ("node_join", joins))
              if c is not None and (e := c.error) is not None]
    return LaunchResult(returncodes=[p.returncode for p in agents.procs], seconds=time.monotonic() - t0, timed_out=timed_out,
                        errors=errors,
                        ended_after_finish=watchdog.ended_after_finish if watchdog is not None else [])


def _journal_exits(agents: AgentSet) -> None:
    """Reap the agents (stopped by now) and journal how each ended."""
    for node in range(len(agents.procs)):
        agents.journal_exit(node)
