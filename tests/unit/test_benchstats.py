"""Paired statistics: ratios per cycle, robust to a drifting machine."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.benchstats import block_costs, bootstrap_ci, paired_ratios, quantile


def iterations(cycles: int, cost: float, drift: list[float]) -> list[dict]:
    return paired(cycles, [1.0 + cost], drift)


def paired(cycles: int, ratios: list[float], drift: list[float]) -> list[dict]:
    """Blocks of ``none`` and ``x`` per cycle: ``x`` costs ``ratios[c]`` times ``none`` in cycle ``c``,
    and the whole machine runs ``drift[c]`` times slower."""
    out = []
    for c in range(cycles):
        base = 0.1 * drift[c % len(drift)]
        for name, factor in (("none", 1.0), ("x", ratios[c % len(ratios)])):
            for pos in range(3):
                slow = 5.0 if pos == 0 else 1.0  # first iteration of a block is dropped
                out.append({"cycle": c, "strategy": name, "position": pos, "seconds": base * factor * slow})
    return out


@settings(max_examples=50, deadline=None)
@given(cost=st.floats(0, 0.5), drift=st.lists(st.floats(0.5, 3.0), min_size=1, max_size=6), cycles=st.integers(2, 12))
def test_machine_drift_cancels_in_pairs(cost: float, drift: list[float], cycles: int) -> None:
    r = paired_ratios(iterations(cycles, cost, drift))
    assert abs(r["x"]["ratio_vs_none"] - (1 + cost)) < 1e-9
    assert r["x"]["n"] == r["none"]["n"] == cycles
    # The baseline's own time is the median of its blocks' medians (the first iteration dropped).
    bases = sorted(0.1 * drift[c % len(drift)] for c in range(cycles))
    median = (bases[(cycles - 1) // 2] + bases[cycles // 2]) / 2
    assert r["none"]["median_iteration_ms"] == pytest.approx(median * 1e3)
    assert r["x"]["median_iteration_ms"] == pytest.approx(r["none"]["median_iteration_ms"] * (1 + cost), rel=1e-6)


def test_known_paired_ratios_give_their_median_iqr_and_interval() -> None:
    """Per-cycle ratios 1.1..1.9 under a machine that drifts 4x: the statistics are those of the ratios."""
    ratios = [1.1, 1.3, 1.2, 1.9, 1.4]  # a mean would say 1.38
    r = paired_ratios(paired(5, ratios, [1.0, 4.0, 0.5, 2.0, 3.0]))["x"]
    assert r["n"] == 5 and r["ratio_vs_none"] == pytest.approx(1.3)
    assert r["iqr"] == pytest.approx([1.2, 1.4])
    lo, hi = r["ci95"]
    assert 1.1 - 1e-9 <= lo < 1.3 < hi <= 1.9 + 1e-9


def test_a_cycle_without_its_baseline_block_is_not_paired() -> None:
    its = [it for it in paired(4, [2.0, 3.0, 2.0, 2.0], [1.0]) if not (it["cycle"] == 1 and it["strategy"] == "none")]
    r = paired_ratios(its)["x"]
    assert r["n"] == 3 and r["ratio_vs_none"] == pytest.approx(2.0)  # cycle 1's 3.0 had nothing to pair with


def test_warmup_blocks_are_ignored() -> None:
    its = iterations(4, 0.1, [1.0]) + [{"cycle": -1, "strategy": "x", "position": 1, "seconds": 99.0}]
    assert abs(paired_ratios(its)["x"]["ratio_vs_none"] - 1.1) < 1e-9
    assert -1 not in block_costs(its) and -1 not in block_costs(its, "mean")


def test_quantiles_interpolate() -> None:
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert quantile(xs, 0.5) == 3.0 and quantile(xs, 0.25) == 2.0 and quantile(xs, 0.0) == 1.0 and quantile(xs, 1.0) == 5.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5 and quantile([0.0, 10.0], 0.3) == pytest.approx(3.0)


def test_bootstrap_interval_contains_the_true_median_of_a_synthetic_input() -> None:
    """Ratios scattered (lognormal, 5%) around a true 1.05: the interval holds 1.05 and is about as
    narrow as 100 samples allow (~±1%), not the samples' whole range."""
    true, rng = 1.05, random.Random(7)
    xs = [true * rng.lognormvariate(0, 0.05) for _ in range(100)]
    lo, hi = bootstrap_ci(xs, rounds=1000)
    assert lo < true < hi and hi - lo < 0.04
    assert min(xs) < lo and hi < max(xs)
    lo50, hi50 = bootstrap_ci(xs, level=0.5, rounds=1000)
    assert lo < lo50 < hi50 < hi  # a lower level, a narrower interval inside it


