"""baft on the layouts real pipeline jobs use: stages sharded with FSDP2 on a DeviceMesh (DTensor state)."""
from __future__ import annotations

from pathlib import Path

import pytest
from torch.distributed.checkpoint import FileSystemReader

from analysis.journal import Journal
from baft import persist

from .conftest import ROOT, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_pp_fsdp_kill_during_snapshot_restores_every_shard_bit_for_bit(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(ROOT / "scenarios/ci/pp-fsdp-kill-snapshot.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["bitwise_equal"] and v["states_compared"] > 0 and v["passed"]
    (rec,) = v["recoveries"]  # one restart: the kill's (a state dict taken inside a bubble hung the job once more)
    assert rec["restored_tier"] == "shm" and rec["restored_step"] == 11
    j = Journal.load(tmp_path / "out" / "faulted")
    assert any(r["reason"].startswith("torn") for r in j.events("checkpoint_rejected", 1))
    # The persistent tier holds each FSDP shard under its own key, half of each sharded tensor.
    root = tmp_path / "out" / "faulted" / "checkpoints"
    md = FileSystemReader(str(persist.step_dir(root, persist.committed_steps(root)[0]))).read_metadata()
    sizes = {k: tuple(m.size) for k, m in md.state_dict_metadata.items() if k.endswith("blocks.0.ln1.weight")}
    assert sizes == {f"stage{s}.shard{f}/model.blocks.0.ln1.weight": (32,) for s in (0, 1) for f in (0, 1)}
