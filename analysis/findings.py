"""The findings table: what each run's resume did and why, from the runs' verdicts (``baft findings``).

The findings table in docs/scripts.md is this table for the shipped examples, not written by hand: one row per
run — where it resumed and what it lost, whether it went on bit for bit, the first divergence, and the likely
cause the diagnosis named with its first piece of evidence.
"""
from __future__ import annotations

from pathlib import Path

from .errors import AnalysisError
from .verdict import Verdict, load_verdict

COLUMNS = ("scenario", "resumed", "bit for bit?", "first divergence", "likely cause", "evidence")


def run_dirs(paths: list[Path]) -> list[Path]:
    """The run directories under ``paths`` (a run directory, or a suite's with one per scenario), in order."""
    out: list[Path] = []
    for p in paths:
        if (p / "verdict.json").is_file():
            out.append(p)
        elif p.is_dir() and (found := sorted(d.parent for d in p.glob("*/verdict.json"))):
            out += found
        else:
            raise AnalysisError(f"{p}: not a run directory (no verdict.json) nor a suite of runs")
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def row(v: Verdict) -> list[str]:
    """One run's row."""
    recs = v.recoveries
    if recs and any(r.recovery_seconds is None for r in recs):
        resumed = "never recovered"
    elif recs:
        parts = []
        for r in recs:
            mid = any(p.incarnation and p.step == r.restored_step for p in v.partial_steps)
            parts.append(f"{'mid-step ' if mid else 'step '}{r.restored_step}, {r.lost_steps} lost")
        resumed = "; ".join(parts)
    else:
        resumed = "no restart" if v.completed else "never recovered"
    d = v.first_divergence
    first = f"step {d.step}, `{d.component} / {d.key}` (rank {d.rank})" if d is not None else "—"
    causes = list(dict.fromkeys(c.code for c in v.diagnosis))
    evidence = "; ".join(dict.fromkeys(c.evidence[0] for c in v.diagnosis if c.evidence))  # each cause's first
    if not evidence and not v.passed:
        evidence = "; ".join(v.failures)[:200]
    if not evidence:
        evidence = "every component equals the reference" if v.bitwise_equal else "judged by the loss curve" \
            if v.loss_curve is not None else ""
    return [v.scenario, resumed, "yes" if v.bitwise_equal else "no", first,
            ", ".join(f"`{c}`" for c in causes) or "—", evidence]


def table(paths: list[Path]) -> str:
    """The Markdown table of the runs under ``paths``."""
    rows = [row(load_verdict(d)) for d in run_dirs(paths)]
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)
