"""What the tensor-parallel ranks of a stage hold alike is copied by one of them (issue 15: "a replicated
placement ... is copied by one owner"). Two real gloo ranks on a ``tp`` mesh: the first and third Linear
column/row-wise parallel (DTensor shards), a LayerNorm and a last Linear left plain, the same on both.
TP rank 1's snapshot leaves the plain ones (and their Adam moments) to rank 0; a restore in fresh
processes gives both ranks the exact state of the version, rank 0's plain tensors sent to rank 1; and from the persistent tier (DCP), where rank 1 wrote none of them."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.gloo_ranks import run_phase

RANK = """
import json, os, sys
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from baft import CheckpointConfig, TrainState, events
from baft.strategies import BaftStrategy
from tests.rank_step import state_record, train_step

dist.init_process_group("gloo")
rank = dist.get_rank()
out, phase, start, stop, shards = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
full = init_device_mesh("cpu", (shards, 2), mesh_dim_names=("dp_shard", "tp"))
mesh = full if shards > 1 else full["tp"]
torch.manual_seed(0 if phase == "a" else 99)  # the same init on both TP ranks; phase b starts elsewhere
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6), torch.nn.LayerNorm(6),
                            torch.nn.Linear(6, 3))
parallelize_module(model, full["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
if shards > 1:  # then FSDP2 over dp_shard: the plain ones become 1-D shards that both TP peers hold alike
    from torch.distributed.fsdp import fully_shard
    fully_shard(model, mesh=full["dp_shard"])
state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))
if phase == "c":  # the node's memory is gone: the persistent tier it is
    import shutil
    shutil.rmtree(os.path.join(out, "shm"), ignore_errors=True)
config = CheckpointConfig(strategy="baft", every=2, dir=os.path.join(out, "ckpt"), shm_dir=os.path.join(out, "shm"))
strategy = BaftStrategy(config, state)
strategy.attach(model, mesh=mesh)
snapshots = []
events.subscribe(lambda kind, f: snapshots.append(f["bytes"]) if kind == "snapshot" else None)
if start:
    assert strategy.restore() == start
seen = {start: state_record(state)}
for step in range(start, stop):
    train_step(strategy, state, step, torch.randn(4, 6, generator=torch.Generator().manual_seed(step)))
    seen[step + 1] = state_record(state)
slot = strategy.snap.read_version(stop - 1) if phase == "a" else {}
plain_zero = bool(slot) and all(not t.any() for k, t in slot["model"].items() if k.startswith(("3.", "4.")))
strategy.drain()  # version 2's DCP checkpoint committed
strategy.snap.close()  # a crash: the slots stay
with open(os.path.join(out, f"{phase}-{rank}.json"), "w") as f:
    json.dump({"states": seen, "bytes": snapshots, "plain_zero": plain_zero}, f)
dist.destroy_process_group()
"""


def _phase(tmp_path: Path, phase: str, start: int, stop: int, shards: int) -> dict[int, dict]:
    return run_phase(RANK, tmp_path, phase, str(start), str(stop), str(shards), world=2 * shards)


@pytest.mark.parametrize("shards", [1, 2], ids=["tp", "tp-then-fsdp"])
def test_tp_ranks_copy_the_plain_state_once_and_restore_it_on_both(tmp_path: Path, shards: int) -> None:
    """With FSDP2 over the TP shards (``tp-then-fsdp``, four ranks: rank = shard * 2 + tp rank) the
    LayerNorm and the last Linear are DTensors of the ``dp_shard`` mesh alone, alike on both TP peers of a
    shard: the second peer leaves them to the first just the same."""
    ranks = range(2 * shards)
    a = _phase(tmp_path, "a", 0, 4, shards)
    # TP rank 1 copies only its shards: the LayerNorm and the last Linear (and their moments) are TP rank 0's
    for r0 in range(0, 2 * shards, 2):
        r1 = r0 + 1
        assert a[r1]["plain_zero"] and not a[r0]["plain_zero"], (r0, a[r0]["plain_zero"], a[r1]["plain_zero"])
        assert all(b1 < b0 for b0, b1 in zip(a[r0]["bytes"], a[r1]["bytes"])), (a[r0]["bytes"], a[r1]["bytes"])
    b = _phase(tmp_path, "b", 3, 4, shards)  # fresh processes, another init: restore version 3 (after 3 steps)
    for r in ranks:
        assert b[r]["states"]["3"] == a[r]["states"]["3"], r  # every tensor, the plain ones too on TP rank 1
        assert b[r]["states"]["4"] == a[r]["states"]["4"], r  # and training goes on as before
    # from DCP: TP rank 1 wrote no key of the plain tensors (owned), each rank loads them by name
    c = _phase(tmp_path, "c", 2, 3, shards)
    for r in ranks:
        assert c[r]["states"]["2"] == a[r]["states"]["2"] and c[r]["states"]["3"] == a[r]["states"]["3"], r
