"""What a checkpointing strategy announces and needs, known without importing it (torch-free).

The harness validates a scenario (which fault phases can fire, whether a job may shrink, whether
node stores start) before anything runs, and the injectors key faults to these phases; neither
needs the strategies' code, which imports torch. Each strategy's traits are stated once, in its entry of
:mod:`baft.strategies.registry`, and its class takes them from there
(``baft.strategies.base.Strategy.__init_subclass__``).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Traits:
    phases: tuple[str, ...] = ()
    """The checkpoint phases (of ``baft.events.PHASES``) it announces: a fault keyed to another
    checkpoint phase never fires under it."""
    step_phases: tuple[str, ...] = ()
    """Those of :attr:`phases` it announces inside the iterations, at every step it snapshots (the
    others come only with a persisted step, a replication or a restore)."""
    elastic: bool = False
    """Whether its checkpoints restore on a different number of data-parallel replicas (what the
    job needs when a node is lost for good and it goes on with fewer)."""
    node_stores: bool = False
    """Whether its ranks use a checkpoint store on their node (``baft.store.server``: peers' replicas and
    restores; the harness starts one next to every node's agent and names them in the worker spec)."""

