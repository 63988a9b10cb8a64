"""The mutant zoo: every planted checkpoint bug is caught and named, and without it the scenario passes."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.worker.mutants import MUTANTS
from tests.e2e.conftest import ROOT, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ZOO = ROOT / "scenarios" / "mutants"


def correct_library(name: str) -> dict[str, Any]:
    """The mutant's scenario without its planted bug (and without the expectation that it is caught)."""
    data = yaml.safe_load((ZOO / f"{name}.yaml").read_text())
    data["workload"].pop("mutant")
    data["expect"].pop("caught")
    data.pop("description", None)
    data["name"] = "correct"
    return data


def _controls() -> dict[str, list[str]]:
    """Each distinct correct-library scenario once (several mutants plant their bug into the same
    scenario), keyed by the first mutant that has it, with the mutants that share it."""
    by_content: dict[str, list[str]] = {}
    for name in sorted(MUTANTS):
        by_content.setdefault(json.dumps(correct_library(name), sort_keys=True), []).append(name)
    return {names[0]: names for names in by_content.values()}


CONTROLS = _controls()


def test_every_mutant_has_a_scenario() -> None:
    assert {p.stem for p in ZOO.glob("*.yaml")} == set(MUTANTS)


def test_every_mutant_has_its_control() -> None:
    assert sorted(n for names in CONTROLS.values() for n in names) == sorted(MUTANTS)


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_mutant_is_caught(name: str, tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(ZOO / f"{name}.yaml", tmp_path / "mutant", ref_cache)
    assert rc == 0 and v is not None and v["caught"]["caught"], out
    expected = v["caught"]["expected"]
    if expected["component"]:
        assert v["first_divergence"]["component"] == expected["component"], out
    assert expected["cause"] in [d["code"] for d in v["diagnosis"]], out  # the cause named, with its evidence
    assert "likely cause     [" + expected["cause"] + "]" in out


@pytest.mark.parametrize("first", sorted(CONTROLS), ids=lambda n: "+".join(CONTROLS[n]))
def test_the_correct_library_passes_where_the_mutants_are_caught(first: str, tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(correct_library(first), tmp_path / "correct", ref_cache)
    assert rc == 0 and v["passed"] and v["bitwise_equal"], out
    assert not v.get("diagnosis") and "likely cause" not in out  # a correct resume gets no diagnosis


@pytest.mark.parametrize("strategy", ["baft"])  # sync: test_spine's and test_suite's negative controls
def test_a_checkpoint_that_leaves_a_component_out_fails_where_it_is_first_read(strategy: str, tmp_path: Path,
                                                                                ref_cache: Path) -> None:
    """The negative control ``workload.omit``: the harness's own knob, in every strategy (baft's config
    no longer has it). The probe still fingerprints the whole state, so the divergence is the omitted
    component at the restored step, not a component missing from every record."""
    data = correct_library("rng-not-restored")
    data["workload"]["omit"] = ["rng"]
    data["checkpoint"]["strategy"] = strategy
    rc, out, v = run_cli(data, tmp_path / "out", ref_cache)
    assert rc == 1 and not v["bitwise_equal"], out
    (rec,) = v["recoveries"]
    div = v["first_divergence"]
    assert div["component"] == "rng" and div["step"] == rec["restored_step"], (div, rec)
