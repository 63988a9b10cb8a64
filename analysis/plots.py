"""The report's figures, drawn from journals with matplotlib (Agg: no display needed).

Each function writes one PNG and returns its path, or None when the journals hold
nothing to draw (e.g. no ``timeline`` events for a strategy other than baft).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from .journal import Journal  # noqa: E402
from .metrics import RECOVERY_PHASES, fault_target  # noqa: E402
from .verdict import Verdict  # noqa: E402

REFERENCE = "#4c72b0"
FAULTED = "#dd8452"
FAULT = "#c44e52"
RESTORE = "#55a868"
WINDOW = "#8172b3"
DPI = 110


def loss_rank(run: Journal) -> tuple[int | None, bool]:
    """The rank whose losses stand for the run (the lowest that reports one, as :func:`~analysis.losscurve.
    loss_curve` takes) and whether other ranks report their own (a script's ranks: each its batch's)."""
    ranks = {e["rank"] for e in run.events("step") if e.get("loss") is not None and "rank" in e}
    return (min(ranks) if ranks else None), len(ranks) > 1


def _steps_by_incarnation(run: Journal) -> dict[int, list[tuple[int, float, float]]]:
    """Incarnation -> [(step, loss, t)] of one rank (:func:`loss_rank`), its last execution of each step in
    the incarnation: the same rank in every run, never whichever rank's record came first."""
    rank, _ = loss_rank(run)
    out: dict[int, dict[int, tuple[int, float, float]]] = {}
    for e in run.events("step"):
        if e.get("loss") is None or e.get("rank", rank) != rank:
            continue
        out.setdefault(e["incarnation"], {})[e["step"]] = (e["step"], float(e["loss"]), e["t"])
    return {k: sorted(v.values()) for k, v in sorted(out.items())}


def _fault_marks(run: Journal) -> list[dict[str, Any]]:
    """One entry per fault occurrence: step, time, label, fatal."""
    marks = []
    for e in run.events("fault"):
        label = f"{e.get('fault')} {fault_target(e)}"
        marks.append({"step": e.get("step"), "t": e["t"], "label": label, "fatal": e.get("fatal", True),
                      "from": e.get("from_step"), "id": e.get("id")})
    return marks


