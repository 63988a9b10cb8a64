"""``baft bench --device-check``: the script a lent GPU runs (issue 37, item 5), rehearsed on the CPU at a
small size. What it must find on any device: a snapshot equal to the state, a SIGKILLed process restored
from shared memory continuing bit for bit, device digests equal to the same function's over host copies."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_device_check_runs_on_the_cpu_and_finds_everything_exact(tmp_path: Path) -> None:
    out = tmp_path / "check"
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "bench", "--device-check", "0.01", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((out / "device-check.json").read_text())
    assert result["device"] == "cpu" and 0.005 < result["state_gbytes"] < 0.02
    assert result["snapshot_exact"] is True
    kr = result["kill_and_restore"]
    assert kr["exit_codes"] == {"reference": 0, "killed": -9, "restored": 0}, kr
    assert kr["bit_for_bit"] and kr["restored_step"] == kr["killed_at_iteration"] and kr["steps_compared"][-1] == 6, kr
    fp = result["fingerprints"]
    assert fp["digests_equal"] and fp["tensors"] > 0 and fp["norm_max_relative_difference"] < 1e-9, fp
    cost, copies = result["cost"]["baft_every_iteration_vs_none"], result["copies"]
    assert cost["n"] == result["cost"]["cycles"] and cost["ratio_vs_none"] > 0
    assert copies["snapshots"] > 0 and 0.0 <= copies["in_window_share"] <= 1.0
    assert copies["device_to_host_floor_gbytes_per_s"] > 0
    assert "bit for bit" in proc.stdout and "snapshot equal to the state bit for bit: yes" in proc.stdout


def test_the_device_check_refuses_a_size_that_is_not_one() -> None:
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "bench", "--device-check", "-1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--device-check" in proc.stderr and "-1" in proc.stderr, proc.stderr
