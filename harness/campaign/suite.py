"""Run every scenario of a directory: ``baft suite DIR --out OUT``.

Every file is validated before the first run starts (bad input: exit 2, nothing
run). Each scenario then runs into ``OUT/<name>/`` like ``baft run`` (verdict,
report); at the end ``OUT/suite.json`` lists every verdict, ``OUT/junit.xml``
gives one test case per scenario and ``OUT/report.html`` / ``report.md`` the
suite's table. The reference runs are shared through the cache.
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from analysis.junit import write_junit
from analysis.verdict import NotRun, Verdict
from harness.errors import HarnessError, ScenarioError
from harness.scenario import Scenario, load


def discover(directory: Path) -> list[Path]:
    """The scenario files of ``directory`` (``*.yaml`` / ``*.yml``, sorted by name)."""
    if not directory.is_dir():
        raise ScenarioError(str(directory), "", "a directory of scenario files", "<not a directory>")
    files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml"))
    if not files:
        raise ScenarioError(str(directory), "", "at least one *.yaml scenario", "<none>")
    return files


def load_all(files: list[Path]) -> list[Scenario]:
    """Every scenario, validated; the first problem raises :class:`ScenarioError`. Names must be unique
    (each run gets ``OUT/<name>``)."""
    scenarios: list[Scenario] = []
    seen: dict[str, str] = {}
    for f in files:
        s = load(f)
        if s.name in seen:
            raise ScenarioError(str(f), "name", f"a name no other scenario of the suite uses ({seen[s.name]} has it)", s.name)
        seen[s.name] = str(f)
        scenarios.append(s)
    return scenarios


def bar(done: int, total: int, width: int = 24) -> str:
    filled = width * done // total if total else width
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total}"


def run_suite(directory: Path, out: Path, cache: Path | None = None,
              echo: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
              report: bool = True) -> list[Verdict | NotRun]:
    """Run the suite; returns one entry per scenario: its verdict, or why it could not run."""
    from analysis.report import suite_report
    from harness.run.runner import run_scenario

    scenarios = load_all(discover(directory))
    out.mkdir(parents=True, exist_ok=True)
    results: list[Verdict | NotRun] = []
    t0 = time.monotonic()
    for i, s in enumerate(scenarios):
        echo(f"{bar(i, len(scenarios))} {s.name} ...")
        t = time.monotonic()
        v: Verdict | NotRun
        try:
            v = run_scenario(s, out / s.name, cache, report=report)
        except HarnessError as e:
            v = NotRun(scenario=s.name, error=str(e))
        results.append(v)
        verdict = "ERROR" if isinstance(v, NotRun) else "PASSED" if v.passed else "FAILED"
        echo(f"{bar(i + 1, len(scenarios))} {s.name}: {verdict} ({time.monotonic() - t:.0f} s)")
    suite = directory.resolve().name
    (out / "suite.json").write_text(json.dumps({"suite": suite, "directory": str(directory), "seconds": time.monotonic() - t0,
                                                "passed": all(r.passed for r in results),
                                                "scenarios": [r.to_json() for r in results]},
                                               indent=2) + "\n")
    write_junit(out / "junit.xml", suite, results)
    if report:
        suite_report(out)
    return results
