"""What each checkpointing strategy announces and needs, known without importing it (torch-free).

The harness validates a scenario (which fault phases can fire, whether a job may shrink, whether
node stores start) before anything runs, and the injectors key faults to these phases; neither
needs the strategies' code, which imports torch. Each strategy class takes its traits from
:data:`TRAITS` (``baft.strategies.base.Strategy.__init_subclass__``), so this table is the one place
they are stated.
"""
from __future__ import annotations

from dataclasses import dataclass

from baft.events import PHASES


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


_WRITES = ("persist", "restore", "restore_load")

#: By ``CheckpointConfig.strategy``.
TRAITS: dict[str, Traits] = {
    "none": Traits(),
    "sync": Traits(phases=_WRITES),
    "async-dcp": Traits(phases=_WRITES, elastic=True),  # DCP reshards on load
    "checkfreq": Traits(phases=_WRITES),
    # the snapshots record their replica count; a resized restore re-cuts them
    "baft": Traits(phases=("snapshot", "replicate", *_WRITES, "restore_locate", "restore_pull"),
                   step_phases=("snapshot",), elastic=True,
                   node_stores=True),
}


def _announced(attribute: str) -> tuple[str, ...]:
    """The phases some strategy lists in ``attribute``, in :data:`baft.events.PHASES` order."""
    return tuple(p for p in PHASES if any(p in getattr(t, attribute) for t in TRAITS.values()))


#: Every checkpoint phase some strategy announces (:attr:`Traits.phases`).
CHECKPOINT_PHASES = _announced("phases")
#: Those some strategy announces at its steps (:attr:`Traits.step_phases`).
STEP_CHECKPOINT_PHASES = _announced("step_phases")
