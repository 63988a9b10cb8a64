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
    """Shared reference cache: tox points BAFT_CACHE_DIR into its env; else a session temp dir."""
    env = os.environ.get("BAFT_CACHE_DIR")
    return Path(env) if env else tmp_path_factory.mktemp("baft-cache")


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
