"""Fault-schedule generation for ``baft fuzz``: every schedule it generates is a valid scenario."""
from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.campaign.fuzz import _describe, schedules, with_schedule
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
