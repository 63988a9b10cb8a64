"""JUnit XML for a suite of verdicts, so any CI shows one test per scenario.

One ``<testsuite>`` with a ``<testcase>`` per scenario (classname ``baft.<suite>``,
time = the faulted run's wall seconds); a failed verdict becomes ``<failure>``
whose message is the first reason and whose text lists every reason and the
key numbers; a scenario the harness could not run at all becomes ``<error>``.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def _details(v: dict[str, Any]) -> str:
    lines = list(v.get("failures", []))
    lines.append(f"bitwise_equal={v.get('bitwise_equal')} lost_steps={v.get('lost_steps')} "
                 f"recovery_seconds={v.get('recovery_seconds')} faults_fired={v.get('faults_fired')}/{v.get('faults_declared')}")
    return "\n".join(lines)


def junit_xml(suite: str, results: list[dict[str, Any]]) -> str:
    """``results``: verdicts (as in verdict.json), or ``{"scenario", "error"}`` for a run that could not happen."""
    failures = sum(1 for r in results if "error" not in r and not r.get("passed"))
    errors = sum(1 for r in results if "error" in r)
    total = sum(float((r.get("wall_seconds") or {}).get("faulted") or 0.0) for r in results)
    root = ET.Element("testsuites", name=f"baft {suite}", tests=str(len(results)), failures=str(failures),
                      errors=str(errors), time=f"{total:.3f}")
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(results)), failures=str(failures),
                       errors=str(errors), time=f"{total:.3f}")
    for r in results:
        t = float((r.get("wall_seconds") or {}).get("faulted") or 0.0)
        case = ET.SubElement(ts, "testcase", classname=f"baft.{suite}", name=str(r.get("scenario")), time=f"{t:.3f}")
        if "error" in r:
            ET.SubElement(case, "error", message=str(r["error"])[:500]).text = str(r["error"])
        elif not r.get("passed"):
            first = (r.get("failures") or ["failed"])[0]
            ET.SubElement(case, "failure", message=first[:500], type="verdict").text = _details(r)
        else:
            ET.SubElement(case, "system-out").text = _details(r)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(path: Path, suite: str, results: list[dict[str, Any]]) -> Path:
    path.write_text(junit_xml(suite, results), encoding="utf-8")
    return path
