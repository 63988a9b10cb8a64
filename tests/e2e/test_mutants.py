"""The mutant zoo: every planted checkpoint bug is caught and named, and without it the scenario passes."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.worker.mutants import MUTANTS

from .conftest import ROOT, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ZOO = ROOT / "scenarios" / "mutants"


def test_every_mutant_has_a_scenario() -> None:
    assert {p.stem for p in ZOO.glob("*.yaml")} == set(MUTANTS)


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_mutant_is_caught_and_the_correct_library_passes(name: str, tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(ZOO / f"{name}.yaml", tmp_path / "mutant", ref_cache)
    assert rc == 0 and v is not None and v["caught"]["caught"], out
    expected = v["caught"]["expected"]
    if expected["component"]:
        assert v["first_divergence"]["component"] == expected["component"], out
    # the same scenario without the planted bug: every expectation holds
    data = yaml.safe_load((ZOO / f"{name}.yaml").read_text())
    data["workload"].pop("mutant")
    data["expect"].pop("caught")
    data["name"] = f"correct-{name}"
    rc, out, v = run_cli(data, tmp_path / "correct", ref_cache)
    assert rc == 0 and v["passed"] and v["bitwise_equal"], out
