"""``report.md`` and a self-contained ``report.html`` for a run directory, or for a suite of them.

A run directory is what ``baft run`` writes (``verdict.json``, ``scenario.yaml``,
``reference/journal``, ``faulted/journal``). Its report holds, first, the plot
that tells the story (loss per step of both runs with the fault and restore
markers), then the verdict, the recoveries phase by phase, window faults,
checkpoints rejected or failed, goodput and overhead, bubble use, the loss-curve
verdict when there is one, and the checkpoint-interval advice (Young/Daly) for a
few failure rates. The document is built once as a list of blocks and rendered
twice: Markdown (figures as PNG files next to it) and HTML (figures embedded).

A suite directory holds run directories (one per scenario); its report is a
table of their verdicts linking to each run's report.
"""
from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .advisor import advise, measured_cost
from .errors import AnalysisError
from .journal import Journal
from .losscurve import LossVerdict
from .metrics import RECOVERY_PHASES, Efficiency, Recovery, fault_target
from .summary import count
from .verdict import ClusterFacts, Verdict, load_verdict

#: Failure rates the interval advice is given for (mean time between failures, hours).
MTBF_HOURS = (1.0, 6.0, 24.0)

Block = tuple[str, Any]
"""("h2", text) | ("p", text) | ("table", (headers, rows)) | ("img", (path, caption)) | ("pre", text)"""


@dataclass(slots=True)
class Report:
    """The files a report wrote."""

    markdown: Path
    html: Path
    figures: list[Path] = field(default_factory=list)


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:+.2f}%"


def _scenario_every(run_dir: Path) -> int | None:
    import yaml

    try:
        data = yaml.safe_load((run_dir / "scenario.yaml").read_text())
        return int(data.get("checkpoint", {}).get("every", 10))
    except (OSError, AttributeError, TypeError, ValueError, yaml.YAMLError):
        return None


def _current_every(run: Journal, run_dir: Path) -> int | None:
    """Steps between the checkpoints a restore could use: baft's snapshots (every k iterations,
    as planned), else the scenario's ``checkpoint.every``."""
    rank = min(run.ranks) if run.ranks else None
    snaps = len(run.events("snapshot", rank)) if rank is not None else 0
    if snaps:
        return max(1, round(len(run.events("step", rank)) / snaps))
    return _scenario_every(run_dir)


def run_blocks(run_dir: Path, mtbf_hours: tuple[float, ...] = MTBF_HOURS) -> tuple[list[Block], list[Path]]:
    """The blocks of one run's report, and the figures drawn for it (into ``run_dir``)."""
    from .metrics import efficiency
    from .plots import loss_figure, progress_figure, recovery_figure, timeline_figure

    v = load_verdict(run_dir)
    reference, run = Journal.load(run_dir / "reference"), Journal.load(run_dir / "faulted")
    steps = max((e["step"] for e in reference.events("finish")), default=0)
    eff = v.metrics or efficiency(reference, run, steps)
    figures = [f for f in (
        loss_figure(reference, run, v, run_dir / "loss.png"),
        progress_figure(reference, run, v, run_dir / "progress.png"),
        recovery_figure(v, run_dir / "recovery.png"),
        timeline_figure(run, run_dir / "timeline.png"),
    ) if f is not None]
    status = "PASSED" if v.passed else "FAILED"
    blocks: list[Block] = [("h1", f"{v.scenario}: {status}")]
    if v.failures:
        blocks.append(("p", "Why it failed: " + "; ".join(v.failures)))
    captions = {
        "loss.png": "Loss per step of the reference (blue) and the faulted run (orange; dashed after each restart). "
                    "Red dotted lines: fatal faults; green triangles: where the job resumed; shaded: window faults.",
        "progress.png": "Steps completed over wall time. A fault stalls the run, a restore drops it back to the "
                        "restored step; the shaded span lasts until the lost work is redone.",
        "recovery.png": "Where each recovery's time went: detection, restart (torchrun notices, stops, "
                        "re-rendezvous, spawns), startup, process-group rendezvous, restore, first step, catch-up.",
        "timeline.png": "One steady-state iteration per rank: compute, the bubbles between (grey) and baft's "
                        "snapshot copies placed inside them (green).",
    }
    for f in figures[:1]:
        blocks.append(("img", (f, captions[f.name])))
    blocks += _verdict_blocks(v)
    recs = v.recoveries
    blocks += _recovery_blocks(recs)
    for f in figures[1:3]:
        blocks.append(("img", (f, captions[f.name])))
    if v.cluster is not None:  # a run on a cluster: what the harness did with Chaos Mesh, firing by firing
        blocks += _cluster_blocks(v.cluster)
    blocks += _event_blocks(v)
    if v.loss_curve is not None:
        blocks += _loss_curve_blocks(v.loss_curve)
    blocks += _cost_blocks(eff)
    for f in figures[3:]:
        blocks.append(("img", (f, captions[f.name])))
    blocks += advice_blocks(run, eff, mtbf_hours, _current_every(run, run_dir), recs)
    return blocks, figures


