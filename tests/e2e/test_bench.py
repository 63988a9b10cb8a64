"""``baft bench`` end to end on a tiny budget: it runs, and its output has the promised shape."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.benchstats import paired_ratios

from .conftest import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.serial]  # timings: alone


def test_bench_writes_both_tiers_with_equal_settings(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "bench", "--out", str(out), "--cycles", "3", "--warmup", "1",
         "--strategies", "sync,checkfreq,baft", "--block", "4", "--persist-every", "2,4", "--workload.microbatches", "4"],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((out / "bench.json").read_text())
    raw = json.loads((out / "bench-raw.json").read_text())
    its = raw["iterations"]
    arms = ["none", "baft:snapshot", "checkfreq:snapshot", "sync@2", "sync@4", "checkfreq@2", "checkfreq@4",
            "baft@2", "baft@4"]
    # What was timed: one warm-up cycle (-1) and 3 cycles, each arm once per cycle, 4 iterations a block and
    # the drain after them (position -1).
    blocks: dict[tuple[int, str], list[int]] = {}
    for it in its:
        blocks.setdefault((it["cycle"], it["strategy"]), []).append(it["position"])
        assert it["seconds"] > 0 or it["position"] == -1
    assert blocks == {(c, a): [0, 1, 2, 3, -1] for c in range(-1, 3) for a in arms}
    # Both tiers, each paired with none by its own statistic (paired_ratios itself: tests/unit/test_benchstats.py).
    snap, pers = result["tiers"]["snapshot"], result["tiers"]["persistent"]
    assert snap["arms"].keys() == {"none", "baft:snapshot", "checkfreq:snapshot"}
    assert pers["arms"].keys() == {"none"} | set(arms[3:])
    for tier in (snap, pers):
        expect = paired_ratios(its, stat=tier["statistic"], only=set(tier["arms"]))
        assert {k: {f: v for f, v in r.items() if f != "settings"} for k, r in tier["arms"].items()} == expect
    # Every persistent arm at the interval its name says, the same for every strategy.
    for name, r in pers["arms"].items():
        if name != "none":
            assert r["settings"]["persist_every"] == int(name.split("@")[1]) and r["settings"]["tier"] == "persistent"
    # Each arm committed, inside its own block (drain included) and on every rank, exactly block / k
    # persistent checkpoints: the same durability for every strategy; the baseline and the snapshot
    # tier none at all.
    before = 0
    for it in its:
        if it["position"] == -1:
            name = it["strategy"]
            k = int(name.split("@")[1]) if "@" in name else None
            assert it["saved"] - before == (4 // k if k else 0), (it, before)
            before = it["saved"]
    # Every baft arm (the snapshot arm and each persistent one) snapshotted every iteration of its blocks
    # and no other, on both ranks; the loop's steps start at 3 (a block starts just before a persist).
    timed = [it for it in its if it["position"] >= 0]
    baft_steps = [3 + i for i, it in enumerate(timed) if it["strategy"].startswith("baft")]
    for rank in raw["ranks"]:
        assert sorted(e["step"] for e in rank["baft"] if e["event"] == "snapshot") == baft_steps
    assert result["baft"]["snapshots"] > 0 and 0 <= result["baft"]["in_window_fraction"] <= 1
    # Every tier the run filled was restored restore_repeats (3) times.
    assert set(result["restore"]) == {"shm", "persistent-dcp", "persistent-sync"}
    assert all(r["n"] == 3 and r["seconds_median"] > 0 for r in result["restore"].values())
    assert "snapshot tier" in proc.stdout and "persistent tier" in proc.stdout and "ratio vs none" in proc.stdout
    # The snapshots' shared memory (the directory the workers were told) is gone.
    shm = Path(json.loads((out / "worker-spec.json").read_text())["shm_dir"])
    assert shm.parent == Path("/dev/shm") and re.fullmatch(r"baft-bench-[0-9a-f]{10}", shm.name), shm
    assert not shm.exists(), f"{shm} was left behind"


def test_bench_rejects_bad_options(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "bench", "--out", str(tmp_path), "--strategies", "none,magic"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("baft: error: --strategies: expected names among") and "magic" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_two_nodes_pair_baft_with_the_floor_of_its_replication(tmp_path: Path) -> None:
    """With 2 nodes on loopback the plain replicator's arm (``floor:replicate``) is timed beside the stores', and
    with ``sync`` the floor of baft@k's whole work (``floor:sync@k+replicate``), baft@k paired with it."""
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "bench", "--out", str(out), "--workload.nodes", "2", "--strategies", "sync,baft",
         "--cycles", "2", "--warmup", "1", "--block", "3", "--persist-every", "3", "--workload.microbatches", "4",
         "--floor-count", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((out / "bench.json").read_text())
    arms = result["tiers"]["persistent"]["arms"]
    assert set(arms) == {"none", "sync@3", "baft@3", "floor:replicate", "floor:work@3", "floor:sync@3+replicate"}
    assert arms["floor:replicate"]["n"] == 2 and arms["floor:work@3"]["n"] == 2
    gap = result["floor_gap"]["baft@3"]  # paired with the honest floor: baft's own work and a replicator of its slots
    assert gap["floor_arm"] == "floor:work@3" and gap["n"] == 2 and gap["ratio"] > 0
    assert result["floor_gap_sync"]["baft@3"]["floor_arm"] == "floor:sync@3+replicate"
    assert re.search(r"baft@3 against the floor of its work \(floor:work@3: .*\): \d\.\d{4}", proc.stdout)
    assert "honest floor" in arms["floor:work@3"]["settings"]["replicates"]
    raw = json.loads((out / "bench-raw.json").read_text())  # every rank's replicator sent its sealed slots
    assert all(r["floor_slots"] >= 3 for r in raw["ranks"]), [r["floor_slots"] for r in raw["ranks"]]
    assert "the floor" in arms["floor:replicate"]["settings"]["replicates"]
    assert re.search(r"floor:replicate\s+\d\.\d{4}", proc.stdout)
    rep = result["replication"]
    assert rep["replicated"] > 0
    # the stores' CPU priced against the floor replicator's too, at the same cadence beside the same training
    assert rep["floor_replicator_cpu_seconds_per_gb"] > 0 and rep["times_floor_replicator"] > 0
    assert "the floor replicator" in proc.stdout
    assert not list((tmp_path).glob("**/floor/*/received"))  # the bench's memory directory was removed
