"""``workload.launcher: python`` and ``workload.cwd`` (issue 54): a one-process script that turns DDP on when
``RANK`` is set and reads a config file relative to where it runs, started as ``python train.py`` would be."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import ROOT, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
EXAMPLE = ROOT / "examples" / "single_process"


def test_a_one_process_script_runs_its_single_process_path_and_resumes_bit_for_bit(tmp_path: Path,
                                                                                     ref_cache: Path) -> None:
    rc, out, v = run_cli(EXAMPLE / "kill.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    rec, = v["recoveries"]
    assert rec["restored_step"] == 8 and rec["lost_steps"] == 2
    log = (tmp_path / "out" / "faulted" / "logs" / "node0.log").read_text()
    assert "resuming from step 8" in log and "nccl" not in log.lower()


def test_under_torchrun_the_same_script_takes_its_ddp_path(tmp_path: Path, ref_cache: Path) -> None:
    """The same scenario with the default launcher: torchrun's RANK turns the script's DDP path on, which needs
    NCCL (absent from a CPU build): the reference fails. What launcher: python is for."""
    scenario = yaml.safe_load((EXAMPLE / "kill.yaml").read_text())
    scenario["workload"].pop("launcher")
    path = EXAMPLE / f".kill-torchrun-{tmp_path.name}.yaml"  # beside the script: its paths are relative to it
    path.write_text(yaml.safe_dump(scenario))
    try:
        rc, out, _ = run_cli(path, tmp_path / "out", ref_cache)
    finally:
        path.unlink()
    assert rc != 0 and "reference" in out.lower(), out