def _verdict_blocks(v: Verdict) -> list[Block]:
    """The verdict's table: equal or not, where first, faults, lost steps, recovery, the world size."""
    blocks: list[Block] = []
    div = v.first_divergence
    rows = [
        ["bitwise equal", _fmt(v.bitwise_equal) + f" ({v.states_compared} state, {v.losses_compared} loss records)"],
        ["first divergence", "none" if div is None else
         f"step {div.step}, {div.component} / {div.key} (rank {div.rank})"],
        ["faults fired", f"{v.faults_fired}/{v.faults_declared} ({count(v.fault_occurrences, 'occurrence')})"],
        ["lost steps (worst)", _fmt(v.lost_steps)],
        ["recovery seconds (worst)", _fmt(v.recovery_seconds)],
        ["completed", _fmt(v.completed)],
    ]
    ws = v.world_size
    if ws is not None and ws.changed:
        rows.append(["world size", f"{ws.path.replace('->', '→')} ({v.resized_records} records after "
                     f"{ws.first_change} judged by the loss curve)"])
    blocks += [("h2", "Verdict"), ("table", (["", ""], rows))]
    return blocks


def _recovery_blocks(recs: list[Recovery]) -> list[Block]:
    """Each recovery's row (its phases in seconds), how each script resumed, and what the phases mean."""
    blocks: list[Block] = []
    if recs:
        blocks.append(("h2", "Recoveries"))
        head = ["fault", "step", "restored", "tier", "lost", "recovered s", "caught up s"] + list(RECOVERY_PHASES)
        body = []
        for r in recs:
            ph = r.phases or {}
            body.append([f"{r.fault['fault']} {fault_target(r.fault)}", _fmt(r.fault.get("step")),
                         _fmt(r.restored_step), r.restored_tier or "none", _fmt(r.lost_steps),
                         _fmt(r.recovery_seconds), _fmt(r.caught_up_seconds)]
                        + [_fmt(ph.get(p), 2) for p in RECOVERY_PHASES])
        blocks.append(("table", (head, body)))
        for r in recs:
            if r.resume:
                blocks.append(("p", f"{r.fault['fault']} {fault_target(r.fault)} at step {r.fault.get('step')}: "
                                    f"{r.resume} (found by matching the script's first state against the reference)"))
            if r.restaged:
                blocks.append(("p", f"{r.fault['fault']} {fault_target(r.fault)} at step {r.fault.get('step')}: "
                                    f"the job restarted cut into other pipeline stages, {r.restaged}"))
        blocks.append(("p", "Phases (seconds, each ending when the last rank got there): " + "; ".join([
            "detection: fault → watchdog (stalls only)", "restart: → new worker processes exist",
            "startup: → process-group init begins", "rendezvous: → group formed", "restore: → checkpoint loaded",
            "first_step: → every rank finished a step", "catch_up: → the pre-fault step is done again"])))
    return blocks


