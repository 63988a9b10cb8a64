"""Fault-schedule generation for ``baft fuzz``: every schedule it generates is a valid scenario."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.campaign.fuzz import (
    _describe,
    _phase,
    in_firing_order,
    phase_steps,
    policies,
    schedules,
    with_layout,
    with_schedule,
)
from harness.campaign.layouts import LAYOUTS
from harness.scenario import parse

ROOT = Path(__file__).resolve().parents[2]
BASES = [yaml.safe_load((ROOT / p).read_text()) for p in
         ("scenarios/smoke/kill-rank.yaml", "scenarios/ci/baft-node-loss.yaml", "scenarios/ci/replica-group-two-faults.yaml")]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), which=st.integers(0, len(BASES) - 1))
def test_every_generated_schedule_is_a_valid_scenario(data: st.DataObject, which: int) -> None:
    base = BASES[which]
    schedule = data.draw(schedules(base, max_faults=3))
    assert 1 <= len(schedule) <= 3
    s = parse(with_schedule(base, schedule, "t"), "t.yaml")
    assert len(s.faults) == len(schedule) and s.run.max_restarts >= len(schedule) + 1
    w = s.workload
    for f in s.faults:
        assert 1 <= f.config.at_step <= w.steps - 2
        if f.kind == "node_loss":
            assert w.nodes > 1 and 0 <= f.config.node < w.nodes
        else:
            assert 0 <= f.config.rank < w.world_size
    assert _describe(schedule).count(" at step ") == len(schedule)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), layout=st.sampled_from(sorted(LAYOUTS)))
def test_each_layout_draws_faults_on_all_its_ranks_and_valid_policies(data: st.DataObject, layout: str) -> None:
    base = with_layout(yaml.safe_load((ROOT / "scenarios/ci/baft-kill-during-snapshot.yaml").read_text()), layout)
    policy = data.draw(policies(base))
    schedule = data.draw(schedules({**base, "checkpoint": policy}, max_faults=2))
    s = parse(with_schedule(base, schedule, "t", policy), "t.yaml")
    w = s.workload
    world = LAYOUTS[layout]["stages"] * LAYOUTS[layout]["dp_shard"] * LAYOUTS[layout]["tp"]
    world *= LAYOUTS[layout]["data_parallel"]
    assert w.world_size == world and w.nodes == 2 and (w.dp_shard, w.tp, w.layout) == (
        LAYOUTS[layout]["dp_shard"], LAYOUTS[layout]["tp"], LAYOUTS[layout]["layout"])
    assert 1 <= s.checkpoint.every <= 8 and 1 <= s.checkpoint.baft.replicate_every <= 6
    assert all(0 <= f.config.rank < world for f in s.faults if f.kind != "node_loss")


def test_sharded_ranks_are_drawn_too() -> None:
    """A PP2 x FSDP2 job has four ranks; the schedules reach ranks 2 and 3 (they once stopped at
    stages x data_parallel = 2)."""
    from hypothesis import find

    base = with_layout(yaml.safe_load((ROOT / "scenarios/ci/baft-kill-during-snapshot.yaml").read_text()), "pp-fsdp")
    found = find(schedules(base, max_faults=1), lambda sch: next(iter(sch[0].values())).get("rank") == 3,
                 settings=settings(max_examples=500, database=None))
    assert next(iter(found[0].values()))["rank"] == 3


def test_a_script_workload_draws_over_its_nproc_times_nodes_ranks() -> None:
    from hypothesis import find

    base = {"name": "s", "workload": {"script": "train.py", "nproc": 4, "steps": 10},
            "checkpoint": {"strategy": "sync", "every": 2}, "expect": {"bitwise": True}}
    found = find(schedules(base, max_faults=1), lambda sch: next(iter(sch[0].values())).get("rank") == 3,
                 settings=settings(max_examples=500, database=None))
    assert next(iter(found[0].values()))["rank"] == 3


@settings(max_examples=80, deadline=None)
@given(data=st.data(), layout=st.sampled_from(sorted(LAYOUTS)))
def test_checkpoint_phase_faults_are_drawn_at_versions_the_policy_writes(data: st.DataObject, layout: str) -> None:
    """A persist fault lands on a multiple of the drawn ``every``, a replicate fault on a multiple of the
    drawn ``replicate_every`` and only where there is a peer to replicate to; each is a valid scenario."""
    base = with_layout(yaml.safe_load((ROOT / "scenarios/ci/baft-kill-during-snapshot.yaml").read_text()), layout)
    policy = data.draw(policies(base))
    drawn = {**base, "checkpoint": policy}
    schedule = data.draw(schedules(drawn, max_faults=3))
    s = parse(with_schedule(base, schedule, "t", policy), "t.yaml")
    for f in s.faults:
        if f.config.phase == "persist":
            assert f.config.at_step % policy["every"] == 0
        if f.config.phase == "replicate":
            assert s.workload.nodes > 1 and f.config.at_step % policy["baft"]["replicate_every"] == 0


def test_every_phase_baft_announces_is_drawn() -> None:
    from hypothesis import find

    base = with_layout(yaml.safe_load((ROOT / "scenarios/ci/baft-kill-during-snapshot.yaml").read_text()), "stage-major-dp")
    steps = phase_steps(base)
    assert {"iteration", "forward", "backward", "optimizer", "snapshot", "persist", "replicate"} == set(steps)
    assert "restore" not in steps  # its version is known only after a fault
    every = base["checkpoint"].get("every", 1)
    assert steps["persist"] == [s for s in steps["iteration"] if s % every == 0]
    for phase in ("persist", "replicate", "snapshot"):
        found = find(schedules(base, max_faults=1), lambda sch, p=phase: _phase(sch[0]) == p,
                     settings=settings(max_examples=500, database=None))
        assert _phase(found[0]) == phase
    # one node: nothing to replicate to
    assert "replicate" not in phase_steps({**base, "workload": {**base["workload"], "nodes": 1}})


def test_a_zero_bubble_schedule_draws_its_weight_passes_too() -> None:
    base = yaml.safe_load((ROOT / "scenarios/ci/baft-zbv.yaml").read_text())
    assert "backward_weight" in phase_steps(base)
    one_f_one_b = {**base, "workload": {**base["workload"], "schedule": "1f1b", "virtual_stages": 1}}
    assert "backward_weight" not in phase_steps(one_f_one_b)  # no split backward: the phase never comes


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_fault_during_a_restore_is_drawn_on_request_within_the_restarts_before_it(data: st.DataObject) -> None:
    base = yaml.safe_load((ROOT / "scenarios/ci/baft-node-loss.yaml").read_text())
    schedule = data.draw(schedules(base, max_faults=3, during_restore=True))
    during = [f["kill"] for f in schedule if "at_restore" in f.get("kill", {})]
    others = [f for f in schedule if "at_restore" not in next(iter(f.values()))]
    sure = in_firing_order(others)  # the faults that restart the job, in the order they fire
    assert len(during) == (1 if sure else 0) and len(schedule) <= 3, schedule
    for f in during:
        # restart N follows the N-th fault to fire; a pull or a load only where that fault was a node loss (a
        # restart after a plain kill restores from its own memory)
        assert 1 <= f["at_restore"] <= len(sure), schedule
        cause = sure[f["at_restore"] - 1]
        if f["phase"] not in ("restore", "restore_locate"):  # and only a rank of the lost node pulls
            per_node = 4 // base["workload"].get("nodes", 1)
            assert "node_loss" in cause and f["rank"] // per_node == cause["node_loss"]["node"], schedule
    parse(with_schedule(base, schedule, "t"), "fuzz")  # a valid scenario, its restarts counted


def test_the_faults_sure_to_restart_are_ordered_as_they_fire() -> None:
    """Issue 54's rerun: restart 1 followed the node loss at step 8, not the crash drawn first at step 10."""
    faults = [{"crash": {"rank": 0, "at_step": 10, "phase": "backward"}},
              {"node_loss": {"node": 0, "at_step": 8, "phase": "backward"}},
              {"kill": {"rank": 1, "at_step": 8, "phase": "iteration"}},
              {"kill": {"rank": 1, "at_step": 2, "phase": "persist"}}]  # asynchronous: its version may be skipped
    assert in_firing_order(faults) == [faults[2], faults[1], faults[0]]


