"""baft.persist.interval: Daly's interval in whole iterations, and the persistent interval adapting to the measured
cost (``checkpoint.mtbf_hours``): agreed by every rank (the largest cost any measured), journaled when it
changes, within its bounds."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baft import CheckpointConfig, events
from baft.errors import BaftConfigError
from baft.persist.interval import AdaptiveInterval, daly, every_for

from analysis import advisor
from tests.gloo_ranks import run_ranks

costs = st.floats(1e-4, 100.0)
mtbfs = st.floats(60.0, 1e7)
iterations = st.floats(1e-3, 10.0)


@settings(max_examples=200, deadline=None)
@given(costs, costs, mtbfs, iterations, st.integers(1, 50), st.integers(0, 500))
def test_the_interval_is_dalys_in_whole_iterations_within_its_bounds_and_grows_with_the_cost(
        c1: float, c2: float, mtbf: float, it: float, lo: int, span: int) -> None:
    hi = lo + span
    a, b = sorted((c1, c2))
    ea, eb = every_for(a, mtbf, it, lo, hi), every_for(b, mtbf, it, lo, hi)
    assert lo <= ea <= eb <= hi  # a dearer checkpoint is never taken more often
    unbounded = every_for(a, mtbf, it)
    assert unbounded == max(1, round(daly(a, mtbf) / it))
    # the job adapts to what `baft advise` would advise for the same cost (the two floors' formulas agree)
    assert daly(a, mtbf) == advisor.daly(a, mtbf) and unbounded == advisor.advise(a, mtbf, it)["every_steps"]
    waste = advisor.waste
    # the interval it picks wastes no more than half or twice it (first-order model, away from the bounds)
    if 2 <= unbounded and 2 * unbounded * it < mtbf:
        best = waste(unbounded * it, a, mtbf)
        assert best <= waste(unbounded * it / 2, a, mtbf) + 1e-12 and best <= waste(2 * unbounded * it, a, mtbf) + 1e-12


def test_a_free_checkpoint_is_taken_every_iteration() -> None:
    assert every_for(0.0, 3600.0, 0.1, 1, 100) == 1
    assert every_for(0.0, 3600.0, 0.1, 4, 100) == 4


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_single_process_interval_follows_the_cost_and_says_why() -> None:
    seen: list[dict] = []
    unsubscribe = events.subscribe(lambda kind, f: seen.append(f) if kind == "interval_changed" else None)
    clock = Clock()
    try:
        cfg = CheckpointConfig(every=2, mtbf_hours=1.0, every_min=1, every_max=50)
        interval = AdaptiveInterval(cfg, clock=clock)
        due = []
        for step in range(1, 1500):
            clock.t += 0.1  # 100 ms iterations
            if interval.due(step):
                due.append(step)
                interval.charge(0.05 if step < 100 else 0.0)  # a persist costs 50 ms, from step 100 nothing
            assert interval.due(step) == (due[-1:] == [step])  # asked again: the same answer
        # step 2: the first persist, nothing measured; step 4: the first one measured, a process's first
        # persists start what later ones reuse: not counted; step 6: 50 ms per persist, Daly ~19 s = 190
        # iterations, bounded to 50
        assert due[:4] == [2, 4, 6, 56]
        assert (seen[0]["step"], seen[0]["before"], seen[0]["every"], seen[0]["bounded"]) == (6, 2, 50, True)
        assert seen[0]["cost_seconds"] == pytest.approx(0.05) and seen[0]["iteration_seconds"] == pytest.approx(0.1)
        assert "MTBF of 1 h" in seen[0]["why"] and "bounded to [1, 50]" in seen[0]["why"]
        # from step 100 a persist costs nothing: the smoothed cost decays, the interval shortens step by step,
        # each time to Daly's for the cost it was decided for, by more than the hysteresis or to a bound,
        # down to every iteration
        later = seen[1:]
        assert later and all(a["every"] > b["every"] for a, b in zip(later, later[1:]))
        for e in seen:
            assert e["every"] == every_for(e["cost_seconds"], 3600.0, 0.1, 1, 50)
            assert e["bounded"] or abs(e["every"] - e["before"]) > 0.25 * e["before"]
        assert later[-1]["every"] == 1 and due[-3:] == [1497, 1498, 1499]
        assert all(b - a == e for a, b, e in zip(due, due[1:], [2, 2] + [50] * 100) if b <= seen[1]["step"])
    finally:
        unsubscribe()


def test_without_an_mtbf_the_interval_stays_fixed() -> None:
    interval = AdaptiveInterval(CheckpointConfig(every=3))
    for step in range(1, 30):
        interval.charge(10.0)
        assert interval.due(step) == (step % 3 == 0)


@pytest.mark.parametrize("bad", [
    {"mtbf_hours": 0}, {"mtbf_hours": -1.0}, {"mtbf_hours": "1h"}, {"mtbf_hours": float("inf")},
    {"every_min": 0}, {"every_max": 2, "every_min": 3}, {"mtbf_hours": 1.0, "every": 20, "every_max": 10},
])
def test_bad_interval_settings_are_refused_by_key(bad: dict) -> None:
    with pytest.raises(BaftConfigError) as e:
        CheckpointConfig(**bad)
    assert e.value.field in bad


RANK = """
import json, os, sys, time
import torch, torch.distributed as dist
from baft import CheckpointConfig, TrainState, events
from baft.persist import commits as persist
from baft.strategies import SyncStrategy