def _cluster_blocks(cluster: ClusterFacts) -> list[Block]:
    """What the harness did with Chaos Mesh on a cluster, firing by firing."""
    blocks: list[Block] = []
    blocks += [("h2", "On the cluster"),
               ("p", f"Namespace {cluster.namespace}, run id {cluster.run_id}, steps read from "
                     + (f"the W&B run {cluster.wandb_run}" if cluster.wandb_run
                        else f"the journal in {cluster.job_dir}") + ". Steps: the one the scenario asked for, the one the harness had read "
                     "when it created the objects, the one the job had reached once Chaos Mesh confirmed them."),
               ("table", (["fault", "occurrence", "status", "due step", "fired at", "injected by", "inject s",
                           "deleted at", "recovered s", "objects / why"], [
                   [f"faults[{f.id}] {f.fault}", _fmt(f.occurrence), f.status, _fmt(f.due_step),
                    _fmt(f.step), _fmt(f.injected_step), _fmt(f.inject_seconds), _fmt(f.deleted_step),
                    _fmt(f.recover_seconds), f.why or ", ".join(f.objects)]
                   for f in cluster.firings]))]
    return blocks


def _event_blocks(v: Verdict) -> list[Block]:
    """The tables of what happened besides the faults: window faults, checkpoints refused, interval and
    replication changes, steps resumed mid-way, the likely cause, preemptions, teardown hangs."""
    blocks: list[Block] = []
    if v.windows:
        blocks += [("h2", "Window faults"), ("table", (["fault", "target", "from step", "to step", "effect"], [
            [w.fault, w.target, _fmt(w.from_step), _fmt(w.to_step) if w.to_step is not None else "end",
             w.effect] for w in v.windows]))]
    bad = [("rejected", c) for c in v.checkpoints_rejected] + [("write failed", c) for c in v.checkpoints_failed]
    if bad:
        blocks += [("h2", "Checkpoints rejected or failed"), ("table", (["what", "step", "tier", "reason"], [
            [k, _fmt(c.step), c.tier, c.reason] for k, c in bad]))]
    if v.interval_changes:
        blocks += [("h2", "Adaptive persist interval"),
                   ("p", "checkpoint.mtbf_hours: at each persist boundary the ranks agreed on the cost of a persist "
                         "and the interval became Daly's optimum for it (one row per change; a restarted process "
                         "starts from checkpoint.every again)."),
                   ("table", (["step", "every before", "every after", "cost per persist (ms)", "why"], [
                       [_fmt(c.step), _fmt(c.before), _fmt(c.every), _fmt(c.cost_seconds * 1e3), c.why]
                       for c in v.interval_changes]))]
    if v.plan_overflows:
        blocks += [("h2", "Snapshots the windows could not hold"),
                   ("p", "baft's planner places each stage's snapshot inside the pipeline windows it measured; where "
                         "they are too short for the state (a zero-bubble schedule, a large stage), it does what "
                         "checkpoint.baft.planner.overflow says: every_k snapshots every k iterations, stall copies "
                         "the rest at the step boundary (one row per rank and decision)."),
                   ("table", (["rank", "from step", "windows", "idle ms", "state MB", "not held MB", "decision"], [
                       [_fmt(p.rank), _fmt(p.step), _fmt(p.windows), _fmt(p.idle_ms), _fmt(p.bytes / 1e6),
                        _fmt(p.overflow_bytes / 1e6),
                        f"every {p.every} iterations" if p.policy == "every_k" else f"stall {p.stall_ms:.1f} ms"]
                       for p in v.plan_overflows]))]
    if v.replication_changes:
        blocks += [("h2", "Replication stopped or resumed"),
                   ("p", "A node's store stops replicating when its link makes the newest peer copy older than the "
                         "newest persistent checkpoint (recovery then uses the persistent tier) and probes the link "
                         "again later."),
                   ("table", (["node", "step", "what", "why"], [
                       [c.node, _fmt(c.step), "stopped" if c.stopped else "resumed", c.reason]
                       for c in v.replication_changes]))]
    if v.partial_steps:
        blocks += [("h2", "Steps resumed mid-way"), ("p", "A restarted process resumed between two micro-batches of a "
                   "step (the accumulated gradient restored): its loss covers only the backward calls it made and is "
                   "not compared; the state after the step is."), ("table", (["rank", "step", "incarnation", "what"], [
                       [_fmt(p.rank), _fmt(p.step), _fmt(p.incarnation), p.describe()] for p in v.partial_steps]))]
    if v.diagnosis:
        blocks += [("h2", "Likely cause"), ("p", "Named from the journals: where each rank's restored state matches "
                   "the reference's history, component by component (analysis/diagnosis.py)."),
                   ("table", (["cause", "restart", "what", "evidence", "usual fix"], [
                       [c.code, _fmt(c.incarnation), c.summary, "; ".join(c.evidence[:4]), c.fix or "–"]
                       for c in v.diagnosis]))]
    if v.latent:
        blocks += [("h2", "Latent findings"), ("p", "A random number generator differs after the resume, but nothing "
                   "drew from it that training used: model, optimizer, data and every loss stayed bit for bit to the "
                   "end. The run passes (expect: {rng: strict} fails it); a later draw (dropout, a shuffle) would "
                   "diverge."), ("table", (["cause", "restart", "what", "evidence", "usual fix"], [
                       [c.code, _fmt(c.incarnation), c.summary, "; ".join(c.evidence[:4]), c.fix or "–"]
                       for c in v.latent]))]
    if v.preemptions:
        blocks += [("h2", "Preemptions"), ("p", "SIGTERM to the node's torchrun agent and workers (or the ranks "
                   "named), a grace period, then SIGKILL to whatever was still alive; the node's memory went with it."),
                   ("table", (["fault", "step", "grace (s)", "ended in the grace", "killed", "persisted in the grace"], [
                       [_fmt(p.fault), _fmt(p.step), _fmt(p.grace_s), ", ".join(map(str, p.ended)) or "none",
                        ", ".join(map(str, p.killed)) or "none", p.flush_text] for p in v.preemptions]))]
    for h in v.teardown_hangs:
        blocks += [("h2", f"Teardown hang: {h.run} run, rank {h.rank}"), ("p", h.describe()), ("pre", h.where)]
    return blocks


