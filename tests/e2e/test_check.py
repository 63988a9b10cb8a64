"""``baft check`` end to end (issue 54): a correct script passes every case of the battery it gets (no false
alarm), with every output. The one-process example (DDP only when ``RANK`` is set, a relative config file) keeps
it short for CI; the two-rank DDP example's battery is measured in README and docs/scripts.md."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main as cli_main
from tests.e2e.conftest import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]
EXAMPLE = ROOT / "examples" / "single_process"


def test_a_correct_script_passes_every_case_of_its_battery(tmp_path: Path, ref_cache: Path, capsys) -> None:
    out = tmp_path / "check"
    rc = cli_main(["check", "--steps", "8", "--cwd", str(EXAMPLE), "--out", str(out), "--cache", str(ref_cache),
                   str(EXAMPLE / "train.py"), "--out-dir", "{run_dir}/out", "--steps", "8", "--save-every", "2"])
    printed = capsys.readouterr()
    assert rc == 0, printed.out + printed.err
    data = json.loads((out / "check.json").read_text())
    names = [c["name"] for c in data["cases"]]
    assert names == ["kill-after-save", "kill-during-save", "preempt-generous-grace", "preempt-short-grace",
                     "kill-during-restart"], names
    assert data["passed"] and all(c["passed"] for c in data["cases"])
    assert data["profile"]["saves"] == [2, 4, 6, 8] and data["profile"]["reproducible"] is True
    assert data["cases"][0]["scenario"]["workload"]["launcher"] == "python"  # one process: as python train.py
    restart = next(c for c in data["cases"] if c["name"] == "kill-during-restart")
    assert len(restart["verdict"]["recoveries"]) == 2  # the second kill fired in the first restart's load
    for name in names:
        assert (out / "scenarios" / f"{name}.yaml").is_file() and (out / "cases" / name / "verdict.json").is_file()
    assert (out / "junit.xml").is_file() and (out / "cases" / "report.html").is_file()
    assert "5/5 cases passed" in printed.out and "[5/5] kill-during-restart: PASSED" in printed.err
