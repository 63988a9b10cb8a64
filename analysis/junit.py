"""JUnit XML for a suite of verdicts, so any CI shows one test per scenario.

One ``<testsuite>`` with a ``<testcase>`` per scenario (classname ``baft.<suite>``,
time = the faulted run's wall seconds); a failed verdict becomes ``<failure>``
whose message is the first reason and whose text lists every reason and the
key numbers; a scenario the harness could not run at all becomes ``<error>``.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from .verdict import NotRun, Verdict


def _details(v: Verdict) -> str:
    lines = list(v.failures)
    lines.append(f"bitwise_equal={v.bitwise_equal} lost_steps={v.lost_steps} "
                 f"recovery_seconds={v.recovery_seconds} faults_fired={v.faults_fired}/{v.faults_declared}")
    return "\n".join(lines)


def _seconds(r: Verdict | NotRun) -> float:
    """The faulted run's wall seconds (0 for a scenario that did not run)."""
    return r.wall_seconds.faulted if isinstance(r, Verdict) and r.wall_seconds is not None else 0.0


def junit_xml(suite: str, results: list[Verdict | NotRun]) -> str:
    """``results``: the verdicts, and a :class:`NotRun` for each run that could not happen."""
    failures = sum(1 for r in results if isinstance(r, Verdict) and not r.passed)
    errors = sum(1 for r in results if isinstance(r, NotRun))
    total = sum(_seconds(r) for r in results)
    root = ET.Element("testsuites", name=f"baft {suite}", tests=str(len(results)), failures=str(failures),
                      errors=str(errors), time=f"{total:.3f}")
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(results)), failures=str(failures),
                       errors=str(errors), time=f"{total:.3f}")
    for r in results:
        case = ET.SubElement(ts, "testcase", classname=f"baft.{suite}", name=r.scenario, time=f"{_seconds(r):.3f}")
        if isinstance(r, NotRun):
            ET.SubElement(case, "error", message=r.error[:500]).text = r.error
        elif not r.passed:
            first = (r.failures or ["failed"])[0]
            ET.SubElement(case, "failure", message=first[:500], type="verdict").text = _details(r)
        else:
            ET.SubElement(case, "system-out").text = _details(r)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(path: Path, suite: str, results: list[Verdict | NotRun]) -> Path:
    path.write_text(junit_xml(suite, results), encoding="utf-8")
    return path