def _loss_curve_blocks(lc: LossVerdict) -> list[Block]:
    """How the loss curve was judged: the worst window and the equivalence test."""
    blocks: list[Block] = []
    worst, eq = lc.worst_window, lc.equivalence
    blocks += [("h2", "Loss curve"), ("table", (["", ""], [
        ["judged", "passed" if lc.passed else "FAILED: " + "; ".join(lc.failures)],
        ["steps compared", f"{lc.steps_compared} from step {lc.from_step}, windows of {lc.window}"],
        ["worst window", f"steps {worst.steps}: run {_fmt(worst.run, 6)}, reference "
                         f"{_fmt(worst.reference, 6)}, off {_fmt(worst.deviation)}, tolerance "
                         f"{_fmt(worst.tolerance)}" if worst else "identical"],
        ["equivalence", "not asked" if eq is None else
         f"{'shown' if eq.equivalent else 'NOT shown'}: mean relative difference {_pct(eq.mean_relative_difference)}, "
         f"interval [{_pct(eq.interval[0])}, {_pct(eq.interval[1])}], margin ±{100 * eq.margin:.2f}%"],
    ]))]
    return blocks


def _cost_blocks(eff: Efficiency) -> list[Block]:
    """What the faults and the checkpoints cost: wall time, goodput, iteration overhead, the bubbles."""
    blocks: list[Block] = []
    blocks.append(("h2", "Cost"))
    g, it, ck = eff.goodput_steps_per_second, eff.iteration_seconds, eff.checkpoint
    blocks.append(("table", (["", "reference", "faulted run", ""], [
        ["wall seconds", _fmt(eff.wall_seconds.reference), _fmt(eff.wall_seconds.faulted), ""],
        ["goodput (steps/s)", _fmt(g.reference), _fmt(g.faulted), f"ratio {_fmt(eff.goodput_ratio)}"],
        ["median iteration (s)", _fmt(it.reference), _fmt(it.faulted), f"overhead {_pct(eff.iteration_overhead)}"],
        ["persistent checkpoints", "", _fmt(ck.persistent_saved), f"mean write {_fmt(ck.persistent_mean_seconds)} s"],
        ["snapshot stall per iteration (ms)", "", _fmt(ck.snapshot_stall_ms_per_iteration), f"{ck.snapshots} snapshots"],
    ])))
    if eff.bubbles:
        blocks += [("h2", "Bubbles"), ("table", (["rank", "mean idle ms / iteration", "share of idle time used by the copy",
                                                  "bytes copied inside bubbles"], [
            [r, _fmt(b.idle_ms), _pct(b.utilisation).lstrip("+"), _pct(b.in_window_fraction).lstrip("+")]
            for r, b in eff.bubbles.items()]))]
    return blocks


