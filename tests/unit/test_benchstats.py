"""Paired statistics: ratios per cycle, robust to a drifting machine."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.benchstats import bootstrap_ci, paired_ratios, quantile


def iterations(cycles: int, cost: float, drift: list[float]) -> list[dict]:
    out = []
    for c in range(cycles):
        base = 0.1 * drift[c % len(drift)]
        for name, factor in (("none", 1.0), ("x", 1.0 + cost)):
            for pos in range(3):
                slow = 5.0 if pos == 0 else 1.0  # first iteration of a block is dropped
                out.append({"cycle": c, "strategy": name, "position": pos, "seconds": base * factor * slow})
    return out


@settings(max_examples=50, deadline=None)
@given(cost=st.floats(0, 0.5), drift=st.lists(st.floats(0.5, 3.0), min_size=1, max_size=6), cycles=st.integers(2, 12))
def test_machine_drift_cancels_in_pairs(cost: float, drift: list[float], cycles: int) -> None:
    r = paired_ratios(iterations(cycles, cost, drift))
    assert abs(r["x"]["ratio_vs_none"] - (1 + cost)) < 1e-9
    assert r["x"]["n"] == cycles and r["none"]["ratio_vs_none"] == 1.0


def test_warmup_blocks_are_ignored() -> None:
    its = iterations(4, 0.1, [1.0]) + [{"cycle": -1, "strategy": "x", "position": 1, "seconds": 99.0}]
    assert abs(paired_ratios(its)["x"]["ratio_vs_none"] - 1.1) < 1e-9


def test_quantiles_and_ci() -> None:
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert quantile(xs, 0.5) == 3.0 and quantile(xs, 0.25) == 2.0
    lo, hi = bootstrap_ci(xs)
    assert 1.0 <= lo <= 3.0 <= hi <= 5.0
