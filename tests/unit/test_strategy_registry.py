"""A strategy is one package and one registry entry (issue 56): the config's validation, ``STRATEGIES``, the bench's
arms, the projection and the docs' table derive from :mod:`baft.strategies.registry`, and a strategy registered
from outside baft (``tests/fakes/toystrategy.py``) is taken by each of them. Its runs through ``baft bench`` and
``baft run``: ``tests/e2e/test_toy_strategy.py``."""
from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest

import baft.config
import baft.strategies.registry as registry
from baft import AsyncDcpConfig, BaftConfig, CheckpointConfig
from baft.config import StrategyName
from baft.errors import BaftConfigError
from baft.traits import Traits

from analysis import projection
from harness.bench import project
from harness.bench.bench import BenchConfig, snapshot_arms
from harness.errors import ScenarioError
from harness.scenario import parse

ROOT = Path(__file__).resolve().parents[2]
TOY = "tests.fakes.toystrategy"


@pytest.fixture
def toy() -> Iterator[registry.Entry]:
    """The toy strategy registered for one test (its module registers it when first imported)."""
    entry = registry.register(importlib.import_module(TOY).ENTRY)
    try:
        yield entry
    finally:
        registry.unregister("toy")


def test_the_literal_and_the_public_names_are_the_built_in_strategies() -> None:
    builtin = tuple(e.name for e in registry.BUILTIN)
    assert get_args(StrategyName) == builtin == registry.names() == baft.config.STRATEGIES
    assert {e.name: e.config_class() for e in registry.BUILTIN if e.section} == {"baft": BaftConfig,
                                                                                   "async-dcp": AsyncDcpConfig}
    assert BaftConfig.__module__ == "baft.strategies.baft.config"  # in its package, named by the public face too
    from baft import BaftConfig as public

    assert public is baft.config.BaftConfig is BaftConfig
    for e in registry.BUILTIN:  # each entry's class is its strategy, with the entry's traits
        cls = e.load()
        assert cls.name == e.name and cls.phases == e.traits.phases and cls.elastic == e.traits.elastic
        assert e.section is None or hasattr(CheckpointConfig(), e.section)


def test_the_docs_table_lists_exactly_the_built_in_strategies() -> None:
    text = (ROOT / "docs" / "strategies.md").read_text()
    table = text.split("| strategy |", 1)[1].split("\n\n", 1)[0]
    assert re.findall(r"^\| `([^`]+)` \|", table, re.M) == [e.name for e in registry.BUILTIN]


def test_the_bench_arms_and_the_projection_come_from_the_entries() -> None:
    assert snapshot_arms() == {"async-dcp": "async-dcp:staging", "checkfreq": "checkfreq:snapshot",
                               "baft": "baft:snapshot"}
    assert registry.PROJECTIONS == projection.MODELS
    # baft project's strategies are analysis's default ones, now taken from the registry
    assert project.strategies() == projection.STRATEGIES
    assert list(project.strategies()) == ["none", "sync", "async-dcp", "checkfreq", "in-memory", "baft"]


def test_an_unknown_strategy_is_refused_where_the_config_is_built() -> None:
    with pytest.raises(BaftConfigError) as err:
        CheckpointConfig(strategy="toy")
    assert err.value.field == "strategy" and "BAFT_STRATEGIES" in str(err.value)
    with pytest.raises(ScenarioError) as bad:
        parse({"name": "t", "checkpoint": {"strategy": "toy"}}, "t.yaml", host=False)
    assert bad.value.path == "checkpoint.strategy"


def test_a_registered_strategy_is_taken_everywhere(toy: registry.Entry) -> None:
    assert registry.names()[-1] == "toy" and "toy" in baft.config.STRATEGIES
    assert CheckpointConfig(strategy="toy").strategy == "toy"
    s = parse({"name": "t", "workload": {"stages": 2, "microbatches": 4, "steps": 8},
               "checkpoint": {"strategy": "toy", "every": 2}, "faults": [{"kill": {"rank": 1, "at_step": 5}}]},
              "t.yaml", host=False)
    assert s.checkpoint.strategy == "toy"
    # a phase it does not announce is refused, by its traits
    with pytest.raises(ScenarioError):
        parse({"name": "t", "workload": {"stages": 2, "microbatches": 4, "steps": 8},
               "checkpoint": {"strategy": "toy", "every": 2},
               "faults": [{"kill": {"rank": 1, "at_step": 5, "phase": "snapshot"}}]}, "t.yaml", host=False)
    bench = BenchConfig(strategies=["toy"], cycles=1, warmup=0, block=2, persist_every=[2])
    assert [(a.name, a.tier) for a in bench.arms()] == [("none", "baseline"), ("toy@2", "persistent")]
    assert project.strategies()["toy"] == "blocking"
    assert toy.load().__name__ == "ToyStrategy" and toy.load().phases == ("persist",)


def test_registering_checks_the_entry(toy: registry.Entry) -> None:
    registry.register(toy)  # the same entry again (a module imported twice): nothing happens
    with pytest.raises(BaftConfigError, match="not taken"):
        registry.register(registry.Entry(name="toy", strategy="elsewhere:Toy"))
    with pytest.raises(BaftConfigError):
        registry.unregister("sync")  # the built-in ones stay
    with pytest.raises(BaftConfigError):
        registry.Entry(name="a@b", strategy="m:C")
    with pytest.raises(BaftConfigError):
        registry.Entry(name="x", strategy="m:C", traits=Traits(phases=("teleport",)))
    with pytest.raises(BaftConfigError):
        registry.Entry(name="x", strategy="m:C", projection="magic")


def test_the_environment_names_the_modules_that_register(monkeypatch: pytest.MonkeyPatch) -> None:
    """``BAFT_STRATEGIES`` is read at the first look-up of a process (a torchrun worker's included)."""
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setenv(registry.ENV, TOY)
    monkeypatch.delitem(sys.modules, TOY, raising=False)
    try:
        assert "toy" in registry.names()
    finally:
        registry.unregister("toy")
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setenv(registry.ENV, "tests.fakes.no_such_module")
    with pytest.raises(BaftConfigError, match=registry.ENV):
        registry.names()