def advice_blocks(run: Journal, eff: Efficiency, mtbf_hours: tuple[float, ...], every: int | None,
                  recs: list[Recovery]) -> list[Block]:
    """The Young/Daly checkpoint-interval table for this run's measured costs."""
    cost, how = measured_cost(run)
    iteration = eff.iteration_seconds.faulted
    if cost is None or not iteration:
        return [("h2", "Checkpoint interval advice"), ("p", f"Not available: {how}.")]
    restart = max((r.recovery_seconds for r in recs if r.recovery_seconds is not None), default=0.0)
    rows = []
    for h in mtbf_hours:
        a = advise(cost, h * 3600, iteration, restart, every)
        rows.append([f"{h:g} h", _fmt(a["daly_seconds"]), _fmt(a["young_seconds"]), str(a["every_steps"]),
                     _pct(a["waste"]).lstrip("+"), _pct(a.get("current_waste")).lstrip("+")])
    return [("h2", "Checkpoint interval advice"),
            ("p", f"Measured checkpoint cost on the training thread: {cost * 1e3:.2f} ms ({how}); iteration "
                  f"{iteration * 1e3:.1f} ms; restart {restart:.1f} s (the worst recovery here). Young's and Daly's "
                  f"optimum interval and the expected share of time wasted (checkpointing + work redone + restarts), "
                  f"against checkpointing every {every} steps as this run did."),
            ("table", (["MTBF", "Daly interval (s)", "Young interval (s)", "every (steps)", "waste", "waste now"], rows))]


def _md(blocks: list[Block], base: Path) -> str:
    out = []
    for kind, c in blocks:
        if kind in ("h1", "h2"):
            out.append(("# " if kind == "h1" else "## ") + c)
        elif kind == "p":
            out.append(c)
        elif kind == "pre":
            out.append("```\n" + c + "\n```")
        elif kind == "img":
            path, caption = c
            out.append(f"![{Path(path).stem}]({Path(path).relative_to(base).as_posix()})\n\n*{caption}*")
        elif kind == "table":
            head, rows = c
            lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(str(x).replace("|", "\\|") for x in row) + " |" for row in rows]
            out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


_CSS = """body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:.5em 0 1.2em}td,th{border:1px solid #ddd;padding:3px 8px;font-size:13px;text-align:left}
th{background:#f3f3f3}img{max-width:100%}figcaption{font-size:12px;color:#555;margin-bottom:1.2em}
.PASSED{color:#2a7a2a}.FAILED{color:#b22222}pre{background:#f6f6f6;padding:.6em}"""


def _html(blocks: list[Block], title: str) -> str:
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           f"<style>{_CSS}</style></head><body>"]
    for kind, c in blocks:
        if kind == "h1":
            cls = "FAILED" if "FAILED" in c else "PASSED" if "PASSED" in c else ""
            out.append(f"<h1 class='{cls}'>{html.escape(c)}</h1>")
        elif kind == "h2":
            out.append(f"<h2>{html.escape(c)}</h2>")
        elif kind == "p":
            out.append(f"<p>{html.escape(c)}</p>")
        elif kind == "pre":
            out.append(f"<pre>{html.escape(c)}</pre>")
        elif kind == "img":
            path, caption = c
            data = base64.b64encode(Path(path).read_bytes()).decode()
            out.append(f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{data}'>"
                       f"<figcaption>{html.escape(caption)}</figcaption></figure>")
        elif kind == "table":
            head, rows = c
            out.append("<table><tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in head) + "</tr>")
            for row in rows:
                out.append("<tr>" + "".join(f"<td>{_cell(x)}</td>" for x in row) + "</tr>")
            out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out)


