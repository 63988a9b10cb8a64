"""DTensor state (FSDP2 on two real gloo ranks): a checkpoint holds each rank's local shards, restores them
into the same DTensors (parameters and Adam's moments), and refuses shards of another sharding."""
from __future__ import annotations

import json
from pathlib import Path

from tests.gloo_ranks import run_ranks

RANK = """
import json, sys
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from baft import CheckpointConfig, TrainState, BaftError
from baft.strategies import BaftStrategy

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard",))

def build(seed):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3))  # 10 rows: 5 per rank
    fully_shard(m, mesh=mesh)
    return m, torch.optim.Adam(m.parameters(), lr=0.01)

def train(m, opt, steps):
    for s in range(steps):
        torch.manual_seed(1000 + 10 * s + rank)
        m(torch.randn(4, 6)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

m, opt = build(0)
train(m, opt, 3)
saved = TrainState(model=m, optimizer=opt).capture(only=("model", "optimizer"))
out = {"plain": all(not isinstance(v, DTensor) for v in saved["model"].values())
       and all(not isinstance(v, DTensor) for st in saved["optimizer"]["state"].values() for v in st.values()),
       "shapes": {k: list(v.shape) for k, v in saved["model"].items()}}
saved = {"model": {k: v.clone() for k, v in saved["model"].items()},
         "optimizer": {"state": {i: {k: v.clone() for k, v in st.items()} for i, st in saved["optimizer"]["state"].items()},
                       "param_groups": saved["optimizer"]["param_groups"]},
         "step": {"step": 3}}
train(m, opt, 2)  # where the job got to
expect = [p.to_local().clone() for p in m.parameters()]

m2, opt2 = build(7)  # a fresh process: other weights, no optimizer state yet
strategy = BaftStrategy(CheckpointConfig(strategy="baft", dir=sys.argv[1] + "/ck", shm_dir=sys.argv[1] + "/shm"),
                        TrainState(model=m2, optimizer=opt2))
strategy.attach(m2)  # before the first forward, when FSDP2 has not registered its state-dict hooks yet
out["boundary"] = strategy.snap._layout_at_boundary
strategy.snap.close()
TrainState(model=m2, optimizer=opt2).restore(saved)
train(m2, opt2, 2)
out["equal"] = all(torch.equal(a, p.to_local()) for a, p in zip(expect, m2.parameters()))
out["dtensor_moments"] = all(isinstance(v, DTensor) for st in opt2.state.values() for k, v in st.items() if k != "step")
wrong = {**saved, "model": {k: torch.zeros(v.shape[0] + 1, *v.shape[1:]) for k, v in saved["model"].items()}}
try:
    TrainState(model=m2, optimizer=opt2).restore(wrong)
    out["refused"] = None
except BaftError as e:
    out["refused"] = str(e)
with open(sys.argv[1] + f"/out-{rank}.json", "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


def test_fsdp_shards_are_captured_local_and_restored_into_the_same_dtensors(tmp_path: Path) -> None:
    results = run_ranks(RANK, str(tmp_path))
    assert all(code == 0 for code, _ in results), [out for _, out in results]
    for r in range(2):
        out = json.loads((tmp_path / f"out-{r}.json").read_text())
        # 10 rows split 5 + 5, 3 rows (uneven) 2 + 1
        assert out["plain"] and out["shapes"]["0.weight"] == [5, 6] and out["shapes"]["2.weight"] == [[2, 1][r], 10]
        assert out["equal"] and out["dtensor_moments"]
        assert out["boundary"]  # FSDP2's state dict is never taken inside a bubble (it reshards: a hang)
        assert "does not fit this rank's shard (5, 6) of (10, 6)" in out["refused"]