def test_a_pull_during_a_restore_is_drawn_only_after_a_node_loss() -> None:
    """Issue 54: ``--during-restore`` drew ``restore_pull`` after plain kills (7 of 12 trials never fired)."""
    from hypothesis import find

    base = yaml.safe_load((ROOT / "scenarios/ci/baft-node-loss.yaml").read_text())
    pulled = find(schedules(base, during_restore=True),
                  lambda s: any(f.get("kill", {}).get("phase") == "restore_pull" for f in s),
                  settings=settings(max_examples=500, database=None))
    assert any("node_loss" in f for f in pulled), pulled


def test_restore_faults_are_found_only_when_asked_for() -> None:
    from hypothesis import find

    base = yaml.safe_load((ROOT / "scenarios/ci/baft-node-loss.yaml").read_text())
    found = find(schedules(base, during_restore=True), lambda s: any("at_restore" in f.get("kill", {}) for f in s),
                 settings=settings(max_examples=300, database=None))
    assert found[-1]["kill"]["at_restore"] == 1
    from hypothesis.errors import NoSuchExample

    with pytest.raises(NoSuchExample):
        find(schedules(base), lambda s: any("at_restore" in f.get("kill", {}) for f in s),
             settings=settings(max_examples=100, database=None))


def test_the_fuzz_config_offers_every_layout_and_checks_its_fields() -> None:
    from typing import get_args

    import pytest

    from harness.campaign.fuzz import FuzzConfig, Layout
    from harness.campaign.layouts import LAYOUTS
    from harness.errors import ConfigValueError

    assert set(get_args(Layout)) == set(LAYOUTS)
    assert FuzzConfig(budget=4).limit == 12 and FuzzConfig(budget=4, shrink_budget=0).limit == 4
    for bad in ({"budget": 0}, {"max_faults": True}, {"shrink_budget": -1}, {"layout": "pp-zz"}):
        with pytest.raises(ConfigValueError):
            FuzzConfig(**bad)  # type: ignore[arg-type]