def _cell(x: Any) -> str:
    """A table cell; ``[text](href)`` becomes a link (the suite table links each run's report)."""
    s = str(x)
    if s.startswith("[") and "](" in s and s.endswith(")"):
        text, href = s[1:-1].split("](", 1)
        return f"<a href='{html.escape(href)}'>{html.escape(text)}</a>"
    return html.escape(s)


def write(blocks: list[Block], out_dir: Path, title: str, figures: list[Path]) -> Report:
    md, page = out_dir / "report.md", out_dir / "report.html"
    md.write_text(_md(blocks, out_dir), encoding="utf-8")
    page.write_text(_html(blocks, title), encoding="utf-8")
    return Report(markdown=md, html=page, figures=figures)


def run_report(run_dir: Path, mtbf_hours: tuple[float, ...] = MTBF_HOURS) -> Report:
    """Write ``report.md``, ``report.html`` and the PNG figures into ``run_dir``."""
    run_dir = Path(run_dir)
    blocks, figures = run_blocks(run_dir, mtbf_hours)
    return write(blocks, run_dir, f"baft report: {run_dir.name}", figures)


def is_suite(path: Path) -> bool:
    """A directory without a verdict of its own whose subdirectories have one."""
    return not (path / "verdict.json").is_file() and any(p.is_file() for p in path.glob("*/verdict.json"))


def suite_report(suite_dir: Path, mtbf_hours: tuple[float, ...] = MTBF_HOURS) -> Report:
    """Each run's report, then the suite's: one row per scenario, linking to its report."""
    suite_dir = Path(suite_dir)
    rows, passed = [], 0
    runs = sorted(p.parent for p in suite_dir.glob("*/verdict.json"))
    if not runs:
        raise AnalysisError(f"{suite_dir}: no run directories (subdirectories with a verdict.json)")
    for d in runs:
        v = load_verdict(d)
        try:
            run_report(d, mtbf_hours)
            link = f"[{v.scenario}]({d.name}/report.html)"
        except AnalysisError:
            link = v.scenario  # a run that left no journal still gets its row
        passed += v.passed
        rows.append([link, "PASSED" if v.passed else "FAILED", _fmt(v.bitwise_equal),
                     f"{v.faults_fired}/{v.faults_declared}", _fmt(v.lost_steps),
                     _fmt(v.recovery_seconds), ", ".join(dict.fromkeys(c.code for c in v.diagnosis)) or "–",
                     "; ".join(v.failures)[:200]])
    try:  # the scenario directory's name, as `baft suite` recorded it
        name = json.loads((suite_dir / "suite.json").read_text())["suite"]
    except (OSError, ValueError, KeyError):
        name = suite_dir.name
    blocks: list[Block] = [
        ("h1", f"suite {name}: {'PASSED' if passed == len(runs) else 'FAILED'} ({passed} of {len(runs)} "
               "scenarios passed)"),
        ("table", (["scenario", "verdict", "bitwise", "faults fired", "lost steps", "recovery s", "likely cause",
                    "failures"], rows)),
    ]
    return write(blocks, suite_dir, f"baft suite report: {suite_dir.name}", [])


def report(path: Path, mtbf_hours: tuple[float, ...] = MTBF_HOURS) -> Report:
    """A run's report, or a suite's when ``path`` is a directory of runs."""
    path = Path(path)
    if not path.is_dir():
        raise AnalysisError(f"{path}: not a directory")
    return suite_report(path, mtbf_hours) if is_suite(path) else run_report(path, mtbf_hours)
