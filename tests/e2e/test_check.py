"""``baft check`` end to end (issue 54): the plain DDP script with its fixes passes every case of the battery it
gets (no false alarm), with its outputs. (Without ``--rng-with-step`` its kill-during-save case finds a torn
checkpoint: each rank's RNG file is written before ``last.pt``.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main as cli_main
from tests.e2e.conftest import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SCRIPT = ROOT / "examples" / "ddp_torchsave" / "train.py"
ARGS = ["--ckpt-dir", "{run_dir}/ckpt", "--steps", "12", "--save-every", "4", "--loader-generator", "--rng-with-step"]


def check(tmp_path: Path, ref_cache: Path, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "check"
    rc = cli_main(["check", "--nproc", "2", "--steps", "12", "--out", str(out), "--cache", str(ref_cache),
                   str(SCRIPT), *ARGS, *extra])
    return rc, json.loads((out / "check.json").read_text())


def test_the_fixed_script_passes_every_case_of_its_battery(tmp_path: Path, ref_cache: Path, capsys) -> None:
    rc, data = check(tmp_path, ref_cache)
    printed = capsys.readouterr()
    assert rc == 0, printed.out + printed.err
    names = [c["name"] for c in data["cases"]]
    assert names == ["kill-after-save", "kill-during-save", "preempt-generous-grace", "preempt-short-grace",
                     "kill-during-restart"], names
    assert data["passed"] and all(c["passed"] for c in data["cases"])
    assert data["profile"]["saves"] == [4, 8, 12] and data["profile"]["reproducible"] is True
    restart = next(c for c in data["cases"] if c["name"] == "kill-during-restart")
    assert len(restart["verdict"]["recoveries"]) == 2  # the second kill fired in the first restart's load
    out = tmp_path / "check"
    for name in names:
        assert (out / "scenarios" / f"{name}.yaml").is_file() and (out / "cases" / name / "verdict.json").is_file()
    assert (out / "junit.xml").is_file() and (out / "cases" / "report.html").is_file()
    assert "5/5 cases passed" in printed.out and "[5/5] kill-during-restart: PASSED" in printed.err

