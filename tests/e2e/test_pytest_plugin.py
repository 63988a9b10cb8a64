"""The pytest plugin: scenario files as test items, verdict summaries as failures, JUnit from pytest."""
from __future__ import annotations

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
def test_pytest_runs_scenario_files_and_reports_verdicts(tmp_path: Path, ref_cache: Path) -> None:
    d = tmp_path / "scenarios"
    d.mkdir()
    good, bad = kill_pair()
    (d / "good.yaml").write_text(yaml.safe_dump({**good, "marks": ["slow"]}))
    (d / "no-rng.yaml").write_text(yaml.safe_dump({**bad, "name": "no-rng"}))
    (d / "broken.yaml").write_text("name: broken\nworkload: {stages: 0}\n")
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(d), "--baft-cache", str(ref_cache),
         "--baft-out", str(tmp_path / "runs"), f"--junitxml={junit}", "-p", "no:cacheprovider", "-m", "slow or not slow"],
        cwd=tmp_path, capture_output=True, text=True, timeout=550)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "2 failed, 1 passed" in out
    # the failure is the verdict's summary, not a traceback
    assert "first divergence step 10, rng / " in out and "no-rng: FAILED" in out and "Traceback" not in out
    assert "broken.yaml: workload.stages: expected an integer >= 1, found 0" in out
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert set(cases) == {"kill-rank0-step12", "no-rng", "broken"}
    assert cases["kill-rank0-step12"].find("failure") is None and cases["no-rng"].find("failure") is not None
    assert (tmp_path / "runs" / "kill-rank0-step12" / "report.html").is_file()


def test_scenario_marks_select_items(tmp_path: Path) -> None:
    d = tmp_path / "scenarios"
    d.mkdir()
    shutil.copy(ROOT / "scenarios" / "ci" / "link-partition.yaml", d / "p.yaml")
    shutil.copy(ROOT / "scenarios" / "smoke" / "kill-rank.yaml", d / "k.yaml")
    proc = subprocess.run([sys.executable, "-m", "pytest", str(d), "--collect-only", "-q",
                           "-m", "not netns", "-p", "no:cacheprovider"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert "k.yaml::kill-rank1-step17" in proc.stdout and "p.yaml" not in proc.stdout, proc.stdout + proc.stderr
