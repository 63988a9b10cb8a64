"""``baft bench`` end to end on a tiny budget: it runs, and its output has the promised shape."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert set(result["strategies"]) == {"none", "sync", "baft"}
    for name, s in result["strategies"].items():
        assert s["n"] == 3 and s["ratio_vs_none"] > 0 and s["iqr"][0] <= s["ratio_vs_none"] <= s["iqr"][1]
    assert result["strategies"]["none"]["ratio_vs_none"] == 1.0
    assert result["baft"]["snapshots"] > 0 and 0 <= result["baft"]["in_window_fraction"] <= 1
    assert result["restore"]["shm"]["seconds_median"] > 0
    assert "ratio vs none" in proc.stdout
    assert not list(Path("/dev/shm").glob("baft-bench-*"))


def test_bench_rejects_bad_options(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "bench", "--out", str(tmp_path), "--strategies", "none,magic"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("baft: error: --strategies: expected names among") and "magic" in proc.stderr
    assert "Traceback" not in proc.stderr
