"""Suite discovery and validation: all files checked before anything runs."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.campaign.suite import bar, discover, load_all
from harness.errors import ScenarioError

ROOT = Path(__file__).resolve().parents[2]


def test_the_ci_suite_is_valid_and_uniquely_named() -> None:
    scenarios = load_all(discover(ROOT / "scenarios" / "ci"))
    assert len(scenarios) >= 12 and len({s.name for s in scenarios}) == len(scenarios)


def test_duplicate_names_are_bad_input(tmp_path: Path) -> None:
    for n in ("a", "b"):
        shutil.copy(ROOT / "scenarios" / "smoke" / "kill-rank.yaml", tmp_path / f"{n}.yaml")
    with pytest.raises(ScenarioError) as e:
        load_all(discover(tmp_path))
    assert e.value.path == "name" and "a.yaml has it" in e.value.expected


def test_an_empty_or_missing_directory_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="at least one"):
        discover(tmp_path)
    with pytest.raises(ScenarioError, match="a directory"):
        discover(tmp_path / "nope")


def test_progress_bar() -> None:
    assert bar(0, 4, 8) == "[........] 0/4" and bar(4, 4, 8) == "[########] 4/4" and bar(1, 2, 8) == "[####....] 1/2"
