"""``baft suite``: every scenario of a directory, suite.json, junit.xml and the reports."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import ROOT, kill_pair

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.timeout(600)  # two runs and their reports in one test, beside the other xdist worker
def test_a_suite_runs_each_scenario_and_writes_junit(tmp_path: Path, ref_cache: Path) -> None:
    suite = tmp_path / "mini"
    suite.mkdir()
    good, bad = kill_pair()
    (suite / "a-kill.yaml").write_text(yaml.safe_dump(good))
    # a negative control in the same suite: the RNG left out of the checkpoint must fail, named
    (suite / "b-broken.yaml").write_text(yaml.safe_dump(bad))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "suite", str(suite), "--out", str(out), "--cache",
                           str(ref_cache)], cwd=ROOT, capture_output=True, text=True, timeout=550)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one scenario failed
    assert "[########################] 2/2" in proc.stderr
    s = json.loads((out / "suite.json").read_text())
    verdicts = {v["scenario"]: v for v in s["scenarios"]}
    assert verdicts["kill-rank0-step12"]["passed"] and not verdicts["kill-without-rng"]["passed"]
    assert verdicts["kill-without-rng"]["first_divergence"]["component"] == "rng"
    assert verdicts["kill-without-rng"]["first_divergence"]["step"] == 10  # the restored boundary
    root = ET.parse(out / "junit.xml").getroot()
    (ts,) = root.findall("testsuite")
    assert ts.get("tests") == "2" and ts.get("failures") == "1"
    failed = [c for c in ts.findall("testcase") if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["kill-without-rng"] and "rng" in failed[0].find("failure").get("message")
    page = (out / "report.html").read_text()
    assert "kill-rank0-step12/report.html" in page and (out / "kill-rank0-step12" / "loss.png").is_file()


def test_a_suite_with_a_bad_file_runs_nothing(tmp_path: Path) -> None:
    suite = tmp_path / "bad"
    suite.mkdir()
    shutil.copy(ROOT / "scenarios" / "smoke" / "kill-rank.yaml", suite / "a.yaml")
    (suite / "b.yaml").write_text("name: b\nworkload: {stages: 0}\n")
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "suite", str(suite), "--out", str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "b.yaml: workload.stages" in proc.stderr
    assert not (tmp_path / "o").exists()
