"""Hole g: a checkpoint is journaled as saved on a rank only once rank 0 has committed it. Two real gloo
processes; rank 0's commit of step 1 fails (its disk refuses the manifest) while rank 1 wrote its shard
fine; step 2 commits."""
from __future__ import annotations

import json
from pathlib import Path

from tests.gloo_ranks import run_ranks

RANK = """
import json, os, sys
import torch, torch.distributed as dist
from baft import CheckpointConfig, TrainState, events, persist
from baft.strategies import SyncStrategy

dist.init_process_group("gloo")
rank = dist.get_rank()
commit = persist.commit
def refuse(*args, **kwargs):
    raise OSError(28, "No space left on device")
seen = []
events.subscribe(lambda kind, fields: seen.append({"kind": kind, **{k: v for k, v in fields.items() if k in ("step", "reason")}})
                 if kind in ("checkpoint_saved", "checkpoint_failed") else None)
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
state = TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), step=1)
strategy = SyncStrategy(CheckpointConfig(strategy="sync", every=1, dir=sys.argv[1]), state)
if rank == 0:
    persist.commit = refuse  # what SyncStrategy calls to make the step the latest
strategy.save(1)  # rank 0 cannot commit step 1
persist.commit = commit
state.step = 2
strategy.save(2)  # this one commits
with open(os.path.join(sys.argv[1], f"events-{rank}.json"), "w") as f:
    json.dump(seen, f)
dist.destroy_process_group()
"""


def test_no_rank_journals_a_checkpoint_saved_that_rank_0_could_not_commit(tmp_path: Path) -> None:
    results = run_ranks(RANK, str(tmp_path))
    assert all(code == 0 for code, _ in results), [out for _, out in results]
    for rank in range(2):
        seen = json.loads((tmp_path / f"events-{rank}.json").read_text())
        assert [(e["kind"], e["step"]) for e in seen] == [("checkpoint_failed", 1), ("checkpoint_saved", 2)], (rank, seen)
        assert "rank 0 commit" in seen[0]["reason"] and "No space left" in seen[0]["reason"]
