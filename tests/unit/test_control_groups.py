"""baft's agreements never ride on the job's own groups (issue 37, item 1): on a GPU job those are NCCL
groups, and NCCL refuses the CPU tensors an agreement sends (the restore's version, the persist's, the
layout check, the replicas' sum of a restored slot, the TP peers' shared state read from a slot).

Four real ranks whose every group the job makes is ``refusecpu`` (:mod:`tests.refusing_backend`: gloo
underneath, a CPU tensor that baft's own code sends through it refused and logged), on a
``dp_replicate`` x ``tp`` mesh (TP shards, two replicas that each copy half of the state): baft snapshots
and persists, restores from shared memory in fresh processes (the replicas' halves summed, TP rank 0's
shared tensors sent to its peer), restores after one replica is gone for good (the elastic path:
another number of replicas), and from the persistent tier. Every phase must leave the refusal log empty
and restore the exact state it saved."""
from __future__ import annotations

import os
from pathlib import Path

from tests.gloo_ranks import run_phase

RANK = """
import json, os, sys
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from baft import CheckpointConfig, TrainState
from baft.strategies import BaftStrategy
from tests.rank_step import state_record, train_step
from tests.refusing_backend import register

out, phase, start, stop, replicas = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
os.environ["BAFT_REFUSED_LOG"] = os.path.join(out, "refused.log")
register()
dist.init_process_group("refusecpu")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (replicas, 2), mesh_dim_names=("dp_replicate", "tp"))
torch.manual_seed(0 if phase == "a" else 99)  # the same init everywhere; later phases start elsewhere
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6), torch.nn.LayerNorm(6),
                            torch.nn.Linear(6, 3))
parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))
if phase == "d":  # the nodes' memory is gone: the persistent tier it is
    import shutil
    shutil.rmtree(os.path.join(out, "shm"), ignore_errors=True)
config = CheckpointConfig(strategy="baft", every=2, dir=os.path.join(out, "ckpt")).with_baft(shm_dir=os.path.join(out, "shm"))
strategy = BaftStrategy(config, state)
strategy.attach(model, mesh=mesh)
restored = strategy.restore() if start else None
seen = {start: state_record(state)}
for step in range(start, stop):  # the same batch on every replica: they stay alike without a gradient sum
    train_step(strategy, state, step, torch.randn(4, 6, generator=torch.Generator().manual_seed(step)))
    seen[step + 1] = state_record(state)
strategy.drain()
strategy.snap.close()  # a crash: the slots stay
with open(os.path.join(out, f"{phase}-{rank}.json"), "w") as f:
    json.dump({"states": seen, "restored": restored}, f)
dist.destroy_process_group()
"""


def _phase(out: Path, phase: str, start: int, stop: int, replicas: int) -> dict[int, dict]:
    return run_phase(RANK, out, phase, str(start), str(stop), str(replicas), world=2 * replicas)


def _refused(out: Path) -> list[str]:
    log = out / "refused.log"
    return log.read_text().splitlines() if log.exists() else []


def test_snapshot_persist_restore_and_elastic_paths_send_nothing_through_the_jobs_groups(tmp_path: Path) -> None:
    a = _phase(tmp_path, "a", 0, 4, 2)  # snapshots every step, a persist every 2
    assert _refused(tmp_path) == []
    b = _phase(tmp_path, "b", 3, 4, 2)  # fresh processes: version 3 from shared memory
    assert _refused(tmp_path) == []
    for r in range(4):
        assert b[r]["restored"] == 3, b[r]["restored"]
        assert b[r]["states"]["3"] == a[r]["states"]["3"], r  # both replicas' halves, TP rank 0's shared state
    c = _phase(tmp_path, "c", 3, 4, 1)  # one replica gone for good: two ranks restore from four ranks' slots
    assert _refused(tmp_path) == []
    for r in range(2):
        assert c[r]["restored"] == 3 and c[r]["states"]["3"] == a[r]["states"]["3"], r
    d = _phase(tmp_path, "d", 2, 3, 2)  # no shared memory left: the persistent tier's version 2
    assert _refused(tmp_path) == []
    for r in range(4):
        assert d[r]["restored"] == 2 and d[r]["states"]["2"] == a[r]["states"]["2"], r


