"""baft's direct persister (``persist_writer: direct``, :mod:`baft.persist.dcpwrite`) on two real gloo ranks: each
rank writes its file from its slot, rank 0 the metadata. A write that fails on one rank commits nothing
and every rank journals why; the next persist commits; what is committed is what the job held, read
with stock DCP; and ``persist_writer: dcp`` (``dcp.save``) writes a checkpoint that loads the same."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gloo_ranks import run_ranks

RANK = """
import json, os, sys
import torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from baft import CheckpointConfig, TrainState, events
from baft.persist import dcpwrite
from baft.persist import commits as persist
from baft.strategies import BaftStrategy
from tests.rank_step import train_step

dist.init_process_group("gloo")
rank = dist.get_rank()
out, writer = sys.argv[1], sys.argv[2]
seen = []
events.subscribe(lambda kind, f: seen.append({"kind": kind, "step": f.get("step"), "reason": f.get("reason")})
                 if kind in ("checkpoint_saved", "checkpoint_failed") else None)
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard",))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3))
fully_shard(model, mesh=mesh)
state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))
config = CheckpointConfig(strategy="baft", every=1, dir=os.path.join(out, "ckpt"), shm_dir=os.path.join(out, f"shm{rank}"),
                          persist_writer=writer)
strategy = BaftStrategy(config, state)
strategy.attach(model, mesh=mesh)
write_rank = dcpwrite.write_rank
calls = []
def failing_once(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:  # rank 1's second persist (version 2) meets a full disk
        raise OSError(28, "No space left on device")
    return write_rank(*args, **kwargs)
if rank == 1:
    dcpwrite.write_rank = failing_once
held = {}
for step in range(4):
    if step == 3:  # version 3 is sealed in this iteration, before its optimizer step: the weights as now
        held = {f"model.{k}": v.to_local().clone() for k, v in model.state_dict().items()}
    train_step(strategy, state, step, torch.randn(4, 6, generator=torch.Generator().manual_seed(10 * step + rank)))
    strategy.drain()
strategy.close()
latest = persist.latest(os.path.join(out, "ckpt"))
wanted = {f"model.{k}": torch.zeros_like(v) for k, v in model.state_dict().items()}  # DTensors: this rank's shards
dcp.load(wanted, storage_reader=FileSystemReader(str(persist.step_dir(os.path.join(out, "ckpt"), 3))))
same = all(torch.equal(wanted[k].to_local(), held[k]) for k in held)
with open(os.path.join(out, f"result-{rank}.json"), "w") as f:
    json.dump({"seen": seen, "latest": latest, "same": same,
               "files": sorted(os.listdir(persist.step_dir(os.path.join(out, "ckpt"), 3)))}, f)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("writer", ["process", "thread", "dcp"])
def test_a_failed_write_on_one_rank_commits_nothing_and_the_next_persist_commits(tmp_path: Path, writer: str) -> None:
    results = run_ranks(RANK, str(tmp_path), writer)
    assert all(code == 0 for code, _ in results), [out[-3000:] for _, out in results]
    for rank in range(2):
        r = json.loads((tmp_path / f"result-{rank}.json").read_text())
        kinds = [(e["kind"], e["step"]) for e in r["seen"]]
        if writer != "dcp":
            assert kinds == [("checkpoint_saved", 1), ("checkpoint_failed", 2), ("checkpoint_saved", 3),
                             ("checkpoint_saved", 4)], (rank, kinds)
            assert "rank 1: OSError" in r["seen"][1]["reason"] and "No space left" in r["seen"][1]["reason"]
            assert "__0_0.distcp" in r["files"] and "__1_0.distcp" in r["files"]
        else:  # dcp.save is never replaced: every persist commits
            assert kinds == [("checkpoint_saved", s) for s in range(1, 5)], (rank, kinds)
        assert r["latest"] == 4 and r["same"], (rank, r)
        assert ".metadata" in r["files"] and "manifest.json" in r["files"]
    assert (tmp_path / "ckpt" / "step-00000002" / "manifest.json").exists() == (writer == "dcp")
