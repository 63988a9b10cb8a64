"""A checkpoint strategy of one's own, registered from outside baft (``BAFT_STRATEGIES=tests.fakes.toystrategy``):
``toy`` writes each rank's whole state with ``torch.save`` every ``checkpoint.every`` steps and restores the newest
step every rank holds. What ``tests/unit/test_strategy_registry.py`` and ``tests/e2e/test_toy_strategy.py`` run
through ``baft bench`` and ``baft run``, to show that a strategy is one registry entry and one module."""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

import baft.strategies.registry as registry
from baft import events
from baft.mesh.collective import rank_world
from baft.strategies.base import Strategy, restore_agreed
from baft.traits import Traits

ENTRY = registry.register(registry.Entry(
    name="toy", strategy=f"{__name__}:ToyStrategy", traits=Traits(phases=("persist",)),
    summary="every rank's whole state by `torch.save`, every `every` steps (a test's strategy)",
    projection="blocking"))


class ToyStrategy(Strategy):
    """Blocking ``torch.save`` of the whole captured state, one file per rank and step."""

    name = "toy"

    @property
    def folder(self) -> Path:
        return Path(self.root) / "toy"

    def path(self, step: int, rank: int | None = None) -> Path:
        return self.folder / f"step{step:08d}-rank{rank_world()[0] if rank is None else rank}.pt"

    def after_step(self) -> bool:
        if not self.due(self.state.step):
            return False
        self.write_now(self.state.step)
        return True

    def write_now(self, step: int) -> bool:
        t0 = time.perf_counter()
        events.emit("phase", phase="persist", step=step)
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.path(step)
        tmp = final.with_suffix(".tmp")
        torch.save(self.state.capture(), tmp)
        os.replace(tmp, final)  # whole or absent: a kill mid-write leaves only the .tmp
        self.interval.charge(time.perf_counter() - t0)
        events.emit("checkpoint_saved", step=step, tier="persistent", bytes=final.stat().st_size,
                    seconds=time.perf_counter() - t0, path=str(final))
        return True

    def restore(self) -> int | None:
        t0 = time.perf_counter()
        mine = sorted((int(p.name[4:12]) for p in self.folder.glob(f"step*-rank{rank_world()[0]}.pt")), reverse=True)

        def load(step: int) -> None:
            self.state.restore(torch.load(self.path(step), weights_only=False))

        step = restore_agreed(mine, lambda s: self.path(s).exists(), load, self.control)
        if step is not None:
            events.emit("checkpoint_restored", step=step, tier="persistent", seconds=time.perf_counter() - t0,
                        path=str(self.folder))
        return step
