"""Paired statistics for the checkpoint-overhead benchmark.

Strategies run in short blocks that alternate inside one job (a shuffled
order per cycle). For each cycle, a strategy's cost is the median iteration
time of its block over the median of the ``none`` block of the same cycle, so
slow drifts of the machine cancel out; across cycles the benchmark reports the
median of these paired ratios, its interquartile range and a bootstrap 95%
interval of the median. Single-run ratios here swing by ±10-15%; paired
medians over a few dozen cycles resolve about 1%.

A block's cost is either its median iteration (``stat="median"``, the first
dropped: a per-iteration cost such as a snapshot) or its mean with everything
(``stat="mean"``: every iteration and the drain at the block's end, recorded at
position -1; a cost that comes every k iterations, such as a persist, which a
median would hide).
"""
from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from typing import Any


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def bootstrap_ci(xs: list[float], stat: Callable[[list[float]], float] = statistics.median, level: float = 0.95,
                 block: int = 1, rounds: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat``; with ``block > 1`` a circular block bootstrap
    (runs of ``block`` neighbours resampled together, for serially correlated series)."""
    if len(xs) < 2:
        return (xs[0], xs[0]) if xs else (float("nan"), float("nan"))
    rng = random.Random(seed)
    n, block = len(xs), max(1, min(block, len(xs)))
    stats = []
    for _ in range(rounds):
        sample: list[float] = []
        while len(sample) < n:
            start = rng.randrange(n)
            sample.extend(xs[(start + i) % n] for i in range(block))
        stats.append(stat(sample[:n]))
    stats.sort()
    tail = (1 - level) / 2
    return stats[int(tail * rounds)], stats[int((1 - tail) * rounds) - 1]


def block_costs(iterations: list[dict[str, Any]], stat: str = "median", skip_first: int = 1) -> dict[int, dict[str, float]]:
    """Per cycle, per strategy: the seconds per iteration of its block, as ``stat`` says (see the module)."""
    if stat not in ("median", "mean"):
        raise ValueError(f"stat: expected median or mean, found {stat!r}")
    blocks: dict[tuple[int, str], list[float]] = {}
    counted: dict[tuple[int, str], int] = {}
    for it in iterations:
        key = (it["cycle"], it["strategy"])
        if it["cycle"] < 0:
            continue
        if stat == "median":
            if it["position"] >= skip_first:
                blocks.setdefault(key, []).append(it["seconds"])
            continue
        blocks.setdefault(key, []).append(it["seconds"])  # the drain (position -1) included
        counted[key] = counted.get(key, 0) + (it["position"] >= 0)
    out: dict[int, dict[str, float]] = {}
    for key, times in blocks.items():
        if stat == "mean" and not counted.get(key):
            continue
        out.setdefault(key[0], {})[key[1]] = statistics.median(times) if stat == "median" else sum(times) / counted[key]
    return out


def paired_ratios(iterations: list[dict[str, Any]], baseline: str = "none", stat: str = "median",
                  only: set[str] | None = None) -> dict[str, dict[str, Any]]:
    """For each strategy (those in ``only`` and the baseline, if given): median paired ratio to
    ``baseline``, IQR, bootstrap CI, n, median ms per iteration (of block costs as ``stat`` says)."""
    if only is not None:
        iterations = [it for it in iterations if it["strategy"] in only or it["strategy"] == baseline]
    per_cycle = block_costs(iterations, stat)
    strategies = sorted({s for c in per_cycle.values() for s in c})
    out: dict[str, dict[str, Any]] = {}
    for strat in strategies:
        ratios = [c[strat] / c[baseline] for c in per_cycle.values() if strat in c and baseline in c and c[baseline] > 0]
        times = [c[strat] for c in per_cycle.values() if strat in c]
        if not ratios:
            continue
        lo, hi = bootstrap_ci(ratios)
        out[strat] = {
            "ratio_vs_none": statistics.median(ratios),
            "iqr": [quantile(ratios, 0.25), quantile(ratios, 0.75)],
            "ci95": [lo, hi],
            "n": len(ratios),
            "median_iteration_ms": statistics.median(times) * 1e3,
        }
    return out
