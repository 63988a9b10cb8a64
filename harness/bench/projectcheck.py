"""``baft project --check RUN_DIR...``: the projection's rules predict runs we made, from their own profiles.

For each ``baft run`` directory: its profile (:mod:`analysis.profile`), the
launch settings its scenario gave (the watchdog's timeout, the survivors' last
call), the prediction of its overhead and of each recovery
(:func:`analysis.projcheck.check_run`) against its verdict; over all of them the
errors (:func:`analysis.projcheck.summarize`). Writes ``check.json``.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.errors import AnalysisError
from analysis.journal import Journal
from analysis.profile import Profile, profile_of_run
from analysis.projcheck import Launch, check_run, measured_relaunch, summarize
from analysis.verdict import Verdict, load_verdict
from harness.errors import UsageError
from harness.scenario import load


def run_dirs(paths: list[Path]) -> list[Path]:
    """The run directories named, or found one level below a directory that is not one itself (a suite's)."""
    out: list[Path] = []
    for p in paths:
        if (p / "verdict.json").is_file():
            out.append(p)
        elif p.is_dir() and (found := sorted(d for d in p.iterdir() if (d / "verdict.json").is_file())):
            out.extend(found)
        else:
            raise UsageError(f"--check {p}: not a run directory of `baft run` (no verdict.json in it or below it)")
    return out


@dataclass(kw_only=True, slots=True)
class _Run:
    name: str
    verdict: Verdict
    profile: Profile
    journal: Journal
    launch: Launch

    @property
    def relaunches(self) -> list[float]:
        return [x for r in self.verdict.recoveries if (x := measured_relaunch(r, self.launch)) is not None]


def _read(run_dir: Path) -> _Run:
    try:
        verdict = load_verdict(run_dir)
        scenario = load(run_dir / "scenario.yaml", host=False, files=False)
        profile = profile_of_run(run_dir)
        journal = Journal.load(run_dir / "faulted")
    except (AnalysisError, OSError) as e:
        raise UsageError(f"--check {run_dir}: {e}") from None
    launch = Launch(hang_timeout=scenario.run.hang_timeout, last_call=scenario.run.last_call)
    return _Run(name=verdict.scenario or scenario.name, verdict=verdict, profile=profile, journal=journal, launch=launch)


def run_check(paths: list[Path], out: Path) -> dict[str, Any]:
    """Check every run of ``paths`` (each one's relaunch calibrated on the others of its kind, one node or
    several); write ``out/check.json``; returns what it holds."""
    runs = [_read(d) for d in run_dirs(paths)]
    checks = []
    for i, r in enumerate(runs):
        others = [x for j, o in enumerate(runs) if j != i and (o.profile.nodes > 1) == (r.profile.nodes > 1)
                  for x in o.relaunches]
        relaunch = statistics.median(others) if others else None
        checks.append(check_run(r.name, r.profile, r.journal, r.verdict.recoveries, r.launch, relaunch))
    result = {"runs": [c.to_json() for c in checks], "summary": summarize(checks).to_json()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "check.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def check_table(result: dict[str, Any]) -> str:
    lines = [f"  {'scenario':<30} {'strategy':<8} {'overhead pred/meas':>20}  recoveries: fault@steps done: "
             "restored pred/meas (tier), recovery s pred/meas"]
    for r in result["runs"]:
        lines.append(f"  {r['scenario']:<30} {r['strategy']:<8} "
                     f"{_pct(r['predicted_overhead']):>9} {_pct(r['measured_overhead']):>9}")
        for f in r["faults"]:
            meas = "-" if f["measured_recovery"] is None else f"{f['measured_recovery']:.2f}"
            lines.append(f"      {f['fault']}@{f['progress']}: restored {f['predicted_step']} ({f['predicted_tier']}) / "
                         f"{f['measured_step']} ({f['measured_tier']}), lost {f['predicted_lost']} / {f['measured_lost']}; "
                         f"{f['predicted_recovery']:.2f} / {meas} s")
        for n in r["not_modelled"]:
            lines.append(f"      not modelled: {n}")
    s = result["summary"]
    lost = (f"{s['lost_exact']} of {s['recoveries']} exact, mean |error| {s['lost_mean_abs_error']:.2f} steps"
            if s["recoveries"] else "no recovery")
    rec = (f"median |error| {s['recovery_median_abs_error']:.2f} s ({100 * s['recovery_median_rel_error']:.0f}% of "
           f"the measured)" if s["recovery_median_abs_error"] is not None else "-")
    ovh = (f"mean |error| {s['overhead_mean_abs_error']:.1f} points over {s['overhead_runs']} runs (predicted - "
           "measured: " + ", ".join(f"{k} {v:+.1f}" for k, v in s["overhead_by_strategy"].items()) + ")"
           if s["overhead_mean_abs_error"] is not None else "-")
    lines.append(f"{s['runs']} runs: lost steps {lost}; recovery time {rec}; overhead {ovh}")
    return "\n".join(lines)
