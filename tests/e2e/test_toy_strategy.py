"""A strategy registered from outside baft (``BAFT_STRATEGIES=tests.fakes.toystrategy``, no edit of baft's source)
runs through ``baft bench`` and ``baft run``: the registry reaches the torchrun workers with the environment, a
kill's restore from it passes bit for bit, and the bench gives it its persistent arm (issue 56)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT

pytestmark = [pytest.mark.e2e]

ENV = {**os.environ, "BAFT_STRATEGIES": "tests.fakes.toystrategy",
       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def test_a_registered_strategy_passes_a_kill_bit_for_bit(tmp_path: Path) -> None:
    scenario = tmp_path / "toy.yaml"
    scenario.write_text(yaml.safe_dump({
        "name": "toy-kill", "workload": {"model": "gpt-tiny", "stages": 2, "microbatches": 4, "steps": 12, "seed": 0},
        "checkpoint": {"strategy": "toy", "every": 4}, "faults": [{"kill": {"rank": 1, "at_step": 7}}],
        "expect": {"bitwise": True, "max_lost_steps": 4}}))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(scenario), "--out", str(out)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["passed"] is True, verdict
    events = [json.loads(line) for f in (out / "faulted").rglob("events*.jsonl") for line in f.read_text().splitlines()]
    restored = [e for e in events if e.get("event") == "checkpoint_restored"]
    assert restored and {e["step"] for e in restored} == {4} and {e["tier"] for e in restored} == {"persistent"}


def test_a_registered_strategy_has_its_bench_arm(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "bench", "--out", str(out), "--cycles", "1", "--warmup", "0",
         "--block", "2", "--strategies", "toy", "--persist-every", "2", "--restore-repeats", "1",
         "--workload.microbatches", "4"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((out / "bench.json").read_text())
    assert set(result["tiers"]) == {"persistent"}
    arm = result["tiers"]["persistent"]["arms"]["toy@2"]
    assert arm["settings"] == {"tier": "persistent", "strategy": "toy", "persist_every": 2}
    raw = json.loads((out / "bench-raw.json").read_text())
    drained = [it for it in raw["iterations"] if it["strategy"] == "toy@2" and it["position"] == -1]
    assert len(drained) == 1 and drained[0]["saved"] == 1  # its block of 2 persisted once (every 2)