RANK_SELF_CHECK = """
import os, sys
import torch, torch.distributed as dist
from baft.mesh.collective import all_gather
from tests.refusing_backend import Refused, register
os.environ["BAFT_REFUSED_LOG"] = sys.argv[1]
register()
dist.init_process_group("refusecpu")
t = torch.ones(2)
dist.all_reduce(t)  # a job's own collective of a CPU tensor goes through
assert t.tolist() == [2.0, 2.0], t
try:
    all_gather(dist.get_rank())  # baft's, on the job's group: refused
except Refused:
    print("refused")
from baft.mesh.control import host_twin, own_group, takes_host_tensors
control = own_group()
assert takes_host_tensors(control) and not takes_host_tensors(None)  # gloo; the job's refusing default group
twin = host_twin(dist.group.WORLD, control)
assert twin is not dist.group.WORLD and takes_host_tensors(twin)
assert sorted(dist.get_process_group_ranks(twin)) == [0, 1]
assert host_twin(control, control) is control  # a gloo group is its own twin
assert all_gather(dist.get_rank(), twin) == [0, 1]
from harness.worker.preemption import TermSignal
assert TermSignal().agreed() is False  # the built-in workload's preemption agreement: over a group of its own
dist.destroy_process_group()
"""


def test_the_refusing_backend_refuses_bafts_cpu_tensors_only(tmp_path: Path) -> None:
    """The test above could pass with a backend that refused nothing: this one must refuse baft's own
    collective on the job's group and let the job's pass; baft's groups are gloo twins of the job's, and
    the built-in workload's preemption agreement goes over a group of its own too."""
    from tests.gloo_ranks import run_ranks

    log = tmp_path / "refused.log"
    results = run_ranks(RANK_SELF_CHECK, str(log), world=2)
    assert all(code == 0 for code, _ in results), [text for _, text in results]
    assert all("refused" in text for _, text in results), [text for _, text in results]
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and all("allgather" in line and f"{os.sep}baft{os.sep}mesh{os.sep}collective.py" in line
                                   for line in lines), lines


RANK_NO_MESH = """
import json, os, sys
import torch, torch.distributed as dist
from baft import CheckpointConfig, TrainState
from baft.strategies import BaftStrategy
from tests.rank_step import train_and_record
from tests.refusing_backend import register

out, phase, start, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
os.environ["BAFT_REFUSED_LOG"] = os.path.join(out, "refused.log")
register()
dist.init_process_group("refusecpu")  # the default group: what NCCL is to a GPU job
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0 if phase == "a" else 99)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))
if phase == "d":
    import shutil
    shutil.rmtree(os.path.join(out, "shm"), ignore_errors=True)
config = CheckpointConfig(strategy="baft", every=2, dir=os.path.join(out, "ckpt")).with_baft(shm_dir=os.path.join(out, "shm"))
strategy = BaftStrategy(config, state)
strategy.attach(model, replica=rank, replicas=world)  # no mesh: every rank a replica, over the default group
restored = strategy.restore() if start else None
train_and_record(strategy, state, start, stop, out, f"{phase}-{rank}", restored=restored)
dist.destroy_process_group()
"""


def test_replicas_without_a_mesh_restore_through_bafts_own_group(tmp_path: Path) -> None:
    """``attach(replicas=N)`` without a mesh (issue 53): the replicas' halves of a restored slot are summed over
    a host-tensor group of baft's, not the default group (NCCL on a GPU job). Every restore path: shared
    memory (the sum), an elastic restart with fewer replicas, the persistent tier."""
    def phase(name: str, start: int, stop: int, world: int) -> dict[int, dict]:
        return run_phase(RANK_NO_MESH, tmp_path, name, str(start), str(stop), world=world)

    a = phase("a", 0, 4, 2)
    assert _refused(tmp_path) == []
    b = phase("b", 3, 4, 2)  # each replica's slot holds half of the state: summed on restore
    assert _refused(tmp_path) == []
    for r in range(2):
        assert b[r]["restored"] == 3 and b[r]["states"]["3"] == a[r]["states"]["3"], r
    c = phase("c", 3, 4, 1)  # one replica gone for good
    assert _refused(tmp_path) == []
    assert c[0]["restored"] == 3 and c[0]["states"]["3"] == a[0]["states"]["3"]
    d = phase("d", 2, 3, 2)  # no shared memory: the persistent tier
    assert _refused(tmp_path) == []
    for r in range(2):
        assert d[r]["restored"] == 2 and d[r]["states"]["2"] == a[r]["states"]["2"], r
