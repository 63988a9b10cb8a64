"""End-to-end fixtures: run the real ``baft`` CLI (real torchrun, real gloo, real signals)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ref_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference cache every test of the run shares: tox points BAFT_CACHE_DIR into its env;
    else one directory beside the pytest-xdist workers' temp dirs (the cache locks per key)."""
    env = os.environ.get("BAFT_CACHE_DIR")
    if env:
        return Path(env)
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "baft-cache"
    shared.mkdir(exist_ok=True)
    return shared


def run_cli(scenario: Path | dict[str, Any], out: Path, cache: Path, timeout: float = 280) -> tuple[int, str, dict[str, Any] | None]:
    """Run ``baft run`` in a subprocess; returns exit code, output and the verdict (if written)."""
    if isinstance(scenario, dict):
        path = out.with_suffix(".yaml")
        path.write_text(yaml.safe_dump(scenario))
        scenario = path
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", str(scenario), "--out", str(out), "--cache", str(cache)],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )
    verdict_path = out / "verdict.json"
    verdict = json.loads(verdict_path.read_text()) if verdict_path.is_file() else None
    return proc.returncode, proc.stdout + proc.stderr, verdict


def kill_pair(name: str = "kill-rank0-step12") -> tuple[dict[str, Any], dict[str, Any]]:
    """A passing scenario and its negative control (the RNG left out of the checkpoint), sharing one
    reference: what the suite and the pytest plugin tests judge, and the spine's ``rng`` control."""
    good: dict[str, Any] = {
        "name": name,
        "workload": {"model": "gpt-tiny", "stages": 2, "steps": 20},
        "checkpoint": {"strategy": "sync", "every": 5},
        "faults": [{"kill": {"rank": 0, "at_step": 12}}],
        "expect": {"bitwise": True, "max_lost_steps": 5},
    }
    bad = {**good, "name": "kill-without-rng", "checkpoint": {**good["checkpoint"], "omit": ["rng"]}}
    return good, bad


#: Tests that measure rates or times, or shape links: they run one after another on one pytest-xdist
#: worker (``--dist loadgroup``), so two of them never compete for the links or the timing.
SERIAL_FILES = {"test_bench.py", "test_links.py", "test_network.py"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("netns") or item.path.name in SERIAL_FILES:
            item.add_marker(pytest.mark.xdist_group("serial"))
