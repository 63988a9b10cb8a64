"""DTensor state is persisted from the slot where it lies (issue 53): ``DTensor.from_local`` over a slot's host
views, on a CUDA mesh, copies each shard to the GPU (and the writer copied it back): the whole rank's state
through PCIe twice per persist, from the persister thread, and the zero-copy write from the slot lost.

Two real ranks (gloo) with tensor-parallel DTensor state persist every step; a spy on ``DTensor.from_local``
counts the host tensors it is handed while a persist builds its state dict (on a CUDA mesh each would be
moved). Then fresh processes, with the nodes' memory gone, restore from the persistent tier the exact state."""
from __future__ import annotations

from pathlib import Path

from tests.gloo_ranks import run_phase

RANK = """
import inspect, json, os, sys
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from baft import CheckpointConfig, TrainState
from baft.strategies import BaftStrategy
from tests.rank_step import train_and_record

out, phase, start, stop, writer = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
torch.manual_seed(0 if phase == "a" else 99)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6))
parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))
moved = []
real = DTensor.from_local.__func__ if hasattr(DTensor.from_local, "__func__") else DTensor.from_local

def spy(local, *args, **kwargs):
    if not local.is_meta and any(f.function == "to_state_dict" for f in inspect.stack()[1:6]):
        moved.append(local.numel() * local.element_size())  # on a CUDA mesh: copied to the GPU
    return real(local, *args, **kwargs)

DTensor.from_local = staticmethod(spy)
if phase == "b":
    import shutil
    shutil.rmtree(os.path.join(out, "shm"), ignore_errors=True)
config = CheckpointConfig(strategy="baft", every=1, dir=os.path.join(out, "ckpt")).with_baft(
    shm_dir=os.path.join(out, "shm"), writer=writer)
strategy = BaftStrategy(config, state)
strategy.attach(model, mesh=mesh)
restored = strategy.restore() if start else None
train_and_record(strategy, state, start, stop, out, f"{phase}-{rank}", restored=restored, moved=moved)
dist.destroy_process_group()
"""


def test_dtensor_state_is_persisted_from_the_slot_without_becoming_a_dtensor(tmp_path: Path) -> None:
    a = run_phase(RANK, tmp_path, "a", "0", "3", "process", world=2)
    for r in range(2):
        assert a[r]["moved"] == [], f"rank {r}: {len(a[r]['moved'])} host shards handed to DTensor.from_local"
    b = run_phase(RANK, tmp_path, "b", "2", "3", "process", world=2)
    for r in range(2):
        assert b[r]["restored"] == 2 and b[r]["states"]["2"] == a[r]["states"]["2"], r
