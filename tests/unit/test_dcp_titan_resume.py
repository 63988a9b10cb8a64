"""A job that resumes the way torchtitan's checkpointer does reads baft's persistent tier with stock DCP:
its model and optimizer state come from ``get_state_dict`` (optimizer state flattened, as torchtitan's
optimizer container asks), ``dcp.load`` fills them from the checkpoint, ``set_state_dict`` puts them back.
Two real gloo ranks train under baft with FSDP2 (``dp_shard: 2``) or tensor parallelism (``tp: 2``); a
fresh model and optimizer on the same mesh, initialised otherwise, then resume from baft's checkpoint.

This checks that baft's keys are ``get_state_dict``'s: every tensor ``get_state_dict`` names is in the
checkpoint under that name (baft derives the names from ``named_parameters`` rather than calling it on
every snapshot), and what the resume restores equals what the job held, shard for shard. The optimizer's
hyper-parameters (``param_groups``) are not tensors and baft keeps them in its own metadata (a stock load
never unpickles), so the resume takes them from its own optimizer, as a job restarted with its config does.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.gloo_ranks import run_ranks

RANK = """
import os, sys
import torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from baft import CheckpointConfig, TrainState
from baft.persist import commits as persist
from baft.strategies import BaftStrategy
from tests.rank_step import train_step

dist.init_process_group("gloo")
rank = dist.get_rank()
out, kind = sys.argv[1], sys.argv[2]
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard" if kind == "fsdp" else "tp",))


def build(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3))
    if kind == "fsdp":
        fully_shard(model, mesh=mesh)
    else:
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def local(t):
    return t.to_local().clone() if isinstance(t, DTensor) else t.clone()


def tensors(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from tensors(v, f"{prefix}{k}.")
    elif isinstance(tree, torch.Tensor):
        yield prefix[:-1], tree


model, optimizer = build(0)
state = TrainState(model=model, optimizer=optimizer)
config = CheckpointConfig(strategy="baft", every=2, dir=os.path.join(out, "ckpt"), shm_dir=os.path.join(out, "shm"))
strategy = BaftStrategy(config, state)
strategy.attach(model, mesh=mesh)
for step in range(4):
    seed = 100 + 10 * step + (rank if kind == "fsdp" else 0)  # TP ranks see the same batch
    train_step(strategy, state, step, torch.randn(4, 6, generator=torch.Generator().manual_seed(seed)))
strategy.close()  # persists step 4
options = StateDictOptions(flatten_optimizer_state_dict=True)
held = dict(tensors(dict(zip(("model", "optimizer"), get_state_dict(model, optimizer, options=options)))))
held = {k: local(v) for k, v in held.items()}

# the resume: another initialisation, one step taken so Adam has its state, then torchtitan's load
fresh, fresh_opt = build(7)
fresh(torch.randn(4, 6)).sum().backward()
fresh_opt.step()
fresh_opt.zero_grad()
msd, osd = get_state_dict(fresh, fresh_opt, options=options)
wanted = {"model": msd, "optimizer": {k: v for k, v in osd.items() if isinstance(v, torch.Tensor)}}
names = {k for k, _ in tensors(wanted)}
checkpoint = str(persist.step_dir(os.path.join(out, "ckpt"), 4))
stored = set(FileSystemReader(checkpoint).read_metadata().state_dict_metadata)
missing = sorted(names - stored)
assert not missing, f"get_state_dict names not in baft's checkpoint: {missing}"
assert sum(k.startswith("optimizer.state.") for k in names) == 3 * 4, sorted(names)  # step, exp_avg, exp_avg_sq
dcp.load(wanted, checkpoint_id=checkpoint)
set_state_dict(fresh, fresh_opt, model_state_dict=wanted["model"], optim_state_dict={**osd, **wanted["optimizer"]},
               options=options)
after = dict(tensors(dict(zip(("model", "optimizer"), get_state_dict(fresh, fresh_opt, options=options)))))
assert set(after) == set(held), sorted(set(after) ^ set(held))
bad = [k for k in held if not torch.equal(local(after[k]), held[k])]
assert not bad, f"rank {rank}: resumed tensors differ from the job's: {bad}"
print("RESUMED", len(held), flush=True)  # a forked rank ends with os._exit: unflushed output is lost
dist.destroy_process_group()
"""


@pytest.mark.parametrize("kind", ["fsdp", "tp"])
def test_a_torchtitan_style_resume_reads_bafts_checkpoint_with_stock_dcp(tmp_path: Path, kind: str) -> None:
    results = run_ranks(RANK, str(tmp_path), kind)
    assert all(code == 0 for code, _ in results), [out[-3000:] for _, out in results]
    # 4 parameters and 3 Adam tensors for each of them
    assert all("RESUMED 16" in out for _, out in results), [out[-500:] for _, out in results]
