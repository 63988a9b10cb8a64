"""What every checkpointing strategy implements: hooks at fixed points of an iteration.

A training loop calls, every iteration, on every rank::

    begin_iteration()          at the step boundary, before the data pipeline moves
    before_optimizer_step()    after the last backward: the version still exists
    after_step()               after the optimizer step and ``state.step += 1``

and ``restore()`` once at start. Strategies differ only in what they do there.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from torch.distributed.checkpoint.api import CheckpointException

import baft.strategies.registry as registry
from baft import events
from baft.config import CheckpointConfig
from baft.errors import CheckpointCorrupt
from baft.mesh.collective import all_gather, all_min, rank_world
from baft.mesh.control import own_group
from baft.mesh.topology import Topology, of, shard_key, stage_key
from baft.persist.interval import AdaptiveInterval
from baft.persist.storage import at
from baft.state.train import TrainState

#: What a failed write to the persistent tier raises: the OS (a full disk, an I/O error) or
#: DCP, which gathers every rank's write errors into one exception raised on all ranks.
WRITE_ERRORS: tuple[type[BaseException], ...] = (OSError, CheckpointException, CheckpointCorrupt)


def commit_agreed(commit: Callable[[], Any], group: Any = None) -> str | None:
    """Rank 0 runs ``commit`` (what makes a written checkpoint the ``latest``); every rank learns
    whether it succeeded: None, or why not. Collective: every rank calls it, in the same order on
    ``group``, so no rank journals a checkpoint as saved that rank 0 failed to commit."""
    error: str | None = None
    if rank_world()[0] == 0:
        try:
            commit()
        except WRITE_ERRORS as e:
            error = f"rank 0 commit: {type(e).__name__}: {e}"
    first: str | None = all_gather(error, group)[0]
    return first


def persist_failed(step: int, error: BaseException | str) -> None:
    """Journal a checkpoint that could not be written. Training goes on; ``latest`` still names
    the last good checkpoint, so the failure costs recency, never correctness."""
    reason = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    events.emit("checkpoint_failed", step=step, tier="persistent", reason=reason)


class Strategy:
    """The ``none`` strategy, and the base of the others: every hook does nothing."""

    name: ClassVar[str] = "none"
    """Its ``CheckpointConfig.strategy``; its traits (the ClassVars below) are its registry entry's
    (:mod:`baft.strategies.registry`: a strategy of one's own is registered before its class is defined)."""
    phases: ClassVar[tuple[str, ...]] = registry.traits("none", plugins=False).phases
    step_phases: ClassVar[tuple[str, ...]] = registry.traits("none", plugins=False).step_phases
    elastic: ClassVar[bool] = registry.traits("none", plugins=False).elastic
    node_stores: ClassVar[bool] = registry.traits("none", plugins=False).node_stores

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        traits = registry.traits(cls.name, plugins=False)
        cls.phases, cls.step_phases = traits.phases, traits.step_phases
        cls.elastic, cls.node_stores = traits.elastic, traits.node_stores

    places: list[tuple[str, int]] | None = None
    """Every rank's pieces of state and replica index, for the strategies that record them with each
    checkpoint (:meth:`gather_places`, at attach); None otherwise."""

    def __init__(self, config: CheckpointConfig, state: TrainState) -> None:
        self.config = config
        self.state = state
        self.topology = Topology()
        self.stage_key = f"rank{rank_world()[0]}"
        self.interval = AdaptiveInterval(config)
        """When to persist (:mod:`baft.persist.interval`): every ``config.every`` steps, or adapting to the measured
        cost with ``config.mtbf_hours``. A strategy charges it what a persist costs its training thread and
        sets ``interval.background`` to what its background work's CPU time is."""
        self._flushed: int | None = None
        """The step the last :meth:`flush` wrote."""
        self._control: Any = None
        self.interval.group = lambda: self.control

    @property
    def control(self) -> Any:
        """baft's own gloo group over all ranks (:mod:`baft.mesh.control`), made on first use (at attach, or
        at the first agreement: every rank reaches both in the same order): every agreement between the
        ranks goes over it, never over the job's groups, which may take device tensors only (NCCL)."""
        if self._control is None:
            self._control = own_group()
        return self._control

    @property
    def root(self) -> Path | str:
        """The persistent tier, ``config.dir``: a local directory (a Path) or an fsspec URL."""
        return at(self.config.dir).location()

    def attach(self, stage: Any, *, mesh: Any = None, replica: int = 0, replicas: int = 1,
               replica_group: Any = None) -> None:
        """The pipeline stage(s) of this rank and its place among the ranks that hold the stage's state:
        the job's ``DeviceMesh`` (dimensions named ``pp``, ``dp_replicate``, ``dp_shard``, ``tp``; see
        :mod:`baft.mesh.topology`) or, without one, this rank's ``replica`` of ``replicas`` identical copies."""
        self.topology = of(mesh, replica=replica, replicas=replicas, replica_group=replica_group)
        self.stage_key = stage_key(stage, rank_world()[0], self.topology)
        self.attached(stage)

    @property
    def shard_key(self) -> str:
        """Where this rank's plain tensors go in the persistent tier (:func:`baft.mesh.topology.shard_key`)."""
        return shard_key(self.stage_key, self.topology)

    def attached(self, stage: Any) -> None:
        """What a strategy does once :attr:`topology` and :attr:`stage_key` are known."""

    @property
    def place(self) -> str | None:
        """The pieces of state this rank holds (:attr:`shard_key`); None for a module attached without a mesh
        or a stage index (it holds "its own" state, ``rank<R>``: replica-major order is assumed)."""
        return None if self.stage_key.startswith("rank") else self.shard_key

    def gather_places(self) -> list[tuple[str, int]] | None:
        """Every rank's :attr:`place` and replica index (collective: every rank calls it, at attach): what a
        restore in a world of another size reads, recorded with each version, to find the old ranks of its
        stage in any rank order. None when a rank has no place."""
        places = all_gather([self.place, self.topology.replica], self.control)
        return None if any(p is None for p, _ in places) else [(p, r) for p, r in places]

    def restore(self) -> int | None:
        """Restore the newest usable checkpoint; the step restored, or None if there is none."""
        return None

    def settings(self) -> dict[str, Any]:
        """What the strategy runs with that only it knows (for a benchmark's record; none by default)."""
        return {}

    def begin_iteration(self) -> None:
        pass

    def before_optimizer_step(self) -> None:
        pass

    def after_step(self) -> bool:
        """Returns whether this step started or wrote a checkpoint."""
        return False

    def due(self, step: int) -> bool:
        """Whether ``step`` is a persist boundary (with an adaptive interval a collective at each one)."""
        return self.interval.due(step)

    def drain(self) -> None:
        """Wait until no background work of this strategy is in flight."""

    def flush(self) -> int | None:
        """Persist the state as it is now (at a step boundary), synchronously and collectively: what a
        preempted job does in its grace period. Returns the step written, or None when the newest
        persistent checkpoint already holds it (or the strategy cannot: then it only drains)."""
        self.drain()
        step = self.state.step
        if self.due(step) or step == self._flushed:
            return None  # after_step wrote it (drained just now), or an earlier flush did
        if not self.write_now(step):
            return None
        self._flushed = step
        return step

    def write_now(self, step: int) -> bool:
        """Write the current state as ``step`` and wait until it is committed (what :meth:`flush` calls);
        False when this strategy keeps nothing persistent."""
        return False

    def close(self) -> None:
        """Finish background work (so nothing is lost) and release resources."""


def restore_agreed(
    candidates: list[int],
    verify: Callable[[int], bool],
    load: Callable[[int], None],
    group: Any = None,
) -> int | None:
    """Restore the newest step in ``candidates`` (newest first) that every rank can verify.

    Each rank proposes its newest verified step; all take the minimum; if some
    rank cannot verify that one, all retry below it. One damaged copy makes the
    whole job fall back together instead of mixing versions. Collective: every
    rank calls it, and the loop runs the same number of times on each. ``group``: over which the ranks agree
    (a strategy's :attr:`Strategy.control`).
    """
    upper = max(all_gather(candidates[0] if candidates else -1, group))
    while upper >= 0:
        mine = next((s for s in candidates if s <= upper and verify(s)), -1)
        agreed = all_min(mine, group)
        if agreed == -1:
            return None
        if all_min(int(verify(agreed)), group) == 1:
            load(agreed)
            return agreed
        upper = agreed - 1
    return None
