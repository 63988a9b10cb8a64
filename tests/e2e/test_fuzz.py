"""``baft fuzz`` finds a failing fault schedule for a planted bug and shrinks it to a minimal scenario."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BASE = """\
name: fuzz-optimizer-lost
workload: {model: gpt-tiny, stages: 2, microbatches: 4, schedule: 1f1b, steps: 16, seed: 5, mutant: optimizer-lost}
checkpoint: {strategy: sync, every: 4}
expect: {bitwise: true}
"""


# Up to four runs in one test: more than the global 300 s when the other xdist worker is busy too.
@pytest.mark.timeout(900)
def test_fuzz_finds_and_shrinks_a_failing_schedule(tmp_path: Path, ref_cache: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text(BASE)
    out = tmp_path / "fuzz"
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "fuzz", str(base), "--budget", "2", "--shrink-budget", "1",
                           "--max-faults", "2", "--out", str(out), "--cache", str(ref_cache)],
                          cwd=ROOT, capture_output=True, text=True, timeout=700)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text  # a failing schedule was found
    report = json.loads((out / "fuzz.json").read_text())
    trials = report["trials"]
    assert any(not t["passed"] for t in trials) and len(trials) <= 2 + 1
    # after the first failure the one shrink step the budget leaves tried a simpler schedule
    first = next(i for i, t in enumerate(trials) if not t["passed"])
    assert len(trials) == first + 2 and trials[-1]["schedule"] != trials[first]["schedule"]
    minimal = yaml.safe_load((out / "minimal.yaml").read_text())
    faults = minimal["faults"]
    # the bug shows only after a restore from a checkpoint (step 4 on): the minimal schedule is one such fault
    assert len(faults) == 1 and next(iter(faults[0].values()))["at_step"] >= 4
    assert minimal["workload"]["mutant"] == "optimizer-lost" and "reproduce: baft run" in text
    # the minimal scenario reproduces the failure with a plain `baft run`
    rc, rerun, _ = run_cli(out / "minimal.yaml", tmp_path / "again", ref_cache)
    assert rc == 1 and "diverged" in rerun, rerun