dist.init_process_group("gloo")
rank = dist.get_rank()
out = sys.argv[1]
seen, saved = [], []
events.subscribe(lambda kind, f: seen.append(f) if kind == "interval_changed" else
                 saved.append(f["step"]) if kind == "checkpoint_saved" else None)
if rank == 1:  # this rank's storage is slow: each write takes 200 ms more
    write_shard = persist.write_shard
    persist.write_shard = lambda *a, **k: (time.sleep(0.2), write_shard(*a, **k))[1]
model = torch.nn.Linear(4, 4)
state = TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
cfg = CheckpointConfig(strategy="sync", every=1, mtbf_hours=1.0, every_min=1, every_max=8,
                       dir=os.path.join(out, "ckpt"))
strategy = SyncStrategy(cfg, state)
for _ in range(40):
    time.sleep(0.01)
    state.step += 1
    strategy.after_step()
strategy.close()
with open(os.path.join(out, f"result-{rank}.json"), "w") as f:
    json.dump({"seen": seen, "saved": saved}, f)
dist.destroy_process_group()
"""


def test_the_ranks_agree_on_the_interval_of_the_slowest(tmp_path: Path) -> None:
    """Rank 1's writes are slow: both ranks adapt to its cost at the same step and persist the same steps
    (deciding alone, rank 0 would have kept its own interval and the ranks' collective saves would part)."""
    results = run_ranks(RANK, str(tmp_path))
    assert all(code == 0 for code, _ in results), [out[-3000:] for _, out in results]
    r = [json.loads((tmp_path / f"result-{rank}.json").read_text()) for rank in range(2)]
    assert r[0]["saved"] == r[1]["saved"]
    assert r[0]["seen"] == r[1]["seen"] and r[0]["seen"], r
    first = r[0]["seen"][0]
    # step 1: nothing measured; step 2: the first persist measured, not counted (it starts what later ones reuse)
    assert first["step"] == 3 and first["before"] == 1 and first["every"] == 8  # Daly: ~38 s, bounded to 8
    assert first["cost_seconds"] >= 0.2  # rank 1's, not rank 0's milliseconds
    saved = r[0]["saved"]
    assert saved[:3] == [1, 2, 3] and all(b - a == 8 for a, b in zip(saved[2:], saved[3:]))
