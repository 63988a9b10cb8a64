"""pytest plugin (entry point ``pytest11``): ``pytest scenarios/ci`` runs each scenario as a test.

Every ``*.yaml`` file under a directory named ``scenarios`` is collected as one
test item named after the scenario. It is marked ``e2e`` plus the marks the file
lists (``marks: [slow, netns]``; they must be registered, as usual with
``--strict-markers``). The item runs the scenario like ``baft run`` into
``--baft-out DIR/<name>`` (default: pytest's temporary directory) with the
reference cache of ``--baft-cache`` (default: ``$BAFT_CACHE_DIR`` or
``~/.cache/baft-harness``). A failed verdict is reported as the verdict's
summary, not a traceback; a scenario file with bad input fails with its one-line
error. JUnit XML comes from pytest itself (``--junitxml``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("baft", "baft-harness scenarios")
    group.addoption("--baft-out", type=Path, help="directory for each scenario's run (default: pytest's tmp dir)")
    group.addoption("--baft-cache", type=Path, help="reference cache (default $BAFT_CACHE_DIR or ~/.cache/baft-harness)")
    group.addoption("--baft-no-report", action="store_true", help="skip each run's HTML/Markdown report")


def pytest_configure(config: pytest.Config) -> None:
    for line in ("e2e: real processes, real gloo, real torchrun (every scenario item)",
                 "slow: takes more than a few seconds", "netns: needs root for network namespaces and tc"):
        config.addinivalue_line("markers", line)


def pytest_collect_file(parent: pytest.Collector, file_path: Path) -> pytest.Collector | None:
    if file_path.suffix in (".yaml", ".yml") and "scenarios" in file_path.parts:
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


class ScenarioUnusable(Exception):
    """The scenario could not be loaded or run; the message is all there is to say."""


class ScenarioFailed(Exception):
    """The verdict did not hold; carries the summary."""


class ScenarioFile(pytest.File):
    def collect(self) -> Any:
        from harness.errors import ScenarioError
        from harness.scenario import load

        try:
            scenario = load(self.path)
        except ScenarioError as e:
            yield ScenarioItem.from_parent(self, name=self.path.stem, scenario=None, error=str(e))
            return
        item = ScenarioItem.from_parent(self, name=scenario.name, scenario=scenario, error=None)
        item.add_marker(pytest.mark.e2e)
        for mark in scenario.marks:
            item.add_marker(getattr(pytest.mark, mark))
        yield item


class ScenarioItem(pytest.Item):
    def __init__(self, *, scenario: Any, error: str | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenario, self.error = scenario, error

    def runtest(self) -> None:
        if self.error is not None:
            raise ScenarioUnusable(self.error)
        from analysis.summary import format_summary
        from harness.errors import HarnessError
        from harness.run.runner import run_scenario

        if self.scenario.uses_netns and os.geteuid() != 0:
            pytest.skip("needs root: the scenario runs nodes in network namespaces")
        config = self.config
        base = config.getoption("--baft-out") or config._tmp_path_factory.getbasetemp() / "baft"  # type: ignore[attr-defined]
        out = Path(base) / self.scenario.name
        try:
            verdict = run_scenario(self.scenario, out, config.getoption("--baft-cache"),
                                   report=not config.getoption("--baft-no-report"))
        except HarnessError as e:
            raise ScenarioUnusable(f"{self.scenario.name}: {e}") from None
        self.user_properties.append(("verdict", str(out / "verdict.json")))
        if not verdict.passed:
            raise ScenarioFailed(format_summary(verdict, out))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, (ScenarioFailed, ScenarioUnusable)):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"scenario {self.name}"