def test_bootstrap_intervals_cover_the_true_median_at_about_their_level() -> None:
    """40 synthetic inputs of 15 ratios each: the 95% interval misses the true median a few times
    at most; the 50% interval misses it about half the time."""
    true = 1.05
    rngs = [random.Random(k) for k in range(40)]
    inputs = [[true * rng.lognormvariate(0, 0.05) for _ in range(15)] for rng in rngs]

    def coverage(level: float) -> int:
        return sum(lo <= true <= hi for lo, hi in (bootstrap_ci(xs, level=level, rounds=400, seed=k)
                                                   for k, xs in enumerate(inputs)))

    assert coverage(0.95) >= 34
    assert 10 <= coverage(0.5) <= 30


def test_bootstrap_of_too_few_values() -> None:
    assert bootstrap_ci([2.0]) == (2.0, 2.0)
    lo, hi = bootstrap_ci([])
    assert lo != lo and hi != hi  # nan: nothing to say


@settings(max_examples=50, deadline=None)
@given(block=st.integers(2, 12), spike=st.floats(0.0, 2.0), drain=st.floats(0.0, 1.0),
       drift=st.lists(st.floats(0.5, 3.0), min_size=1, max_size=5), cycles=st.integers(1, 8))
def test_the_mean_counts_a_persist_and_its_drain_that_the_median_hides(block: int, spike: float, drain: float,
                                                                       drift: list[float], cycles: int) -> None:
    """A persist every ``block`` iterations (one slow iteration) and a drain at the block's end: the
    persistent tier's statistic is the block's whole time over its iterations; the median sees neither."""
    its = []
    for c in range(cycles):
        base = 0.1 * drift[c % len(drift)]
        for name in ("none", "x"):
            for pos in range(block):
                extra = spike * base if name == "x" and pos == 1 % block else 0.0
                its.append({"cycle": c, "strategy": name, "position": pos, "seconds": base + extra})
            its.append({"cycle": c, "strategy": name, "position": -1, "seconds": drain * base if name == "x" else 0.0})
    mean = paired_ratios(its, stat="mean")["x"]
    assert mean["ratio_vs_none"] == pytest.approx(1 + (spike + drain) / block) and mean["n"] == cycles
    if block > 3:  # a median over the block (first dropped; 3 or more left) hides the one slow iteration
        assert paired_ratios(its)["x"]["ratio_vs_none"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="stat"):
        block_costs(its, "max")


def test_only_restricts_the_arms_and_keeps_the_baseline() -> None:
    its = iterations(3, 0.2, [1.0]) + [dict(it, strategy="y") for it in iterations(3, 0.2, [1.0]) if it["strategy"] == "x"]
    assert set(paired_ratios(its, only={"y"})) == {"none", "y"}


