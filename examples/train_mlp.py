"""A plain data-parallel PyTorch training script, checkpointed with baft, judged by baft-harness.

Each rank trains a copy of a small MLP on its share of every global batch and
averages gradients with an all-reduce (gloo). Nothing here is specific to the
harness except the few ``run.*`` calls of the probe API (``from harness import Session``):
where training starts, where each step begins and ends, and which objects hold
the state (a ``baft.TrainState``).

    baft run examples/mlp-kill.yaml        # run under the harness, killed at a step

Determinism, so the harness can compare bit for bit: one intra-op thread,
deterministic algorithms, batches that are a pure function of (seed, step,
rank), dropout seeded per rank and restored with the RNG state.
"""
from __future__ import annotations

import argparse
import random

import numpy as np
import torch
import torch.distributed as dist

from baft import TrainState

from harness import Session


class Position:
    """The data position: batches are a function of the step, so the step is all there is."""

    def __init__(self) -> None:
        self.next_step = 0

    def state_dict(self) -> dict[str, int]:
        return {"next_step": self.next_step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next_step = int(state["next_step"])


def batch(seed: int, step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + rank)
    x = torch.randn(size, 32, generator=g)
    y = (x[:, :4].sum(dim=1) > 0).long() + (x[:, 4:8].sum(dim=1) > 0).long()
    return x, y


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=16, help="samples per rank and step")
    p.add_argument("--lr", type=float, default=1e-2)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    with Session.from_env() as run:
        seed = run.spec.workload.seed
        rank, world = dist.get_rank(), dist.get_world_size()
        random.seed(seed)  # every RNG the checkpoint holds starts from the seed (an unseeded numpy
        np.random.seed(seed)  # differs between runs: the harness reports it as rng / numpy.keys)
        torch.manual_seed(seed)  # the same initial weights on every rank
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 3))
        torch.manual_seed(seed + 1 + rank)  # dropout differs per rank, reproducibly
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
        position = Position()
        state = TrainState(model=model, optimizer=opt, scheduler=sched, data=position)

        ckpt = run.checkpointer(state)
        start = ckpt.restore_latest()
        run.restored(start, state)
        for step in range(start, run.steps):
            run.begin(step)
            ckpt.begin_iteration()
            x, y = batch(seed, position.next_step, rank, a.batch)
            position.next_step += 1
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            for prm in model.parameters():
                dist.all_reduce(prm.grad)
                prm.grad.div_(world)
            ckpt.before_optimizer_step()
            opt.step()
            sched.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            state.step = step + 1
            run.end(step, float(mean) / world, state)
            ckpt.after_step()
        ckpt.close()


if __name__ == "__main__":
    main()
