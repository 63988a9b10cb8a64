"""An elastic restart that memory cannot serve restores from the persistent tier, in a world numbered
otherwise. Four real gloo ranks in stage-major order (``pp`` outermost: ranks 0, 1 hold stage 0, ranks 2, 3
stage 1; two replicas each) persist; two ranks (one replica) then restore with no shared memory left. New
rank 1 holds stage 1 where old rank 1 held stage 0: a restore that took the record of the old rank with its
own number loaded stage 0's names into stage 1 ("Missing key(s) in state_dict: block1.weight ...", the
failure a loaded CI machine met in ``scenarios/ci/elastic-stage-major.yaml`` when replication had stopped).
Each checkpoint's manifest records every rank's place and replica index; the restore takes the old rank of
its own place."""
from __future__ import annotations

import json
from pathlib import Path

from tests.gloo_ranks import run_phase

RANK = """
import json, os, sys
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from baft import CheckpointConfig, TrainState, events
from baft.strategies import BaftStrategy
from tests.rank_step import train_step

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out, phase, start, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
replicas = world // 2
mesh = init_device_mesh("cpu", (2, replicas), mesh_dim_names=("pp", "dp_replicate"))  # stage-major
stage = mesh.get_coordinate()[0]

class Stage(torch.nn.Module):  # each stage names its tensors after itself, as a pipeline's stages do
    def __init__(self, s):
        super().__init__()
        self.add_module(f"block{s}", torch.nn.Linear(8, 8))
    def forward(self, x):
        return next(iter(self.children()))(x)

torch.manual_seed(100 + world)  # a start other than the saved one: a restore that does nothing shows
model = Stage(stage)
state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))
restored = []
events.subscribe(lambda kind, f: restored.append([f["step"], f["tier"]]) if kind == "checkpoint_restored" else None)
config = CheckpointConfig(strategy="baft", every=2, dir=os.path.join(out, "ckpt"), shm_dir=os.path.join(out, f"shm-{phase}"))
strategy = BaftStrategy(config, state)
strategy.attach(model, mesh=mesh)
if start:
    assert strategy.restore() == start, restored
seen = {}
def record(step):
    seen[step] = {k: v.tolist() for k, v in model.state_dict().items()}
    seen[step].update({f"opt.{k}": v.tolist() for s in state.optimizer.state.values() for k, v in s.items()})
    seen[step]["rng"] = torch.get_rng_state()[:16].tolist()
record(start)
for step in range(start, stop):  # every replica of a stage sees the same batch: their states stay equal
    train_step(strategy, state, step, torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * stage + step)))
    record(step + 1)
strategy.close()  # persists the last step; each phase's shared memory is its own
with open(os.path.join(out, f"{phase}-{rank}.json"), "w") as f:
    json.dump({"stage": stage, "restored": restored, "states": seen}, f)
dist.destroy_process_group()
"""


def _phase(tmp_path: Path, phase: str, world: int, start: int, stop: int) -> dict[int, dict]:
    return run_phase(RANK, tmp_path, phase, str(start), str(stop), world=world)


def test_a_stage_major_shrink_restores_each_stage_from_its_own_old_ranks_persistent_record(tmp_path: Path) -> None:
    a = _phase(tmp_path, "a", 4, 0, 4)
    manifest = json.loads((tmp_path / "ckpt" / "step-00000004" / "manifest.json").read_text())
    assert manifest["places"] == [["stage0", 0], ["stage0", 1], ["stage1", 0], ["stage1", 1]]
    b = _phase(tmp_path, "b", 2, 4, 5)
    for new, old in ((0, 0), (1, 2)):  # new rank 1 holds stage 1: old rank 2's (stage 1, replica 0)
        assert b[new]["stage"] == a[old]["stage"] == new
        assert b[new]["restored"] == [[4, "persistent"]]
        assert b[new]["states"]["4"] == a[old]["states"]["4"], new  # weights, Adam's moments, the RNG
