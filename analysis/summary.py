"""The verdict on a terminal: the lines ``baft run`` prints (also for a run on a cluster and for a
failed scenario under pytest), and the table of a suite's verdicts."""
from __future__ import annotations

from pathlib import Path

from .diagnosis import Cause
from .losscurve import LossVerdict
from .metrics import fault_target
from .verdict import ChaosFiring, NotRun, Verdict


def count(n: int, noun: str) -> str:
    """``1 step``, ``2 steps``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def format_summary(verdict: Verdict, out: Path) -> str:
    """A few lines for the terminal about the verdict written into run directory ``out``."""
    cluster = [] if verdict.cluster is None else [_firing(f) for f in verdict.cluster.firings]
    if not verdict.compared:
        head = [f"{verdict.scenario}: {'PASSED' if verdict.passed else 'FAILED'} (on the cluster; {verdict.note})"]
        tail = [f"  FAIL: {f}" for f in verdict.failures] + [f"  verdict          {out / 'verdict.json'}"]
        return "\n".join(head + cluster + tail)
    lines = _judgement(verdict, out)
    if verdict.cluster is not None:
        lines += ["  on the cluster:"] + ["  " + line for line in cluster]
    return "\n".join(lines)


def _judgement(v: Verdict, out: Path) -> list[str]:
    lines = [f"{v.scenario}: {'PASSED' if v.passed else 'FAILED'}"]
    bw = "yes" if v.bitwise_equal else "NO"
    lines.append(f"  bitwise equal    {bw} ({v.states_compared} state and {v.losses_compared} loss records compared)")
    if v.reproducibility is not None:
        lines.append(f"  reproducible     {'yes' if v.reproducibility.equal else 'NO'}: {v.reproducibility.statement}")
    ws = v.world_size
    if ws is not None and ws.changed:
        lines.append(f"  world size       {ws.path} ranks ({v.resized_records} records "
                     f"after {ws.first_change} judged by the loss curve)")
    if v.loss_curve is not None:
        lines += _loss_lines(v.loss_curve)
    d = v.first_divergence
    if d is not None:
        rel = d.relative_norm_change
        size = ("" if rel is None else f", norm {d.reference_norm:.6g} -> {d.found_norm:.6g} ({rel:.2e} relative)"
                if rel else ", norms equal (a change below what a norm resolves)")
        lines.append(f"  first divergence step {d.step}, {d.component} / {d.key} (rank {d.rank}){size}")
    lines.append(f"  faults fired     {v.faults_fired}/{v.faults_declared} ({count(v.fault_occurrences, 'occurrence')})")
    lines += _recovery_lines(v)
    for w in v.windows:
        lines.append(f"  {w.fault} {w.target}: active from step {w.from_step}"
                     + (f" to step {w.to_step}" if w.to_step is not None else " to the end") + f" ({w.effect})")
    t = v.wall_seconds
    if t is not None and t.reference is None:  # a run on a cluster: the reference is a journal the user gave
        lines.append(f"  wall time        {t.faulted:.1f} s following the job on the cluster")
    elif t is not None:
        lines.append(f"  wall time        reference {t.reference:.1f} s{' (cached)' if t.reference_cached else ''}, "
                     f"faulted {t.faulted:.1f} s")
    lines += _change_lines(v)
    for pr in v.preemptions:
        lines.append(f"  preemption       {pr.describe()}")
    for h in v.teardown_hangs:
        lines.append(f"  teardown hang    {h.describe()}")
    if v.caught is not None:
        want = " / ".join(x for x in (v.caught.expected.component, v.caught.expected.failure,
                                      v.caught.expected.cause) if x)
        lines.append(f"  planted bug      {'CAUGHT' if v.caught.caught else 'NOT CAUGHT'} (expected: {want})")
        lines += [f"    evidence: {f}" for f in v.caught.evidence]
    lines += diagnosis_lines(v.diagnosis)
    if v.latent:
        lines.append("  latent finding   an RNG differs after the resume, but nothing drew from it that training used: "
                     "model, optimizer, data and every loss bit for bit to the end (passes; expect: {rng: strict} "
                     "fails it)")
        lines += diagnosis_lines(v.latent, label="latent cause")
    lines += [f"  FAIL: {f}" for f in v.failures]
    lines.append(f"  verdict          {out / 'verdict.json'}")
    if (out / "report.html").is_file():
        lines.append(f"  report           {out / 'report.html'} (and report.md, plots *.png)")
    return lines


def _loss_lines(lc: LossVerdict) -> list[str]:
    """The loss curve's judgement: within tolerance or not, its worst window, the equivalence test."""
    lines: list[str] = []
    worst = lc.worst_window
    where = (f"worst steps {worst.steps[0]}-{worst.steps[1]}: {worst.deviation:.3g} off, tolerance "
             f"{worst.tolerance:.3g}" if worst else "identical to the reference")
    lines.append(f"  loss curve       {'within tolerance' if not lc.failures else 'OUT OF TOLERANCE'} "
                 f"({lc.steps_compared} steps from step {lc.from_step}, window {lc.window}; {where})")
    eq = lc.equivalence
    if eq is not None:
        lines.append(f"  loss equivalence {'shown' if eq.equivalent else 'NOT shown'}: mean relative difference "
                     f"{eq.mean_relative_difference:+.3%}, {100 * (1 - 2 * eq.alpha):.0f}% interval "
                     f"[{eq.interval[0]:+.3%}, {eq.interval[1]:+.3%}] within ±{eq.margin:.2%}")
    return lines


