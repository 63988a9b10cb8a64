"""Each strategy declares its own facts (the phases it announces, elastic restores, node stores); the
scenario's validation, the fault phases and the fuzzer read them instead of keeping lists of names."""
from __future__ import annotations

import dataclasses
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, find, settings
from hypothesis.errors import NoSuchExample

import baft.strategies.registry as registry
from baft import STRATEGIES
from baft.config import StrategyName
from baft.events import PHASES, RESTORE_PHASES
from baft.strategies.registry import CHECKPOINT_PHASES, STEP_CHECKPOINT_PHASES, TRAITS
from baft.traits import Traits

from harness.campaign.fuzz import schedules
from harness.errors import ScenarioError
from harness.scenario import parse
from injectors.process import LOOP_PHASES, WORKER_PHASES, KillConfig, NodeLossConfig

#: Each built-in strategy's class (imported from its registry entry).
REGISTRY = {e.name: e.load() for e in registry.BUILTIN}


def test_the_registry_names_every_strategy_once() -> None:
    assert tuple(REGISTRY) == tuple(TRAITS) == STRATEGIES == get_args(StrategyName)
    for name, cls in REGISTRY.items():
        assert cls.name == name
        assert set(cls.phases) <= set(PHASES) and set(cls.step_phases) <= set(cls.phases)
        # each class carries the traits the harness reads without importing it
        t = TRAITS[name]
        assert (cls.phases, cls.step_phases, cls.elastic, cls.node_stores) == (t.phases, t.step_phases, t.elastic,
                                                                               t.node_stores)
    assert [n for n, c in REGISTRY.items() if c.node_stores] == ["baft"]
    assert [n for n, c in REGISTRY.items() if c.elastic] == ["async-dcp", "baft"]


def test_the_phase_lists_are_the_strategies_phases() -> None:
    assert set(CHECKPOINT_PHASES) == {p for s in REGISTRY.values() for p in s.phases}
    assert set(STEP_CHECKPOINT_PHASES) == {p for s in REGISTRY.values() for p in s.step_phases}
    assert WORKER_PHASES == LOOP_PHASES + CHECKPOINT_PHASES == KillConfig.phases
    # a node can also be lost in a restore (at_restore): at the restore and its steps some strategy announces
    assert NodeLossConfig.phases == LOOP_PHASES + STEP_CHECKPOINT_PHASES + tuple(
        p for p in CHECKPOINT_PHASES if p in RESTORE_PHASES)


def scenario(strategy: str, phase: str, **fault: Any) -> dict[str, Any]:
    """A kill at ``phase``; a step of the restore (no training step) is keyed to restart 1's restore, after a
    kill that causes it (the phase's fault then the last)."""
    when = {"at_restore": 1} if phase in RESTORE_PHASES[1:] else {"at_step": 5}
    first = [{"kill": {"rank": 1, "at_step": 3}}] if "at_restore" in when else []
    return {"name": "p", "workload": {"stages": 2, "microbatches": 4, "steps": 12, "nodes": 2},
            "checkpoint": {"strategy": strategy, "every": 5},
            "faults": [*first, {"kill": {"rank": 0, **when, "phase": phase, **fault}}],
            "run": {"max_restarts": 3}}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("phase", CHECKPOINT_PHASES)
def test_a_phase_is_valid_exactly_under_the_strategies_that_announce_it(strategy: str, phase: str) -> None:
    data = scenario(strategy, phase)
    last = len(data["faults"]) - 1
    if phase in REGISTRY[strategy].phases:
        assert parse(data, "s.yaml", host=False).faults[last].config.phase == phase
    else:
        with pytest.raises(ScenarioError) as err:
            parse(data, "s.yaml", host=False)
        assert err.value.path == f"faults[{last}].kill.phase"
        assert f"{phase} needs " + " or ".join(n for n, s in REGISTRY.items() if phase in s.phases) in err.value.expected


def test_validation_follows_what_a_strategy_declares(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ScenarioError):
        parse(scenario("sync", "snapshot"), "s.yaml", host=False)
    assert parse(scenario("sync", "restore"), "s.yaml", host=False).faults[0].config.phase == "restore"
    sync = dataclasses.replace(registry.get("sync"), traits=Traits(phases=("snapshot", "persist")))
    monkeypatch.setitem(registry._ENTRIES, "sync", sync)  # declares snapshot, no longer restore
    assert parse(scenario("sync", "snapshot"), "s.yaml", host=False).faults[0].config.phase == "snapshot"
    with pytest.raises(ScenarioError) as err:
        parse(scenario("sync", "restore"), "s.yaml", host=False)
    assert err.value.expected.endswith("(restore needs async-dcp or checkfreq or baft)")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_lost_node_needs_a_strategy_that_declares_elastic_restores(strategy: str) -> None:
    data = {"name": "e", "workload": {"stages": 2, "data_parallel": 2, "microbatches": 4, "steps": 30, "nodes": 2},
            "checkpoint": {"strategy": strategy, "every": 5},
            "faults": [{"node_loss": {"node": 1, "at_step": 12, "replacement": False}}],
            "expect": {"loss": {"rtol": 0.02, "window": 5}}}
    if REGISTRY[strategy].elastic:
        assert parse(data, "e.yaml", host=False).lost_nodes == [1]
    else:
        with pytest.raises(ScenarioError) as err:
            parse(data, "e.yaml", host=False)
        assert err.value.path == "checkpoint.strategy"
        assert ", ".join(n for n, s in REGISTRY.items() if s.elastic) in err.value.expected


def _fuzzes_phase(strategy: str, phase: str) -> bool:
    base = {**scenario(strategy, "iteration"), "faults": []}
    try:
        find(schedules(base, max_faults=1), lambda sch: next(iter(sch[0].values()))["phase"] == phase,
             settings=settings(max_examples=300, database=None, derandomize=True,
                               suppress_health_check=list(HealthCheck)))
    except NoSuchExample:
        return False
    return True


@pytest.mark.parametrize("strategy", ["sync", "baft"])
def test_the_fuzzer_keys_faults_to_the_phases_of_every_step_of_the_strategy(strategy: str) -> None:
    for phase in STEP_CHECKPOINT_PHASES:
        assert _fuzzes_phase(strategy, phase) == (phase in REGISTRY[strategy].step_phases)
    assert _fuzzes_phase(strategy, "optimizer")
