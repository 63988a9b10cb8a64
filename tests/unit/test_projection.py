"""``baft project``: the analytical waste of each strategy agrees with a seeded simulation of the same rules;
the plans follow the target (bandwidths, placement); the command writes its table, JSON and plots."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from analysis.errors import ConfigFieldError
from analysis.projection import STRATEGIES, Target, expected_waste, plan, simulate
from harness.bench.project import TOLERANCE, with_placement
from harness.cli import main as cli_main


@settings(max_examples=25, deadline=None)
@given(nodes=st.integers(4, 512), stages=st.sampled_from([2, 4, 8]), gb=st.floats(1, 400),
       mtbf=st.floats(200, 20000), storage=st.floats(2, 200), scales=st.booleans(), network=st.floats(10, 400),
       iteration=st.floats(0.5, 30), replicas=st.integers(1, 3), lost=st.integers(1, 3),
       placement=st.sampled_from(["ring", "group"]), seed=st.integers(0, 1000),
       domain=st.one_of(st.none(), st.tuples(st.integers(2, 16), st.floats(500, 50000),
                                             st.sampled_from(["aligned", "interleaved", "random"]))))
@example(nodes=424, stages=4, gb=337.0, mtbf=4406.0, storage=2.0, scales=False, network=10.0, iteration=1.0,
         replicas=2, lost=2, placement="ring", seed=981, domain=(11, 2998.0, "aligned"))  # 16% off with 600
def test_the_model_and_its_simulation_agree_where_failures_are_rare_within_an_interval(
        nodes, stages, gb, mtbf, storage, scales, network, iteration, replicas, lost, placement, seed, domain) -> None:
    racks = {} if domain is None else dict(zip(("domain_nodes", "domain_mtbf_hours", "domain_layout"), domain))
    t = with_placement(Target(nodes=nodes, stages=stages, state_gb_per_stage=gb, mtbf_hours=mtbf, storage_gbps=storage,
                              storage_scales=scales, network_gbps=network, iteration_seconds=iteration,
                              replicas=min(replicas, nodes - 1), simultaneous=min(lost, nodes), placement=placement,
                              **racks))
    for s in list(STRATEGIES)[1:]:
        p = plan(s, t)
        longest = max(x.interval + x.lag for x in (p.memory, p.persistent) if x is not None)
        if t.failure_rate * longest > 0.2:
            continue  # the first-order model's premise does not hold: it says so in its assumptions
        # about 4000 failures: with 600, a target whose failures mostly fall to a long persistent interval (racks
        # lost whole) scattered its simulated waste by 8% (one sd over 20 seeds), and 12% was two sds away
        hours = 4000 / (t.failure_rate * 3600)
        analytic, sim = expected_waste(p, t, hours), simulate(p, t, hours, seed)
        assert abs(analytic - sim.waste) <= TOLERANCE * analytic + 0.002, (s, analytic, sim)
        if p.memory is not None:  # the share of failures served from memory is the placement's
            assert abs(sim.from_memory / sim.failures - p.memory_share) < 0.1
        assert abs(sim.domain_failures / sim.failures - t.domain_share) < 0.1


def test_racks_that_fail_whole_add_failures_and_aligned_ones_send_them_to_the_persistent_tier() -> None:
    base = Target(nodes=128)
    racks = {lay: with_placement(Target(nodes=128, domain_nodes=8, domain_mtbf_hours=2000, domain_layout=lay))
             for lay in ("aligned", "interleaved", "random")}
    t = racks["aligned"]
    assert t.domains == 16 and t.failure_rate == pytest.approx(base.failure_rate + 16 / (2000 * 3600))
    assert t.domain_share == pytest.approx((16 / 2000) / (128 / 5000 + 16 / 2000))
    assert t.domain_memory_probability == 0 and racks["interleaved"].domain_memory_probability == 1
    assert 0 < racks["random"].domain_memory_probability < 1
    aligned, interleaved = plan("baft", t), plan("baft", racks["interleaved"])
    assert aligned.memory_share == pytest.approx(1 - t.domain_share) and interleaved.memory_share == 1
    waste = {lay: expected_waste(plan("baft", r), r, 720) for lay, r in racks.items()}
    assert waste["interleaved"] < waste["random"] < waste["aligned"]
    # Strategies without peer memory do not care where the racks lie.
    assert expected_waste(plan("checkfreq", t), t, 720) == expected_waste(plan("checkfreq", racks["interleaved"]),
                                                                          racks["interleaved"], 720)
    sim = simulate(aligned, t, 600 / (t.failure_rate * 3600), seed=3)
    assert abs(sim.from_memory / sim.failures - aligned.memory_share) < 0.06  # rack losses never recover from memory


def test_a_store_that_grows_with_the_cluster_keeps_persisting_cheap_and_sync_pays_for_a_fixed_one() -> None:
    fixed, scaling = Target(nodes=128), Target(nodes=128, storage_gbps=20.0, storage_scales=True)
    assert fixed.persist_seconds == pytest.approx(128 * scaling.persist_seconds)
    assert expected_waste(plan("sync", fixed), fixed, 720) > 5 * expected_waste(plan("sync", scaling), scaling, 720)
    # Background persistence: the interval can be no shorter than a persist
    assert plan("checkfreq", fixed).persistent.interval >= fixed.persist_seconds


def test_baft_stalls_only_for_what_the_bubbles_cannot_hold() -> None:
    t = Target(nodes=16, gpus_per_node=1, stages=2, state_gb_per_stage=200, copy_gbps=10, iteration_seconds=10,
               microbatches=8)  # 12.5 GB per GPU: 1.25 s of copy, 1.1 s of bubbles
    assert plan("baft", t).memory.stall == pytest.approx(t.copy_seconds - t.bubble_fraction * t.iteration_seconds)
    assert plan("baft", Target(nodes=16)).memory.stall == 0


def test_losing_a_whole_group_sends_recovery_to_the_persistent_tier() -> None:
    t = with_placement(Target(nodes=8, replicas=1, simultaneous=2, placement="group"))
    assert 0 < t.memory_probability < 1  # two nodes of one group of two take both copies
    assert with_placement(Target(nodes=8, replicas=3, simultaneous=2, placement="group")).memory_probability == 1


@pytest.mark.parametrize(("field", "value"), [("nodes", 0), ("mtbf_hours", -1.0), ("placement", "star"),
                                              ("replicas", 8), ("domain_nodes", 0), ("domain_mtbf_hours", 0.0),
                                              ("domain_layout", "striped")])
def test_a_bad_target_names_its_field(field: str, value) -> None:
    with pytest.raises(ConfigFieldError) as e:
        Target(nodes=8, **{field: value}) if field != "nodes" else Target(nodes=value)
    assert e.value.field == field


def test_the_command_prints_the_table_and_writes_the_json_and_plots(tmp_path: Path, capsys) -> None:
    rc = cli_main(["project", "--out", str(tmp_path), "--nodes", "64", "--storage-gbps", "40", "--run-hours", "200"])
    out = capsys.readouterr().out
    assert rc == 0 and "baft" in out and "persist every" in out
    result = json.loads((tmp_path / "projection.json").read_text())
    assert result["target"]["nodes"] == 64 and {r["strategy"] for r in result["strategies"]} == set(STRATEGIES)
    assert result["assumptions"] and all((tmp_path / f"projection-{p}.png").stat().st_size > 10_000
                                         for p in ("nodes", "storage_gbps", "mtbf_hours"))
    waste = {r["strategy"]: r["waste"] for r in result["strategies"]}
    assert waste["baft"] <= waste["in-memory"] <= waste["checkfreq"] < waste["sync"] < waste["none"]
    assert cli_main(["project", "--out", str(tmp_path), "--nodes", "0"]) == 2
    assert "--nodes: expected an integer >= 1, found 0" in capsys.readouterr().err
    assert cli_main(["project", "--out", str(tmp_path), "--nodes", "64", "--storage-gbps", "40", "--run-hours", "200",
                     "--domain-mtbf-hours", "1000", "--domain-nodes", "4"]) == 0
    out = capsys.readouterr().out
    assert "failure domains of 4 nodes (aligned), MTBF 1000 h" in out and "probability 0.0000" in out
    racked = {r["strategy"]: r for r in json.loads((tmp_path / "projection.json").read_text())["strategies"]}
    assert racked["baft"]["waste"] > waste["baft"] and racked["baft"]["memory_share"] < 1
    assert racked["baft"]["simulated"]["domain_failures"] > 0