def _recovery_lines(v: Verdict) -> list[str]:
    """A line per recovery (where the script resumed below it), and the steps resumed mid-way."""
    lines: list[str] = []
    for r in v.recoveries:
        f = r.fault
        rec = f"{r.recovery_seconds:.2f} s" if r.recovery_seconds is not None else "never"
        phase = "" if f.get("phase") in (None, "iteration") else f" ({f['phase']})"
        detect = f", hang detected after {r.detection_seconds:.1f} s" if r.detection_seconds is not None else ""
        if r.furthest_before is not None and r.furthest_before > r.progress_before:
            detect = (f" (from step {r.progress_before}, which every rank had completed; one rank had reached "
                      f"{r.furthest_before})") + detect
        elif f.get("fault") == "preempt" and isinstance(f.get("step"), int) and r.progress_before > f["step"]:
            detect = f" (from step {r.progress_before}, which every rank had completed in the grace)" + detect
        when = (f"in restart {f['at_restore']}'s restore" if f.get("at_restore") is not None
                else f"at step {f['step']}")
        lines.append(
            f"  {f['fault']} {fault_target(f)} {when}{phase}: restored step {r.restored_step}"
            f" ({r.restored_tier or 'no checkpoint'}), lost {count(r.lost_steps, 'step')}{detect}, recovered in {rec}"
        )
        if r.resume:
            lines.append(f"    {r.resume}")
        if r.restaged:
            lines.append(f"    restaged {r.restaged}")
    partial: dict[tuple[int, int], list[int]] = {}
    for p in v.partial_steps:
        partial.setdefault((p.incarnation, p.step), []).append(p.rank)
    for (inc, step), ranks in sorted(partial.items()):
        p = next(q for q in v.partial_steps if (q.incarnation, q.step) == (inc, step))
        lines.append(f"    restart {inc}: {p.describe()} on rank{'s' if len(ranks) > 1 else ''} "
                     f"{', '.join(map(str, sorted(ranks)))}: its loss is partial, not compared; the state after it is")
    return lines


def _change_lines(v: Verdict) -> list[str]:
    """The persist interval's changes (the first and the last, the others counted), the snapshot plans whose
    windows could not hold the state, replication stopped or resumed, checkpoints refused or failed."""
    lines: list[str] = []
    changes = v.interval_changes
    for i, c in enumerate(changes):
        if len(changes) > 3 and 0 < i < len(changes) - 1:
            if i == 1:
                lines.append(f"    ({len(changes) - 2} more changes: every " + " -> ".join(str(x.every) for x in changes[1:-1])
                             + " steps; all in verdict.json)")
            continue
        lines.append(f"  persist interval step {c.step}: every {c.before} -> {c.every} steps ({c.why})")
    for i, po in enumerate(v.plan_overflows):
        if i == 3:
            lines.append(f"    ({len(v.plan_overflows) - 3} more plans the windows could not hold; all in verdict.json)")
            break
        lines.append(f"  snapshot plan    {po.describe()}")
    for rc in v.replication_changes:
        at = f"at step {rc.step}" if rc.step is not None else "before the first step"
        lines.append(f"  replication {rc.node} {'stopped' if rc.stopped else 'resumed'} {at}: {rc.reason}")
    for label, issues in (("rejected", v.checkpoints_rejected), ("write failed", v.checkpoints_failed)):
        for issue in issues:
            lines.append(f"  checkpoint {label}: step {issue.step} ({issue.tier}): {issue.reason}")
    return lines


def diagnosis_lines(causes: list[Cause], evidence: int = 3, label: str = "likely cause") -> list[str]:
    """The likely causes, each with up to ``evidence`` lines of evidence and its usual fix."""
    lines = []
    for c in causes:
        at = f" (restart {c.incarnation})" if c.incarnation else ""
        lines.append(f"  {label:<16} {c.describe()}{at}")
        lines += [f"    evidence: {e}" for e in c.evidence[:evidence]]
        if len(c.evidence) > evidence:
            lines.append(f"    ({len(c.evidence) - evidence} more in verdict.json)")
        if c.fix:
            lines.append(f"    usual fix: {c.fix}")
    return lines


def _firing(f: ChaosFiring) -> str:
    """One firing of a fault on a cluster, on one line."""
    what = f"faults[{f.id}] {f.fault}" + (f" #{f.occurrence}" if f.occurrence else "")
    due = f"step {f.due_step}" if f.due_step is not None else "its time"
    if f.status != "injected":
        return f"  {what}: {f.status.upper()} (due {due}, job at step {f.step}): {f.why}"
    rec = f", recovered {f.recover_seconds:.1f} s after delete" if f.recover_seconds is not None else ""
    return (f"  {what}: due {due}, fired at step {f.step}, injected by step {f.injected_step} "
            f"({f.inject_seconds:.1f} s), deleted at step {f.deleted_step}{rec}")


def format_table(results: list[Verdict | NotRun]) -> str:
    """The verdicts of a suite as a table for the terminal, a row per scenario."""
    rows = [("scenario", "verdict", "bitwise", "lost", "recovery s", "likely cause", "why")]
    for r in results:
        if isinstance(r, NotRun):
            rows.append((r.scenario, "ERROR", "-", "-", "-", "-", r.error[:60]))
            continue
        rec = r.recovery_seconds
        rows.append((r.scenario, "PASSED" if r.passed else "FAILED", "yes" if r.bitwise_equal else "NO",
                     str(r.lost_steps), f"{rec:.1f}" if rec is not None else "-",
                     ", ".join(dict.fromkeys(c.code for c in r.diagnosis)) or "-", "; ".join(r.failures)[:60]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)
