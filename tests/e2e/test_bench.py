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

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_bench_writes_paired_ratios(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "bench", "--out", str(out), "--cycles", "3", "--warmup", "1",
         "--strategies", "sync,baft", "--block", "2", "--persist-every", "4", "--microbatches", "4"],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((out / "bench.json").read_text())
    raw = json.loads((out / "bench-raw.json").read_text())
    its = raw["iterations"]
    # What was timed: one warm-up cycle (-1) and 3 cycles, each strategy once per cycle, 2 iterations a block.
    blocks: dict[tuple[int, str], list[int]] = {}
    for it in its:
        blocks.setdefault((it["cycle"], it["strategy"]), []).append(it["position"])
        assert it["seconds"] > 0
    assert blocks == {(c, s): [0, 1] for c in range(-1, 3) for s in ("none", "sync", "baft")}
    # bench.json's statistics are those of the raw timings (paired_ratios itself: tests/unit/test_benchstats.py).
    assert set(result["strategies"]) == {"none", "sync", "baft"}
    assert result["strategies"] == paired_ratios(its)  # deterministic (a seeded bootstrap), exact through JSON
    assert all(s["n"] == 3 for s in result["strategies"].values())
    # baft snapshotted every iteration of its blocks, and no other, on both ranks.
    baft_steps = [step for step, it in enumerate(its) if it["strategy"] == "baft"]
    for rank in raw["ranks"]:
        assert sorted(e["step"] for e in rank["baft"] if e["event"] == "snapshot") == baft_steps
    assert result["baft"]["snapshots"] == 2 * len(baft_steps) and 0 <= result["baft"]["in_window_fraction"] <= 1
    # Every tier the run filled was restored restore_repeats (3) times.
    assert set(result["restore"]) == {"shm", "persistent-dcp", "persistent-sync"}
    assert all(r["n"] == 3 and r["seconds_median"] > 0 for r in result["restore"].values())
    assert "ratio vs none" in proc.stdout
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
