"""Kills keyed to baft's phases: during a snapshot, during persistence, during a restore."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from baft.persist import commits as persist

from analysis.journal import Journal

from .conftest import ROOT, delivered, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_kill_during_snapshot_discards_the_torn_version(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(ROOT / "scenarios/ci/baft-kill-during-snapshot.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    rec = v["recoveries"][0]
    assert rec["restored_tier"] == "shm" and rec["restored_step"] == 11 and v["lost_steps"] in (1, 2)
    assert any(r["reason"].startswith("torn") for r in Journal.load(tmp_path / "out" / "faulted").events("checkpoint_rejected", 0))
    assert v["bitwise_equal"]


def test_kill_during_persist_never_uses_the_partial_checkpoint(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(ROOT / "scenarios/ci/baft-kill-during-persist.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["bitwise_equal"] and v["recoveries"][0]["restored_tier"] == "shm"
    root = tmp_path / "out" / "faulted" / "checkpoints"
    committed = persist.committed_steps(root)
    assert committed and all(s % 5 == 0 for s in committed)
    for s in committed:
        persist.verify_directory(root, s)  # whatever was committed is whole


def test_kill_during_restore_restores_again(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(ROOT / "scenarios/ci/baft-kill-during-restore.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["faults_fired"] == 2 and v["bitwise_equal"]
    assert [r["restored_step"] for r in v["recoveries"]] == [16, 16]
    j = Journal.load(tmp_path / "out" / "faulted")
    assert max(e["incarnation"] for e in j.events("start")) == 2


def test_node_loss_recovers_from_peer_replicas(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(ROOT / "scenarios/ci/baft-node-loss.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    rec = v["recoveries"][0]
    assert "peer" in rec["restored_tier"] and v["bitwise_equal"]
    # the newest version node 1's store had delivered for both its ranks (one still in flight may land too)
    _, sent = delivered(tmp_path / "out" / "faulted", 1, [2, 3])
    assert rec["restored_step"] >= max(sent), (rec, sorted(sent))
    j = Journal.load(tmp_path / "out" / "faulted")
    launcher = [e["event"] for e in j.launcher]
    assert "store_exit" in launcher and launcher.count("store_start") == 3  # two, then the replacement
    assert not persist.committed_steps(tmp_path / "out" / "faulted" / "checkpoints")  # no disk copy to fall back on


def test_kill_during_replication_keeps_the_replica_flowing(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(ROOT / "scenarios/ci/baft-kill-during-replication.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v["bitwise_equal"] and v["lost_steps"] <= 1 and v["recoveries"][0]["restored_tier"] == "shm"
    j = Journal.load(tmp_path / "out" / "faulted")
    (kill,) = j.events("fault", 2)
    store = [json.loads(line) for line in (tmp_path / "out" / "faulted" / "journal" / "store-node1.jsonl").read_text().splitlines()]
    # On busy cores the store may have widened its stride (journalled): the killed rank's copy of the
    # newest version on that stride still reached node 0, after the rank was gone.
    stride = ([e["stride"] for e in store if e["event"] == "replication_stride" and e["t"] < kill["t"]] or [1])[-1]
    sent = {e["version"] for e in store if e["event"] == "replicated" and e["rank"] == 2}
    assert 9 - 9 % stride in sent, (stride, sorted(sent))


def test_overflow_every_k_snapshots_less_often_and_stays_restorable(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(ROOT / "scenarios/ci/baft-every-k.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    j = Journal.load(tmp_path / "out" / "faulted")
    plans = [e for e in j.events("replan") if e["policy"] == "every_k"]
    assert plans and all(e["every"] & (e["every"] - 1) == 0 and e["every"] <= 8 for e in plans)
    assert any(e["every"] > 1 for e in plans)  # the bubbles could not hold it: fewer snapshots, said so
    snaps = [e["step"] for e in j.events("snapshot", 0) if e["incarnation"] == 0]
    assert len(snaps) < 17  # not one per iteration
    assert v["bitwise_equal"] and v["lost_steps"] <= 8
    # the summary and the verdict say what the planner did where the windows could not hold the state
    assert v["plan_overflows"] and all(p["policy"] == "every_k" for p in v["plan_overflows"])
    assert "snapshot plan" in out and "(overflow every_k)" in out
