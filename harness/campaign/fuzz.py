"""Fault campaigns: ``baft fuzz SCENARIO --budget N`` searches fault schedules for one that fails.

The scenario gives the workload, the checkpoint policy and the expectations;
its own ``faults`` are replaced by schedules that hypothesis generates: one to
``max_faults`` faults, each a kind (``kill``, ``crash``, ``node_loss`` on
several nodes), a target rank or node, a step and a phase the strategy
announces. Every schedule runs for real (``OUT/trial-NNN``). When one fails,
hypothesis shrinks it — fewer faults, earlier steps, lower ranks, simpler kinds
— re-running each candidate, and the smallest schedule that still fails is
written as ``OUT/minimal.yaml``: a scenario that reproduces the failure with
``baft run``. ``OUT/fuzz.json`` lists every trial.
"""
from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from baft.traits import TRAITS, Traits
from injectors.process import LOOP_PHASES

from harness.errors import HarnessError, ScenarioError
from harness.scenario import parse


@dataclass(slots=True)
class Trial:
    schedule: list[dict[str, Any]]
    passed: bool
    out: Path
    why: list[str] = field(default_factory=list)


@dataclass(slots=True)
class FuzzResult:
    trials: list[Trial]
    minimal: list[dict[str, Any]] | None
    """The smallest failing schedule found (None: every trial passed)."""
    minimal_file: Path | None


def schedules(data: dict[str, Any], max_faults: int = 3) -> Any:
    """A hypothesis strategy of fault lists valid for the scenario's workload and strategy."""
    from hypothesis import strategies as st

    w = data.get("workload") or {}
    stages, dp, nodes = int(w.get("stages", 2)), int(w.get("data_parallel", 1)), int(w.get("nodes", 1))
    steps = int(w.get("steps", 30))
    world = stages * dp
    strategy = TRAITS.get((data.get("checkpoint") or {}).get("strategy", "none"), Traits())
    phases = LOOP_PHASES + strategy.step_phases  # what every step announces under this strategy
    step = st.integers(1, max(1, steps - 2))
    phase = st.sampled_from(phases)
    kinds = [
        st.builds(lambda r, s, p: {"kill": {"rank": r, "at_step": s, "phase": p}}, st.integers(0, world - 1), step, phase),
        st.builds(lambda r, s, p: {"crash": {"rank": r, "at_step": s, "phase": p, "how": "exception"}},
                  st.integers(0, world - 1), step, phase),
    ]
    if nodes > 1:
        kinds.append(st.builds(lambda n, s, p: {"node_loss": {"node": n, "at_step": s, "phase": p}},
                               st.integers(0, nodes - 1), step, st.sampled_from(LOOP_PHASES)))
    return st.lists(st.one_of(*kinds), min_size=1, max_size=max_faults)


def with_schedule(data: dict[str, Any], schedule: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The scenario with ``schedule`` as its faults and enough restarts for them."""
    out = copy.deepcopy(data)
    out["name"] = name
    out["faults"] = schedule
    run = dict(out.get("run") or {})
    run["max_restarts"] = max(int(run.get("max_restarts", 3)), len(schedule) + 1)
    out["run"] = run
    return out


class _Spent(Exception):
    """The trial budget is used up (while shrinking)."""


def fuzz(scenario_file: Path, budget: int, out: Path, cache: Path | None = None, max_faults: int = 3,
         shrink_budget: int | None = None,
         echo: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> FuzzResult:
    """Run up to ``budget`` generated schedules; once one fails, up to ``shrink_budget`` more
    (default ``2 * budget``) to shrink it. The search is deterministic: the same scenario and
    budget try the same schedules."""
    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import NoSuchExample

    from harness.run.runner import run_scenario

    data = yaml.safe_load(scenario_file.read_text())
    parse(data, str(scenario_file))  # the base scenario must be valid
    base = data["name"]
    out.mkdir(parents=True, exist_ok=True)
    trials: list[Trial] = []
    seen: dict[str, Trial] = {}

    limit = budget + (2 * budget if shrink_budget is None else shrink_budget)

    def fails(schedule: list[dict[str, Any]]) -> bool:
        key = json.dumps(schedule, sort_keys=True)
        if key in seen:
            return not seen[key].passed
        n = len(trials)
        if n >= limit:
            raise _Spent
        candidate = with_schedule(data, schedule, f"{base}-trial-{n:03d}")
        try:
            scenario = parse(candidate, f"{scenario_file} (trial {n})")
        except ScenarioError as e:  # a schedule this scenario cannot run (e.g. more restarts than allowed)
            echo(f"trial {n:03d}: skipped ({e.expected})")
            seen[key] = Trial(schedule, True, out, [f"invalid: {e}"])
            return False
        run_dir = out / f"trial-{n:03d}"
        try:
            v = run_scenario(scenario, run_dir, cache, report=False)
            trial = Trial(schedule, v.passed, run_dir, list(v.failures))
        except HarnessError as e:
            trial = Trial(schedule, False, run_dir, [f"harness error: {e}"])
        trials.append(trial)
        seen[key] = trial
        echo(f"trial {n:03d}: {'passed' if trial.passed else 'FAILED'}  {_describe(schedule)}"
             + ("" if trial.passed else f"  ({'; '.join(trial.why)[:120]})"))
        return not trial.passed

    cfg = settings(max_examples=budget, deadline=None, database=None, derandomize=True,
                   phases=(Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck))
    minimal: list[dict[str, Any]] | None = None
    minimal_file = None
    try:
        minimal = find(schedules(data, max_faults), fails, settings=cfg)
    except NoSuchExample:
        pass
    except _Spent:  # shrinking cut short: the smallest failure seen so far
        failed = [t.schedule for t in trials if not t.passed]
        minimal = min(failed, key=lambda sch: (len(sch), sum(next(iter(f.values()))["at_step"] for f in sch)))
        echo(f"trial budget ({limit}) spent while shrinking; keeping the smallest failure seen")
    if minimal is not None:
        doc = with_schedule(data, minimal, f"{base}-minimal")
        doc["description"] = (f"The smallest failing fault schedule `baft fuzz` found for {scenario_file.name}: "
                              f"{_describe(minimal)}. It failed with: "
                              + "; ".join(seen[json.dumps(minimal, sort_keys=True)].why))
        minimal_file = out / "minimal.yaml"
        minimal_file.write_text(yaml.safe_dump(doc, sort_keys=False, width=100))
    (out / "fuzz.json").write_text(json.dumps({
        "scenario": str(scenario_file), "budget": budget,
        "trials": [{"schedule": t.schedule, "passed": t.passed, "out": str(t.out), "failures": t.why} for t in trials],
        "minimal": minimal, "minimal_file": str(minimal_file) if minimal_file else None,
    }, indent=2) + "\n")
    return FuzzResult(trials=trials, minimal=minimal, minimal_file=minimal_file)


def _describe(schedule: list[dict[str, Any]]) -> str:
    parts = []
    for f in schedule:
        ((kind, body),) = f.items()
        target = f"node {body['node']}" if "node" in body else f"rank {body['rank']}"
        parts.append(f"{kind} {target} at step {body['at_step']} ({body.get('phase', 'iteration')})")
    return ", ".join(parts)
