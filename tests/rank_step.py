"""One training iteration with a checkpoint strategy's hooks, for the rank scripts of the gloo tests
(``tests.gloo_ranks``): the hooks in the order a training loop calls them, on a toy model."""
from __future__ import annotations

from typing import Any

import torch


def train_step(strategy: Any, state: Any, step: int, inputs: torch.Tensor, *, after_begin: Any = None) -> None:
    """Iteration ``step`` on ``inputs`` (a squared-output loss); ``after_begin()`` runs once the step
    boundary's hook has (a test's way to interfere with that iteration's snapshot)."""
    strategy.begin_iteration()
    if after_begin is not None:
        after_begin()
    state.model(inputs).pow(2).mean().backward()
    strategy.before_optimizer_step()
    state.optimizer.step()
    state.optimizer.zero_grad()
    state.step = step + 1
    strategy.after_step()


def state_record(state: Any) -> dict[str, Any]:
    """Every model and optimizer tensor of a rank (its local shard of a DTensor) as lists, by name: what the
    phases of a rank test compare bit for bit."""
    from baft.state.dtensor import local_view

    out = {k: local_view(v).tolist() for k, v in state.model.state_dict().items()}
    out.update({f"opt.{i}.{k}": local_view(v).tolist() for i, st in state.optimizer.state_dict()["state"].items()
                for k, v in st.items()})
    return out


def train_and_record(strategy: Any, state: Any, start: int, stop: int, out: str, name: str, **extra: Any) -> None:
    """Steps ``start`` to ``stop`` on the same batch everywhere (replicas stay alike without a gradient sum),
    then what a crash leaves (the persister drained, the slots kept): ``OUT/NAME.json`` holds every step's
    :func:`state_record` and ``extra``."""
    import json
    import os

    seen = {start: state_record(state)}
    for step in range(start, stop):
        train_step(strategy, state, step, torch.randn(4, 6, generator=torch.Generator().manual_seed(step)))
        seen[step + 1] = state_record(state)
    strategy.drain()
    strategy.snap.close()
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump({"states": seen, **extra}, f)
