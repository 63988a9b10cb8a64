"""Hole g: a checkpoint is journaled as saved on a rank only once rank 0 has committed it. Two real gloo
processes; rank 0's commit of step 1 fails (its disk refuses the manifest) while rank 1 wrote its shard
fine; step 2 commits."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gloo_ranks import run_ranks

PRELUDE = """
import json, os, sys
import torch, torch.distributed as dist
from baft import CheckpointConfig, TrainState, events
from baft.persist import dcpformat
from baft.persist import commits as persist
from baft.strategies import AsyncDcpStrategy, CheckFreqStrategy, SyncStrategy

dist.init_process_group("gloo")
rank = dist.get_rank()
def refuse(*args, **kwargs):
    raise OSError(28, "No space left on device")
seen = []
events.subscribe(lambda kind, fields: seen.append({"kind": kind, **{k: v for k, v in fields.items() if k in ("step", "reason")}})
                 if kind in ("checkpoint_saved", "checkpoint_failed") else None)
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
state = TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), step=1)
"""

RANK = PRELUDE + """
commit = persist.commit
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


ASYNC = PRELUDE + """
name = sys.argv[2]
module = dcpformat if name == "async-dcp" else persist
commit = module.commit
cls = AsyncDcpStrategy if name == "async-dcp" else CheckFreqStrategy
strategy = cls(CheckpointConfig(strategy=name, every=1, dir=sys.argv[1]), state)
strategy.attach(model)
if rank == 0:
    module.commit = refuse  # what the strategy calls on rank 0 to make the step the latest
strategy.after_step()  # saves step 1 in the background
strategy.drain()
module.commit = commit
state.step = 2
strategy.after_step()
strategy.close()
with open(os.path.join(sys.argv[1], f"events-{rank}.json"), "w") as f:
    json.dump(seen, f)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("strategy", ["checkfreq", "async-dcp"])
def test_background_persistence_journals_saved_only_after_rank_0_committed(tmp_path: Path, strategy: str) -> None:
    # Their commits run in a background thread (checkfreq) or at a later poll (async-dcp), so the ranks
    # learn rank 0's outcome from the checkpoint's directory, not from a collective.
    results = run_ranks(ASYNC, str(tmp_path), strategy)
    assert all(code == 0 for code, _ in results), [out for _, out in results]
    for rank in range(2):
        seen = json.loads((tmp_path / f"events-{rank}.json").read_text())
        assert [(e["kind"], e["step"]) for e in seen] == [("checkpoint_failed", 1), ("checkpoint_saved", 2)], (rank, seen)
        assert "rank 0 commit" in seen[0]["reason"] and "No space left" in seen[0]["reason"]
