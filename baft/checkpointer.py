"""The small public API a training loop calls.

    ckpt = Checkpointer(CheckpointConfig(strategy="baft", every=10, dir="ckpt"), state)
    ckpt.attach(pipeline_stage)            # baft profiles the stage's bubbles
    start = ckpt.restore_latest()          # every rank, collectively
    for step in range(start, steps):
        ckpt.begin_iteration()             # at the boundary, before the next batch is drawn
        forward_backward()
        ckpt.before_optimizer_step()
        optimizer.step(); scheduler.step()
        state.step = step + 1
        ckpt.after_step()
    ckpt.close()                           # waits for background writes

Every rank calls every method collectively (they use ``torch.distributed``
when it is initialised and work single-process otherwise). What happens at
each hook is the chosen strategy's business (``baft.strategies``).
"""
from __future__ import annotations

from typing import Any

import baft.strategies.registry as registry
from baft.config import CheckpointConfig, StrategyName
from baft.state.train import TrainState
from baft.strategies.base import Strategy

__all__ = ["CheckpointConfig", "Checkpointer", "StrategyName"]


class Checkpointer:
    """Saves and restores one rank's :class:`TrainState` with the configured strategy."""

    def __init__(self, config: CheckpointConfig, state: TrainState) -> None:
        self.config = config
        self.state = state
        self.strategy: Strategy = registry.get(config.strategy).load()(config, state)

    def attach(self, stage: Any, *, mesh: Any = None, replica: int = 0, replicas: int = 1,
               replica_group: Any = None) -> None:
        """The pipeline stage (profiled by ``baft``) and this rank's place in the job: its ``DeviceMesh``
        (:mod:`baft.mesh.topology`), or its ``replica`` among ``replicas`` identical copies of the stage."""
        self.strategy.attach(stage, mesh=mesh, replica=replica, replicas=replicas, replica_group=replica_group)

    def restore_latest(self) -> int:
        """Restore the newest usable checkpoint; returns the step to resume at (the current one if none)."""
        self.strategy.restore()
        return self.state.step

    def begin_iteration(self) -> None:
        self.strategy.begin_iteration()

    def before_optimizer_step(self) -> None:
        self.strategy.before_optimizer_step()

    def after_step(self) -> bool:
        """Returns whether this step produced (or started) a persistent checkpoint."""
        return self.strategy.after_step()

    def drain(self) -> None:
        """Wait for background checkpoint work in flight (benchmarks call it between blocks)."""
        self.strategy.drain()

    def flush(self) -> int | None:
        """Persist the state as it is now, synchronously (a preemption's SIGTERM: at the next step boundary,
        every rank); the step written, or None when the newest persistent checkpoint already holds it."""
        return self.strategy.flush()

    def close(self) -> None:
        self.strategy.close()
