"""Running ``baft check``'s battery: the steps found, the reference and what it says, each case for real
(:mod:`harness.campaign.check` chooses them)."""
from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from analysis.journal import Journal
from analysis.junit import write_junit
from analysis.verdict import reproducibility
from harness.campaign.check import (
    DISCOVERY_STEPS,
    CaseResult,
    CheckConfig,
    Profile,
    battery,
    verdicts_of,
    write_outputs,
)
from harness.errors import HarnessError, ScenarioError
from harness.scenario import Scenario, load


def _scenario(data: dict, path: Path) -> Scenario:
    """``data`` written to ``path`` and loaded back: validated as any scenario file is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load(path)


def _plain(config: CheckConfig, steps: int) -> dict:
    return {"name": "check-reference", "workload": config.workload(steps), "checkpoint": {"strategy": "none"},
            "faults": [], "expect": {"bitwise": True}}


def discover_steps(config: CheckConfig, out: Path, cache: Path | None) -> int:
    """The optimizer steps the script takes: one uninterrupted run under the harness, its journals read."""
    from harness.run.runner import default_cache_dir, ensure_reference

    scenario = _scenario(_plain(config, DISCOVERY_STEPS), out / "scenarios" / "discovery.yaml")
    ref = ensure_reference(scenario.workload, cache or default_cache_dir(), scenario.run.timeout, run=scenario.run)
    steps = Profile.of(Journal.load(ref.run_dir)).steps
    if steps < 2:
        raise ScenarioError(config.script, "SCRIPT", "a script that takes at least 2 optimizer steps (torch.optim "
                            "optimizers, seen through their step hooks)", f"{steps} step(s)")
    return steps


def profile_of(config: CheckConfig, steps: int, out: Path, cache: Path | None) -> Profile:
    """The reference (twice) and what it says the script does."""
    from harness.run.runner import checks_reproducibility, default_cache_dir, ensure_reference

    scenario = _scenario(_plain(config, steps), out / "scenarios" / "reference.yaml")
    cache = cache or default_cache_dir()
    ref = ensure_reference(scenario.workload, cache, scenario.run.timeout, run=scenario.run)
    journal = Journal.load(ref.run_dir)
    profile = Profile.of(journal)
    if checks_reproducibility(scenario.workload):
        again = ensure_reference(scenario.workload, cache, scenario.run.timeout, copy=1, run=scenario.run)
        profile.reproducible = reproducibility(journal, Journal.load(again.run_dir)).equal
    return dataclasses.replace(profile, steps=steps)


def run_cases(config: CheckConfig, steps: int, out: Path, cache: Path | None, echo: Callable[[str], None],
              t0: float) -> tuple[Profile, list[CaseResult]]:
    """Every case of the battery, run for real; the outputs written."""
    from analysis.report import suite_report
    from harness.run.runner import run_scenario

    profile = profile_of(config, steps, out, cache)
    echo(f"baft check: {Path(config.script).name}: {profile.describe()}; "
         + {True: "reproducible bit for bit", False: "NOT reproducible: judged by its loss curve",
            None: "reproducibility not checked"}[profile.reproducible])
    cases = battery(config, profile)
    results: list[CaseResult] = []
    for i, case in enumerate(cases):
        data = case.scenario(config, profile)
        tag = f"[{i + 1}/{len(cases)}] {case.name}"
        if config.budget is not None and time.monotonic() - t0 > config.budget:
            results.append(CaseResult(name=case.name, why=case.why, scenario=data, passed=False, seconds=0.0,
                                      not_run=f"the budget of {config.budget:g} s was spent"))
            echo(f"{tag}: not run (budget spent)")
            continue
        echo(f"{tag}: {case.why}")
        t = time.monotonic()
        try:
            verdict = run_scenario(_scenario(data, out / "scenarios" / f"{case.name}.yaml"), out / "cases" / case.name,
                                   cache, report=True)
        except HarnessError as e:
            results.append(CaseResult(name=case.name, why=case.why, scenario=data, passed=False,
                                      seconds=time.monotonic() - t, not_run=str(e)))
            echo(f"{tag}: ERROR ({time.monotonic() - t:.0f} s): {e}")
            continue
        results.append(CaseResult(name=case.name, why=case.why, scenario=data, passed=verdict.passed,
                                  seconds=time.monotonic() - t, verdict=verdict.to_json()))
        said = f": {verdict.failures[0]}" if verdict.failures else ""
        echo(f"{tag}: {'PASSED' if verdict.passed else 'FAILED'} ({time.monotonic() - t:.0f} s){said}")
    write_outputs(results, profile, config, out)
    write_junit(out / "junit.xml", f"check-{Path(config.script).stem}", verdicts_of(results))
    if any(r.verdict is not None for r in results):
        suite_report(out / "cases")
    return profile, results


def run_check(config: CheckConfig, out: Path, cache: Path | None = None,
              echo: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
              ) -> tuple[Profile, list[CaseResult]]:
    """The whole check (:mod:`harness.campaign.check`); writes ``OUT`` and returns what the script does and each
    case's result."""
    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    steps = config.steps
    if steps is None:
        echo("baft check: a first uninterrupted run, to count the script's optimizer steps ...")
        steps = discover_steps(config, out, cache)
        echo(f"baft check: the script takes {steps} optimizer steps")
    return run_cases(config, steps, out, cache, echo, t0)


def command(args: Any) -> int:
    """``baft check``: the check, its table and where it wrote; 0 when every case passed, 1 otherwise."""
    from harness.campaign.check import table

    config = CheckConfig(script=args.script, args=list(args.args), nproc=args.nproc, nodes=args.nodes,
                         launcher=args.launcher, cwd=args.cwd, steps=args.steps, budget=args.budget)
    out = args.out or Path("runs") / f"check-{Path(args.script).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    t0 = time.monotonic()
    try:
        _, results = run_check(config, out, args.cache)
    except HarnessError as e:
        if isinstance(e, ScenarioError):
            raise
        print(f"baft: error: {e}", file=sys.stderr)
        return 1
    passed = sum(r.passed for r in results)
    print(table(results))
    print(f"{passed}/{len(results)} cases passed in {time.monotonic() - t0:.0f} s")
    print(f"check.json: {out / 'check.json'}\njunit.xml:  {out / 'junit.xml'}\nreport:     {out / 'cases' / 'report.html'}"
          f"\nscenarios:  {out / 'scenarios'} (rerun one with baft run)")
    return 0 if results and passed == len(results) else 1
