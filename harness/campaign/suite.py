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
from typing import Any

from analysis.junit import write_junit

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
    scenarios, seen = [], {}
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
              report: bool = True) -> list[dict[str, Any]]:
    """Run the suite; returns one entry per scenario (its verdict, or ``{"scenario", "error"}``)."""
    from analysis.report import suite_report

    from harness.run.runner import run_scenario

    scenarios = load_all(discover(directory))
    out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for i, s in enumerate(scenarios):
        echo(f"{bar(i, len(scenarios))} {s.name} ...")
        t = time.monotonic()
        try:
            v = run_scenario(s, out / s.name, cache, report=report)
        except HarnessError as e:
            v = {"scenario": s.name, "error": str(e), "passed": False}
        results.append(v)
        verdict = "ERROR" if "error" in v else "PASSED" if v["passed"] else "FAILED"
        echo(f"{bar(i + 1, len(scenarios))} {s.name}: {verdict} ({time.monotonic() - t:.0f} s)")
    suite = directory.resolve().name
    (out / "suite.json").write_text(json.dumps({"suite": suite, "directory": str(directory), "seconds": time.monotonic() - t0,
                                                "passed": all(r.get("passed") for r in results), "scenarios": results},
                                               indent=2) + "\n")
    write_junit(out / "junit.xml", suite, results)
    if report:
        suite_report(out)
    return results


def table(results: list[dict[str, Any]]) -> str:
    """The suite's summary for the terminal."""
    rows = [("scenario", "verdict", "bitwise", "lost", "recovery s", "why")]
    for r in results:
        if "error" in r:
            rows.append((r["scenario"], "ERROR", "-", "-", "-", r["error"][:60]))
            continue
        rec = r.get("recovery_seconds")
        rows.append((r["scenario"], "PASSED" if r["passed"] else "FAILED", "yes" if r["bitwise_equal"] else "NO",
                     str(r["lost_steps"]), f"{rec:.1f}" if rec is not None else "-", "; ".join(r["failures"])[:60]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)