def loss_figure(reference: Journal, run: Journal, verdict: Verdict, path: Path) -> Path | None:
    """Loss per step: the reference, each incarnation of the faulted run (so redone steps show),
    a red line where each fatal fault fired, a green marker where the job resumed, shaded
    spans for window faults."""
    ref = _steps_by_incarnation(reference)
    runs = _steps_by_incarnation(run)
    if not ref and not runs:
        return None
    fig, (ax, dx) = plt.subplots(2, 1, figsize=(9, 5.4), dpi=DPI, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    (ref_rank, ref_many), (run_rank, run_many) = loss_rank(reference), loss_rank(run)
    for pts in ref.values():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color=REFERENCE, lw=2.2,
                label="reference (no faults)" + (f", rank {ref_rank}" if ref_many else ""))
    # a step a restarted process resumed in the middle of: its loss covers only the micro-batches it ran (not
    # compared by the verdict), drawn apart as a hollow marker, left out of the line and of the difference
    partial = {(p.incarnation, p.step) for p in verdict.partial_steps if p.rank == run_rank}
    for i, (inc, pts) in enumerate(runs.items()):
        whole = [p for p in pts if (inc, p[0]) not in partial]
        ax.plot([p[0] for p in whole], [p[1] for p in whole], color=FAULTED, lw=1.3, ls="-" if i == 0 else "--",
                marker="o", ms=2.5, label=("faulted run" if i == 0 else f"after restart {inc}")
                + (f", rank {run_rank}" if run_many else ""))
        cut = [p for p in pts if (inc, p[0]) in partial]
        if cut:
            ax.plot([p[0] for p in cut], [p[1] for p in cut], color=FAULTED, ls="none", marker="o", ms=6,
                    mfc="none", label="step resumed mid-way (partial loss, not compared)")
        runs[inc] = whole
    seen: set[Any] = set()
    for m in _fault_marks(run):
        if m["fatal"] and m["step"] is not None:
            ax.axvline(m["step"], color=FAULT, lw=1.2, ls=":")
            ax.annotate(m["label"], (m["step"], 1), xycoords=("data", "axes fraction"), rotation=90, va="top",
                        ha="right", fontsize=7, color=FAULT)
        elif not m["fatal"] and m["id"] not in seen:
            seen.add(m["id"])
    for w in verdict.windows:
        hi = w.to_step if w.to_step is not None else max((p[0] for pts in runs.values() for p in pts), default=0)
        ax.axvspan(w.from_step, hi, color=WINDOW, alpha=0.12)
        ax.annotate(f"{w.fault} {w.target}", (w.from_step, 0.02), xycoords=("data", "axes fraction"),
                    fontsize=7, color=WINDOW)
    ref_loss = {p[0]: p[1] for pts in ref.values() for p in pts}
    for r in verdict.recoveries:
        inc_pts = [p for pts in runs.values() for p in pts if p[0] == r.restored_step]
        y = inc_pts[-1][1] if inc_pts else ref_loss.get(r.restored_step)
        if y is not None:
            ax.plot([r.restored_step], [y], marker="^", ms=9, color=RESTORE, ls="none")
            ax.annotate(f"resumed at {r.restored_step} ({r.restored_tier or 'scratch'})", (r.restored_step, y),
                        xytext=(6, 8), textcoords="offset points", fontsize=7, color=RESTORE)
    status = "PASSED" if verdict.passed else "FAILED"
    ax.set_title(f"{verdict.scenario}: loss per step ({status})", fontsize=10)
    ax.set_ylabel("training loss")
    # below: how far each step's last execution is from the reference (0 = bit for bit the same)
    last: dict[int, float] = {}
    for pts in runs.values():
        last.update({p[0]: p[1] for p in pts})
    common = sorted(set(ref_loss) & set(last))
    dx.axhline(0, color=REFERENCE, lw=1)
    dx.plot(common, [100 * (last[s_] - ref_loss[s_]) / abs(ref_loss[s_]) if ref_loss[s_] else 0.0 for s_ in common],
            color=FAULTED, lw=1.2, marker="o", ms=2)
    for m in _fault_marks(run):
        if m["fatal"] and m["step"] is not None:
            dx.axvline(m["step"], color=FAULT, lw=1.2, ls=":")
    dx.set_ylabel("run − ref (%)")
    dx.set_xlabel("step")
    dx.grid(alpha=0.3)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    # the fault labels hang from the top: the legend goes in the bottom corner the loss curve leaves free
    # (bottom left when it falls)
    ends = [p[1] for pts in ref.values() for p in (pts[0], pts[-1]) if pts]
    falling = len(ends) < 2 or ends[0] >= ends[-1]
    ax.legend(uniq.values(), uniq.keys(), fontsize=8, loc="lower left" if falling else "lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def progress_figure(reference: Journal, run: Journal, verdict: Verdict, path: Path) -> Path | None:
    """Steps completed against wall time for both runs: a fault shows as a stall, a restore as
    a drop back to the restored step, the lost work as the climb back."""
    def curve(j: Journal) -> tuple[list[float], list[int]]:
        evs = [e for e in j.events("step") if e.get("loss") is not None] or j.events("step")
        starts = j.events("start")
        t0 = starts[0]["t"] if starts else (evs[0]["t"] if evs else 0.0)
        seen: dict[tuple[int, int], float] = {}
        for e in evs:
            seen.setdefault((e["incarnation"], e["step"]), e["t"])
        pts = sorted((t - t0, step + 1) for (_, step), t in seen.items())
        return [p[0] for p in pts], [p[1] for p in pts]

    rx, ry = curve(reference)
    fx, fy = curve(run)
    if not fx:
        return None
    starts = run.events("start")
    t0 = starts[0]["t"] if starts else 0.0
    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=DPI)
    ax.step(rx, ry, where="post", color=REFERENCE, lw=2, label="reference")
    ax.step(fx, fy, where="post", color=FAULTED, lw=1.5, label="faulted run")
    for m in _fault_marks(run):
        if m["fatal"]:
            ax.axvline(m["t"] - t0, color=FAULT, lw=1.2, ls=":")
            ax.annotate(m["label"], (m["t"] - t0, 1), xycoords=("data", "axes fraction"), rotation=90, va="top",
                        ha="right", fontsize=7, color=FAULT)
    for r in verdict.recoveries:
        if r.recovery_seconds is not None:
            t_f = next((m["t"] for m in _fault_marks(run) if m["id"] == r.fault.get("id")
                        and m["step"] == r.fault.get("step")), None)
            if t_f is not None:
                ax.axvspan(t_f - t0, t_f - t0 + (r.caught_up_seconds or r.recovery_seconds), color=FAULT, alpha=0.08)
    ax.set_xlabel("seconds since the first worker started")
    ax.set_ylabel("steps completed")
    ax.set_title("progress over wall time (shaded: from the fault until the lost work was redone)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


_SPAN_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "backward_weight": "#e7a67a", "optimizer": "#7f7f7f",
                "wait": "#e8e8e8", "snapshot": "#55a868"}


