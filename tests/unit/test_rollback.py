"""Hole b: a version is only a step number. Two real gloo ranks train under baft (every 5); rank 1 then loses
its shared memory, so the job falls back to the persistent step 5 while rank 0 still holds versions 6 of the
timeline the job leaves. Those must be forgotten at the restore: a later restore could otherwise take rank
0's old 6 beside rank 1's new 6, a state that never existed."""
from __future__ import annotations

import json
from pathlib import Path

from tests.gloo_ranks import run_ranks

RANK = """
import json, os, sys
import torch, torch.distributed as dist
from baft import CheckpointConfig, TrainState, events
from baft.snapshot.slotfile import COMPLETE
from baft.snapshot.slots import SnapshotBuffer
from baft.strategies import BaftStrategy
from tests.rank_step import train_step

dist.init_process_group("gloo")
rank = dist.get_rank()
out, phase = sys.argv[1], sys.argv[2]
seen = []
events.subscribe(lambda kind, f: seen.append([kind, f.get("step"), f.get("tier"), f.get("versions")])
                 if kind in ("checkpoint_restored", "snapshots_discarded") else None)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
state = TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
shm = os.path.join(out, "shm")
config = CheckpointConfig(strategy="baft", every=5, dir=os.path.join(out, "ckpt"), shm_dir=shm)
strategy = BaftStrategy(config, state)
strategy.attach(model)
start = strategy.restore() or 0
held = sorted(i.version for i in SnapshotBuffer(__import__("pathlib").Path(shm), rank).open_existing() if i.state == COMPLETE)
for step in range(start, 7 if phase == "a" else start):
    train_step(strategy, state, step, torch.randn(4, 8))
strategy.drain()
strategy.snap.close()  # a crash: the slots stay
with open(os.path.join(out, f"{phase}-{rank}.json"), "w") as f:
    json.dump({"seen": seen, "held": held}, f)
dist.destroy_process_group()
"""


def test_a_rollback_forgets_the_newer_versions_of_the_timeline_it_leaves(tmp_path: Path) -> None:
    assert all(code == 0 for code, _ in run_ranks(RANK, str(tmp_path), "a"))
    for f in (tmp_path / "shm").glob("rank-00001.slot*"):
        f.unlink()  # rank 1's memory is gone (its node was replaced)
    results = run_ranks(RANK, str(tmp_path), "b")
    assert all(code == 0 for code, _ in results), [out for _, out in results]
    b = {r: json.loads((tmp_path / f"b-{r}.json").read_text()) for r in range(2)}
    for r in range(2):
        assert ["checkpoint_restored", 5, "persistent", None] in b[r]["seen"], b[r]
        assert all(v <= 5 for v in b[r]["held"]), b[r]  # nothing of the old timeline is complete any more
    assert ["snapshots_discarded", None, None, [6]] in b[0]["seen"]
