"""``scripts/device-check --cpu-rehearsal``: the one prepared GPU check, every step run on this CPU (the simulated
device where CUDA is needed, the refusing backend where NCCL is), so the script a lent machine runs once
cannot rot unseen (issue 53)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # about 140 s under CI's load

ROOT = Path(__file__).resolve().parents[2]


def test_the_device_check_script_passes_its_cpu_rehearsal(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "device-check"), "--cpu-rehearsal", "--out", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["passed"] and summary["rehearsal"]
    assert [s["step"] for s in summary["steps"]] == ["env", "gpu-tests", "check", "digest"]
    result = json.loads((tmp_path / "device" / "device-check.json").read_text())
    assert result["simulated_device"] and result["snapshot_exact"] and 0.005 < result["state_gbytes"] < 0.02
    for key in ("kill_and_restore", "kill_and_restore_in_group"):
        kr = result[key]
        assert kr["exit_codes"] == {"reference": 0, "killed": -9, "restored": 0}, kr
        assert kr["bit_for_bit"] and kr["steps_compared"][-1] == 6, kr
    assert result["kill_and_restore_in_group"]["process_group"] == "refusecpu"
    fp = result["fingerprints"]
    assert fp["digests_equal"] and fp["tensors"] > 0 and fp["norm_max_relative_difference"] < 1e-9, fp
    cost, copies = result["cost"]["baft_every_iteration_vs_none"], result["copies"]
    assert cost["n"] == result["cost"]["cycles"] and cost["ratio_vs_none"] > 0
    assert copies["snapshots"] > 0 and 0.0 <= copies["in_window_share"] <= 1.0
    assert copies["baft_gbytes_per_s"] is not None  # timed on the (simulated) copy stream
    assert (tmp_path / "gpu-tests.xml").exists() and (tmp_path / "digest" / "digest.json").exists()
    assert "== check: exit 0" in (tmp_path / "device-check.log").read_text()


def test_the_device_check_script_refuses_an_unknown_argument(tmp_path: Path) -> None:
    run = subprocess.run(["bash", str(ROOT / "scripts" / "device-check"), "--gpus", "2"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "unknown argument --gpus" in run.stderr


def test_the_device_check_refuses_a_size_that_is_not_one() -> None:
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "bench", "--device-check", "-1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--device-check" in proc.stderr and "-1" in proc.stderr, proc.stderr