def timeline_figure(run: Journal, path: Path) -> Path | None:
    """One iteration of every stage (ranks as rows): compute spans, the waits between them (the
    bubbles) and baft's snapshot copies inside the waits. The iteration drawn is the latest one
    every rank sampled before the first fault (steady state)."""
    first_fault = min((e["t"] for e in run.events("fault")), default=float("inf"))
    by_step: dict[int, dict[int, dict[str, Any]]] = {}
    for rank in sorted(run.ranks):
        for e in run.events("timeline", rank):
            if e["t"] < first_fault and e["incarnation"] == 0:
                by_step.setdefault(e["step"], {})[rank] = e
    full = [s for s, ranks in by_step.items() if len(ranks) == len(run.ranks) and s > 0]
    if not full:
        return None
    step = max(full)
    rows = by_step[step]
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.55 * len(rows)), dpi=DPI)
    for y, rank in enumerate(sorted(rows)):
        for kind, _idx, start, end in rows[rank]["spans"]:
            h, off = (0.8, 0.1) if kind != "snapshot" else (0.35, 0.325)
            ax.broken_barh([(start * 1e3, (end - start) * 1e3)], (y + off, h), facecolors=_SPAN_COLORS.get(kind, "k"),
                           edgecolor="#999999" if kind == "wait" else "none", lw=0.3, zorder=3 if kind == "snapshot" else 2)
    ax.set_yticks([y + 0.5 for y in range(len(rows))], [f"rank {r}" for r in sorted(rows)])
    ax.invert_yaxis()
    ax.set_xlabel(f"milliseconds into step {step}")
    ax.set_title("per-stage timeline of one iteration: compute, bubbles (grey) and checkpoint copies in them (green)",
                 fontsize=9)
    # the weight-gradient passes only where a zero-bubble schedule split the backward
    drawn = {kind for rank in rows for kind, *_ in rows[rank]["spans"]}
    shown = [k for k in _SPAN_COLORS if k != "backward_weight" or k in drawn]
    names = {"wait": "wait (bubble)", "backward": "backward (input grads)" if "backward_weight" in drawn else "backward",
             "backward_weight": "backward (weight grads)"}
    fig.legend([Rectangle((0, 0), 1, 1, color=_SPAN_COLORS[k]) for k in shown], [names.get(k, k) for k in shown],
               fontsize=7, ncol=len(shown), loc="lower center")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


_PHASE_COLORS = dict(zip(RECOVERY_PHASES, ("#c44e52", "#dd8452", "#ccb974", "#8172b3", "#55a868", "#4c72b0", "#64b5cd")))


def recovery_figure(verdict: Verdict, path: Path) -> Path | None:
    """Where each recovery's time went, phase by phase (stacked bars, one per fatal fault)."""
    recs = [r for r in verdict.recoveries if r.phases]
    if not recs:
        return None
    fig, ax = plt.subplots(figsize=(9, 1.8 + 0.5 * len(recs)), dpi=DPI)
    for y, r in enumerate(recs):
        left, phases = 0.0, r.phases or {}
        for phase in RECOVERY_PHASES:
            v = phases.get(phase)
            if v:
                ax.barh(y, v, left=left, color=_PHASE_COLORS[phase], label=phase)
                if v > 0.6:
                    ax.text(left + v / 2, y, f"{v:.1f}", ha="center", va="center", fontsize=7, color="white")
                left += v
    ax.set_yticks(range(len(recs)), [f"{r.fault['fault']} {fault_target(r.fault)} "
                                     + (f"in restart {r.fault['at_restore']}" if r.fault.get("at_restore") is not None
                                        else f"@ {r.fault.get('step')}")
                                     for r in recs], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the fault")
    ax.set_title("recovery time by phase", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    fig.legend(uniq.values(), uniq.keys(), fontsize=7, ncol=len(uniq), loc="lower center")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


PARAMETER_LABELS = {"nodes": "nodes", "storage_gbps": "persistent store bandwidth (Gbit/s)",
                    "mtbf_hours": "MTBF of a node (hours)"}


def projection_plots(result: dict[str, Any], out: Path) -> list[Path]:
    """One PNG per sweep of ``baft project``: each strategy's wasted share against the swept parameter."""
    paths = []
    for sw in result["sweeps"]:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        models = result.get("models") or {}
        first: dict[str, str] = {}  # model -> the first strategy drawn with it
        for strategy, waste in sw["waste"].items():
            if strategy == "none":
                continue  # restarting from scratch wastes (nearly) everything at any scale worth projecting
            model = models.get(strategy, strategy)
            alike = first.setdefault(model, strategy)  # one modelled as another is: drawn dashed over it
            ax.plot(sw["values"], [100 * w for w in waste], marker="o",
                    label=strategy + (f" (= {alike})" if alike != strategy else ""),
                    linestyle="--" if alike != strategy else "-")
        here = result["target"][sw["parameter"]]
        ax.axvline(here, color="#999999", linestyle=":", label="the target")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(PARAMETER_LABELS.get(sw["parameter"], sw["parameter"]))
        ax.set_ylabel("training time wasted (%)")
        ax.set_title(f"wasted share against {PARAMETER_LABELS.get(sw['parameter'], sw['parameter'])}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"projection-{sw['parameter']}.png"
        fig.savefig(path, dpi=DPI)
        plt.close(fig)
        paths.append(path)
    return paths
