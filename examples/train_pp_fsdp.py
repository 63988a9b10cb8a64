"""A pipeline-parallel script in the torchtitan style, checkpointed with baft, judged by baft-harness.

Four ranks on one DeviceMesh ``(pp=2, dp_shard=2)``, the pipeline dimension outermost: each of the two
pipeline stages is a slice of one small MLP stack, sharded over two ranks with FSDP2 (``fully_shard``),
driven by ``torch.distributed.pipelining``'s 1F1B schedule. baft attaches to the stage with the mesh, so
it knows which ranks hold the same state and which hold different shards; its checkpoint holds each
rank's shards and persists them as DTensors (a stock ``dcp.load`` reads them unsharded). What is the
harness's: the few ``run.*`` calls of the probe API (``from harness import Session``).

    baft run examples/pp-fsdp-kill.yaml    # killed in the middle of a snapshot, judged bit for bit
"""
from __future__ import annotations

import argparse
import random

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from baft import TrainState

from harness import Session

WIDTH, LAYERS, CLASSES = 64, 4, 4


class Position:
    """Batches are a function of the step: the next step is the whole data position."""

    def __init__(self) -> None:
        self.next_step = 0

    def state_dict(self) -> dict[str, int]:
        return {"next_step": self.next_step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next_step = int(state["next_step"])


def build_stage(seed: int, stage: int, stages: int) -> torch.nn.Module:
    """The whole model from ``seed``, then the layers of ``stage`` (every stage count, the same weights)."""
    torch.manual_seed(seed)
    layers = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(), torch.nn.Dropout(0.1))
              for _ in range(LAYERS)]
    head = torch.nn.Linear(WIDTH, CLASSES)
    per = LAYERS // stages
    mine = layers[stage * per:(stage + 1) * per]
    return torch.nn.Sequential(*mine, *([head] if stage == stages - 1 else []))


def batch(seed: int, step: int, shard: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 101 + shard)
    x = torch.randn(size, WIDTH, generator=g)
    return x, (x[:, :CLASSES] * 3).argmax(dim=1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--microbatch-size", type=int, default=8)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    with Session.from_env() as run:
        seed = run.spec.workload.seed
        mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("pp", "dp_shard"))
        stage_index, shard = mesh["pp"].get_local_rank(), mesh["dp_shard"].get_local_rank()
        random.seed(seed)
        np.random.seed(seed)
        module = build_stage(seed, stage_index, 2)
        fully_shard(module, mesh=mesh["dp_shard"])
        torch.manual_seed(seed + 1 + dist.get_rank())  # dropout differs per rank, reproducibly
        stage = PipelineStage(module, stage_index, 2, torch.device("cpu"), group=mesh["pp"].get_group())
        loss_fn = torch.nn.functional.cross_entropy
        schedule = Schedule1F1B(stage, n_microbatches=a.microbatches, loss_fn=loss_fn)
        opt = torch.optim.AdamW(module.parameters(), lr=3e-3)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
        position = Position()
        state = TrainState(model=module, optimizer=opt, scheduler=sched, data=position)

        ckpt = run.checkpointer(state)
        ckpt.attach(stage, mesh=mesh)  # baft profiles the stage's bubbles; the mesh says who holds what
        start = ckpt.restore_latest()
        run.restored(start, state)
        for step in range(start, run.steps):
            run.begin(step)
            ckpt.begin_iteration()
            x, y = batch(seed, position.next_step, shard, a.microbatches * a.microbatch_size)
            position.next_step += 1
            opt.zero_grad(set_to_none=True)
            losses: list[torch.Tensor] = []
            if stage_index == 0:
                schedule.step(x)
            else:
                schedule.step(target=y, losses=losses)
            ckpt.before_optimizer_step()  # FSDP2 has reduce-scattered the gradients
            opt.step()
            sched.step()
            loss = None
            if losses:
                mean = torch.stack([l.detach() for l in losses]).mean()
                dist.all_reduce(mean, group=mesh["dp_shard"].get_group())
                loss = float(mean) / mesh["dp_shard"].size()
            state.step = step + 1
            run.end(step, loss, state)
            ckpt.after_step()
        ckpt.close()


if __name__ == "__main__":
    main()
