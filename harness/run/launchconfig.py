"""How a run's torchrun agents are started: the launch's config (:func:`harness.run.launcher.launch` takes it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import ConfigValueError
from harness.scenario import EXIT_TIMEOUT

if TYPE_CHECKING:
    from harness.run.storefleet import StoreSpec
    from injectors import FaultConfig
    from injectors.network import NetworkTopology


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
    topology: NetworkTopology | None = None
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
    preemptions: bool = False
    """The run has preempt faults: the harness serves the workers' requests (:mod:`harness.run.preempt`),
    replacing a preempted node's agent, and the rendezvous drops a dead agent after 3 s."""

    joins: bool = False
    """The run has node_join faults: the harness serves rank 0's requests (:mod:`harness.run.join`), starting a
    lost node's store and agent again."""

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