def test_replica_staleness_counts_the_versions_between_replicas_and_those_sealed_in_flight() -> None:
    from harness.bench.replstats import staleness

    def rep(t: float, rank: int, version: int, behind: int) -> dict:
        return {"t": t, "rank": rank, "peer": "node1", "version": version, "behind": behind}

    sent = [rep(1.0, 0, 4, 1), rep(1.1, 1, 4, 2), rep(2.0, 0, 8, 3), rep(2.2, 1, 8, 1), rep(3.0, 0, 16, 0)]
    s = staleness(sent, [{"stride": 4}, {"stride": 8}])
    assert s["behind_versions_median"] == 1 and s["behind_versions_max"] == 3
    assert s["gap_versions_median"] == 4  # rank 0: 4, 8; rank 1: 4; rank 0 again: 8
    assert s["staleness_versions_max"] == 8  # rank 0's copy of 8 was 8 + 0 old when 16 landed ... 4 + 3 before
    assert s["stride_max"] == 8
    assert staleness(sent, [], block=8)["gap_versions_median"] == 4  # gaps of 8 span other arms' blocks
    assert staleness([{k: v for k, v in e.items() if k != "behind"} for e in sent], []) == {}  # older journals


def test_the_bench_reports_when_and_why_replication_stopped(tmp_path) -> None:
    import json

    from harness.bench.bench import table
    from harness.bench.replstats import replication_stats

    (tmp_path / "journal").mkdir()
    why = "a round of replicas takes 31.0 versions (median of the last 3), the persistent tier saves every 10"
    events = [{"t": 1.0, "event": "replicated", "rank": 0, "peer": "node1", "version": 4, "bytes": 10**6,
               "seconds": 2.0, "deferred_seconds": 0.01, "behind": 20},
              {"t": 2.0, "event": "replication_degraded", "reason": why},
              {"t": 9.0, "event": "store_stop", "cpu_seconds": 0.5, "max_rss_mbytes": 90.0}]
    (tmp_path / "journal" / "store-node0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    rep = replication_stats(tmp_path)
    assert (rep["degraded"], rep["resumed"], rep["degraded_reason"]) == (1, 0, why)
    lines = table({"tiers": {}, "restore": {}, "replication": rep}).splitlines()
    assert any(line.startswith("replication stopped 1 time(s), resumed 0: a round of replicas") for line in lines)


def test_the_bench_says_each_stores_class_and_group_as_the_stores_journaled_them(tmp_path) -> None:
    import json

    from harness.bench.replstats import replication_stats

    (tmp_path / "journal").mkdir()
    for node, extra in ((0, {"cpu_group": "autogroup nice 19"}), (1, {})):
        events = [{"t": 0.5, "event": "store_start", "node": f"node{node}", "cpu_class": "SCHED_IDLE", "io_class": "idle",
                   **extra}]
        (tmp_path / "journal" / f"store-node{node}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert replication_stats(tmp_path)["store_priority"] == ["SCHED_IDLE/idle", "SCHED_IDLE/idle, autogroup nice 19"]


def test_the_bench_says_how_the_adaptive_stores_group_moved_and_how_many_replicas_went_while_it_was_low(tmp_path) -> None:
    import json

    from harness.bench.bench import table
    from harness.bench.replstats import replication_stats

    (tmp_path / "journal").mkdir()
    sent = {"event": "replicated", "node": "node0", "rank": 0, "peer": "node1", "version": 1, "bytes": 10**6,
            "seconds": 0.01, "deferred_seconds": 0.0, "behind": 0}
    events = [{"t": 0.5, "event": "store_start", "node": "node0", "cpu_class": "SCHED_IDLE", "io_class": "idle",
               "cpu_group": "autogroup adaptive"},
              {**sent, "t": 1.0}, {"t": 1.5, "event": "store_group", "node": "node0", "nice": 19, "reason": "calm"},
              {**sent, "t": 2.0}, {**sent, "t": 3.0},
              {"t": 3.5, "event": "store_group", "node": "node0", "nice": 0, "reason": "late"}, {**sent, "t": 4.0},
              {"t": 4.5, "event": "store_group", "node": "node0", "nice": None, "reason": "refused"}, {**sent, "t": 5.0}]
    (tmp_path / "journal" / "store-node0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    rep = replication_stats(tmp_path)
    assert (rep["group_lowered"], rep["group_raised"], rep["group_lowered_share"]) == (1, 1, 2 / 5)
    assert "age_versions_median" not in rep  # journals from before the stores wrote it
    lines = table({"tiers": {}, "restore": {}, "replication": rep}).splitlines()
    assert "stores' group (adaptive): lowered to nice 19 1 time(s), raised back 1; 40% of replicas sent while lowered" in lines


def test_the_bench_says_how_long_replicas_took_from_seal_to_landing(tmp_path) -> None:
    import json

    from harness.bench.bench import table
    from harness.bench.replstats import replication_stats

    (tmp_path / "journal").mkdir()
    events = [{"t": float(v), "event": "replicated", "node": "node0", "rank": 0, "peer": "node1", "version": v,
               "bytes": 10**6, "seconds": 0.01, "deferred_seconds": 0.0, "behind": 0, "age_versions": age}
              for v, age in enumerate([0.1, 0.3, 0.2, 0.9, None])]
    (tmp_path / "journal" / "store-node0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    rep = replication_stats(tmp_path)
    assert (rep["age_versions_median"], rep["age_versions_max"]) == (0.25, 0.9)
    line = next(x for x in table({"tiers": {}, "restore": {}, "replication": rep}).splitlines() if x.startswith("staleness"))
    assert line.endswith("from seal to landing 0.25 versions (median; at most 0.90)")


def test_the_replicating_baft_arm_is_paired_with_the_floor_of_its_work() -> None:
    """baft@k (the arm on the stores) over floor:sync@k+replicate per cycle, under a drifting machine: the
    statistics of those ratios, not of either arm against none; no such pair, nothing said."""
    from harness.bench.bench import BenchConfig, floor_gap, floor_with_sync, table
    from harness.worker.spec import WorkloadConfig

    cfg = BenchConfig(workload=WorkloadConfig(nodes=2), strategies=["sync", "baft"], persist_every=[10, 1])
    over = [1.02, 1.06, 1.04, 1.10, 1.05]  # baft@10 over the floor arm, cycle by cycle
    its = []
    for c, r in enumerate(over):
        base = 0.05 * (1 + c)  # the machine drifts 5x over the run
        for name, factor in (("none", 1.0), ("floor:sync@10+replicate", 1.05), ("baft@10", 1.05 * r), ("baft@1", 1.5),
                             ("floor:work@10", 1.05 * r / 1.01)):
            its += [{"cycle": c, "strategy": name, "position": p, "seconds": base * factor} for p in range(10)]
            its.append({"cycle": c, "strategy": name, "position": -1, "seconds": 0.0})
    gap = floor_gap(cfg, its, of_work=False)
    assert list(gap) == ["baft@10"]  # baft@1 does not replicate: nothing to set beside the floor arm
    g = gap["baft@10"]
    assert g["floor_arm"] == floor_with_sync(10) and g["n"] == 5
    assert g["ratio"] == pytest.approx(1.05) and g["iqr"] == pytest.approx([1.04, 1.06])
    assert 1.02 - 1e-9 <= g["ci95"][0] <= 1.05 <= g["ci95"][1] <= 1.10 + 1e-9
    work = floor_gap(cfg, its)  # the honest floor (issue 55): baft's own work and a plain replicator of its slots
    assert work["baft@10"]["floor_arm"] == "floor:work@10" and work["baft@10"]["ratio"] == pytest.approx(1.01)
    lines = table({"tiers": {}, "restore": {}, "floor_gap": work, "floor_gap_sync": gap}).splitlines()
    assert lines[0].startswith("baft@10 against the floor of its work (floor:work@10: baft with replication off and a "
                               "plain replicator of its slots, paired per cycle): 1.0100")
    assert lines[1].startswith("baft@10 against the older floor (floor:sync@10+replicate, paired per cycle): 1.0500")
    # without sync, no older floor; the floor of the work needs baft alone
    assert floor_gap(BenchConfig(workload=WorkloadConfig(nodes=2), strategies=["baft"], persist_every=[10]), its,
                     of_work=False) == {}
    assert floor_gap(BenchConfig(workload=WorkloadConfig(nodes=1), strategies=["sync", "baft"], persist_every=[10]), its) == {}
