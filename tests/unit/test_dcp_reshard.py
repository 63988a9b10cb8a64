"""Reshardable persistence: baft's persistent tier writes DTensors as DTensors, so DCP stores whole tensors
from the shards. Real gloo ranks train a model sharded with FSDP2 (mesh ``dp_shard: 2``; or torchtitan's 2-D
layout, tensor parallelism over ``tp: 2`` and then FSDP2 over ``dp_shard: 2``, four ranks) under the baft
strategy; then, in one process without torch.distributed, stock ``dcp.load`` reads the checkpoint into an
unsharded model's state dict, and baft's own restore brings the whole training state back into an
unsharded model and optimizer: both give the tensors the job held (gathered with ``full_tensor``)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from baft import CheckpointConfig, TrainState
from baft.config import BaftConfig
from baft.persist import commits as persist
from baft.strategies import BaftStrategy

from tests.gloo_ranks import run_ranks

RANK = """
import os, sys
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from baft import CheckpointConfig, TrainState
from baft.strategies import BaftStrategy
from tests.rank_step import train_step

dist.init_process_group("gloo")
rank = dist.get_rank()
out, tp = sys.argv[1], int(sys.argv[2])
mesh = init_device_mesh("cpu", (2, tp), mesh_dim_names=("dp_shard", "tp"))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3))
if tp > 1:  # first TP (the hidden layer split over tp), then FSDP2 shards those shards: 2-D DTensors
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
fully_shard(model, mesh=mesh["dp_shard"])
shard = mesh["dp_shard"].get_local_rank()  # tensor-parallel peers see the same data
state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))
config = CheckpointConfig(strategy="baft", every=2, dir=os.path.join(out, "ckpt"), shm_dir=os.path.join(out, "shm"))
strategy = BaftStrategy(config, state)
strategy.attach(model, mesh=mesh)
for step in range(4):
    train_step(strategy, state, step, torch.randn(4, 6, generator=torch.Generator().manual_seed(100 + 10 * step + shard)))
strategy.close()  # persists step 4
full = {"model": {k: v.full_tensor() for k, v in model.state_dict().items()},
        "moments": {i: {k: v.full_tensor() for k, v in s.items() if k != "step"}
                    for i, s in enumerate(state.optimizer.state.values())}}
if rank == 0:
    torch.save(full, os.path.join(out, "full.pt"))
dist.destroy_process_group()
"""


def plain_model() -> torch.nn.Module:
    torch.manual_seed(5)  # other weights than the job's: a load that does nothing shows
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3))


@pytest.mark.parametrize("tp", [1, 2], ids=["fsdp", "tp-then-fsdp"])
def test_an_fsdp_checkpoint_loads_into_an_unsharded_model_in_one_process(tmp_path: Path, tp: int) -> None:
    results = run_ranks(RANK, str(tmp_path), str(tp), world=2 * tp)
    assert all(code == 0 for code, _ in results), [out for _, out in results]
    full = torch.load(tmp_path / "full.pt", weights_only=True)
    root = tmp_path / "ckpt"
    assert persist.committed_steps(root)[0] == 4

    # stock DCP, no process group: the whole tensors under their names (``model.<fqn>``, get_state_dict's keys)
    model = plain_model()
    sd = {f"model.{k}": torch.empty_like(v) for k, v in model.state_dict().items()}
    dcp.load(sd, checkpoint_id=str(persist.step_dir(root, 4)), no_dist=True)
    for k, v in full["model"].items():
        assert torch.equal(sd[f"model.{k}"], v), k

    # baft's own restore into an unsharded model and optimizer (the shared memory is another job's)
    model = plain_model()
    state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))
    strategy = BaftStrategy(CheckpointConfig(strategy="baft", every=2, dir=str(root), baft=BaftConfig(shm_dir=str(tmp_path / "none"))),
                            state)
    strategy.attach(model)
    assert strategy.restore() == 4 and state.step == 4
    for k, v in model.state_dict().items():
        assert torch.equal(v, full["model"][k]), k
    for i, s in enumerate(state.optimizer.state.values()):
        assert torch.equal(s["exp_avg"], full["moments"][i]["exp_avg"]) and int(s["step"]) == 4
        assert torch.equal(s["exp_avg_sq"], full["moments"][i]["exp_avg_sq"])
    strategy.close()
