"""Hole d: an elastic restart to fewer data-parallel replicas, but more than one. Three real gloo ranks (one
stage, three replicas, each copying its own third of the tensors) snapshot into shared memory; two ranks
then restore from the three shares (the resized path), train on with each copying its half, and a second
restart of the two restores again. The slot files of the two are the files the first two of the three
wrote, of the same size, so they were reused as they were: a tensor the old rank owned and the new one
does not kept its old bytes, and the sum of the two shares was corrupt."""
from __future__ import annotations

from pathlib import Path

from tests.gloo_ranks import run_phase

RANK = """
import json, os, sys
import torch, torch.distributed as dist
from baft import CheckpointConfig, TrainState, events
from baft.strategies import BaftStrategy
from tests.rank_step import train_step

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out, phase, start, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
restored = []
events.subscribe(lambda kind, f: restored.append([f["step"], f.get("resized_from")])
                 if kind == "checkpoint_restored" else None)
torch.manual_seed(100 + world)  # a start other than the saved one: a restore that does nothing shows
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4), torch.nn.Linear(4, 2))
state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))
config = CheckpointConfig(strategy="baft", every=1000, dir=os.path.join(out, "ckpt"), shm_dir=os.path.join(out, "shm"))
strategy = BaftStrategy(config, state)
strategy.attach(model, replica=rank, replicas=world)
if start:
    assert strategy.restore() == start, restored
seen = {}
def record(step):
    seen[step] = {k: v.tolist() for k, v in model.state_dict().items()}
    seen[step].update({f"opt.{i}.{k}": v.tolist() for i, s in state.optimizer.state.items()
                       for k, v in s.items()})
record(start)
for step in range(start, stop):
    train_step(strategy, state, step, torch.randn(4, 8, generator=torch.Generator().manual_seed(step)))  # every
    record(step + 1)  # replica sees the same batch: their states stay equal
strategy.snap.close()  # a crash: nothing persisted at the end, the slots stay
with open(os.path.join(out, f"{phase}-{rank}.json"), "w") as f:
    json.dump({"restored": restored, "states": seen}, f)
dist.destroy_process_group()
"""


def _phase(tmp_path: Path, phase: str, world: int, start: int, stop: int) -> dict[int, dict]:
    return run_phase(RANK, tmp_path, phase, str(start), str(stop), world=world)


def test_a_shrink_to_two_replicas_restores_exact_state_twice(tmp_path: Path) -> None:
    first = 3
    a = _phase(tmp_path, "a", first, 0, 4)  # versions 1..3 sealed by every rank (version 3 = after 3 steps)
    b = _phase(tmp_path, "b", 2, 3, 6)
    for r in range(2):
        assert b[r]["restored"] == [[3, first]]
        assert b[r]["states"]["3"] == a[r]["states"]["3"]  # the three shares sum to the whole
    c = _phase(tmp_path, "c", 2, 5, 6)
    for r in range(2):
        assert c[r]["restored"] == [[5, None]]
        assert c[r]["states"]["5"] == b[r]["states"]["5"], r  # no byte of the old ownership left
