"""Paired statistics for the checkpoint-overhead benchmark.

Strategies run in short blocks that alternate inside one job (a shuffled
order per cycle). For each cycle, a strategy's cost is the median iteration
time of its block over the median of the ``none`` block of the same cycle, so
slow drifts of the machine cancel out; across cycles the benchmark reports the
median of these paired ratios, its interquartile range and a bootstrap 95%
interval of the median. Single-run ratios here swing by ±10-15%; paired
medians over a few dozen cycles resolve about 1%.
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


def block_medians(iterations: list[dict[str, Any]], skip_first: int = 1) -> dict[int, dict[str, float]]:
    """Per cycle, per strategy: the median iteration time of its block (first ``skip_first`` dropped)."""
    blocks: dict[tuple[int, str], list[float]] = {}
    for it in iterations:
        if it["cycle"] < 0 or it["position"] < skip_first:
            continue
        blocks.setdefault((it["cycle"], it["strategy"]), []).append(it["seconds"])
    out: dict[int, dict[str, float]] = {}
    for (cycle, strat), times in blocks.items():
        out.setdefault(cycle, {})[strat] = statistics.median(times)
    return out


def paired_ratios(iterations: list[dict[str, Any]], baseline: str = "none") -> dict[str, dict[str, Any]]:
    """For each strategy: median paired ratio to ``baseline``, IQR, bootstrap CI, n, median ms."""
    per_cycle = block_medians(iterations)
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
