"""How often to checkpoint: Young's and Daly's optimum interval from a measured cost and an MTBF.

With a checkpoint that blocks training for ``cost`` seconds and failures
arriving at a mean interval ``mtbf``, checkpointing every ``tau`` seconds of
work wastes, per unit of time (first-order model):

    cost / (tau + cost)                 writing checkpoints
  + (restart + (tau + cost) / 2) / mtbf  per failure: the restart, and on average half an
                                         interval of work redone

Young (1974) minimises it at ``tau = sqrt(2 * cost * mtbf)``; Daly (2006) refines
it to ``sqrt(2 cost M) * (1 + sqrt(cost / 2M) / 3 + (cost / 2M) / 9) - cost`` for
``cost < 2M`` (else ``tau = M``). The interval is then rounded to whole
iterations, at least one. A checkpoint that costs nothing on the training
thread (BAFT's, copied inside the bubbles) is best taken every iteration: the
advice says so rather than dividing by zero.
"""
from __future__ import annotations

import math
from typing import Any

from .journal import Journal


def waste(tau: float, cost: float, mtbf: float, restart: float = 0.0) -> float:
    """Expected fraction of time wasted when checkpointing every ``tau`` seconds of work."""
    return min(1.0, cost / (tau + cost) + (restart + (tau + cost) / 2) / mtbf)


def young(cost: float, mtbf: float) -> float:
    return math.sqrt(2 * cost * mtbf)


def daly(cost: float, mtbf: float) -> float:
    if cost >= 2 * mtbf:
        return mtbf
    r = cost / (2 * mtbf)
    return math.sqrt(2 * cost * mtbf) * (1 + math.sqrt(r) / 3 + r / 9) - cost


def advise(cost: float, mtbf: float, iteration: float, restart: float = 0.0, current_every: int | None = None) -> dict[str, Any]:
    """The recommended interval (seconds and whole iterations) and the waste it implies; with
    ``current_every`` also the waste of checkpointing every that many iterations."""
    if mtbf <= 0 or iteration <= 0 or cost < 0 or restart < 0:
        raise ValueError("advise: mtbf and iteration must be > 0, cost and restart >= 0")
    t_young, t_daly = (young(cost, mtbf), daly(cost, mtbf)) if cost > 0 else (0.0, 0.0)
    steps = max(1, round(t_daly / iteration))
    out: dict[str, Any] = {
        "cost_seconds": cost, "mtbf_seconds": mtbf, "iteration_seconds": iteration, "restart_seconds": restart,
        "young_seconds": t_young, "daly_seconds": t_daly, "every_steps": steps,
        "waste": waste(steps * iteration, cost, mtbf, restart),
    }
    if current_every is not None:
        out["current_every"] = current_every
        out["current_waste"] = waste(current_every * iteration, cost, mtbf, restart)
    return out


def measured_cost(run: Journal) -> tuple[float | None, str]:
    """Seconds one checkpoint blocks the training thread, from the journal, and how it was found.

    ``baft``: the snapshot's stall (copy work that did not fit in the bubbles) plus any wait
    for the previous persist, per snapshot. Other strategies: the mean ``seconds`` of their
    persistent saves — the blocking time for ``sync``; for the asynchronous ones an upper
    bound (the write overlaps training).
    """
    snaps = run.events("snapshot")
    if snaps:
        stall = sum(e.get("stall_seconds", 0.0) for e in snaps)
        stall += sum(e.get("seconds", 0.0) for e in run.events("persist_backpressure"))
        return stall / len(snaps), "baft snapshot stall per snapshot"
    saved = {e["step"]: e["seconds"] for e in run.events("checkpoint_saved") if e.get("tier") == "persistent"}
    if saved:
        return sum(saved.values()) / len(saved), "mean persistent save time"
    return None, "no checkpoint in the journal"
