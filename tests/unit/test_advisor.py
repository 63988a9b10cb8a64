"""The checkpoint-interval advisor (Young/Daly) and the recovery-phase breakdown."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from analysis.advisor import advise, daly, waste, young
from analysis.journal import Journal, JournalWriter, float_bits, rank_journal
from analysis.metrics import RECOVERY_PHASES, recoveries


@settings(max_examples=200, deadline=None)
@given(cost=st.floats(1e-3, 600), mtbf=st.floats(600, 1e6), factor=st.floats(0.2, 5.0))
def test_daly_interval_is_no_worse_than_any_other(cost: float, mtbf: float, factor: float) -> None:
    assume(cost <= mtbf / 100)  # the regime the first-order model and both formulas are made for
    best = daly(cost, mtbf)
    assert best > 0 and young(cost, mtbf) > 0
    # the first-order model's exact optimum is sqrt(2 C M) - C; Daly's is within a hair of it
    assert waste(best, cost, mtbf) <= waste(best * factor, cost, mtbf) + 1e-3 * waste(best, cost, mtbf)


def test_young_is_the_square_root_law() -> None:
    assert young(2.0, 3600) == pytest.approx(math.sqrt(2 * 2.0 * 3600))
    assert daly(5000, 1000) == 1000  # a checkpoint dearer than twice the MTBF: once per MTBF


@settings(max_examples=100, deadline=None)
@given(cost=st.floats(0, 30), mtbf_h=st.floats(0.1, 100), iteration=st.floats(0.01, 10), every=st.integers(1, 1000))
def test_advice_is_whole_iterations_and_beats_the_current_interval(cost: float, mtbf_h: float, iteration: float, every: int) -> None:
    a = advise(cost, mtbf_h * 3600, iteration, restart=10.0, current_every=every)
    assert a["every_steps"] >= 1 and 0 <= a["waste"] <= 1
    if cost == 0:
        assert a["every_steps"] == 1  # free checkpoints: every iteration
    # rounding to whole iterations costs little against the continuous optimum
    assert a["waste"] <= a["current_waste"] + iteration / (mtbf_h * 3600) + 1e-9


def test_bad_advice_inputs() -> None:
    with pytest.raises(ValueError):
        advise(1.0, 0, 1.0)


def test_recovery_phases_add_up_to_the_catch_up(tmp_path: Path) -> None:
    """A kill at t=110 after 10 steps; the new workers exist at 113, begin the rendezvous at 114.5,
    have the group at 115, restore step 8 at 115.5, finish step 8 at 116 and step 9 (caught up) at 117."""
    for r in range(2):
        w = JournalWriter(rank_journal(tmp_path, r), rank=r, attempt=0)
        lines = [("start", 99.0, {"world_size": 2, "created": 98.0, "init_seconds": 0.5})]
        lines += [("step", 100.0 + s, {"step": s}) for s in range(10)]
        if r == 0:
            lines.append(("fault", 110.0, {"fault": "kill", "id": 0, "step": 10, "rank": 0}))
        lines.append(("start", 115.0 - 0.1 * r, {"world_size": 2, "created": 113.0 - r, "init_seconds": 0.5 + 0.1 * r}))
        lines.append(("checkpoint_restored", 115.5, {"step": 8, "tier": "shm", "seconds": 0.4}))
        lines += [("step", 116.0, {"step": 8}), ("step", 117.0, {"step": 9}), ("step", 118.0, {"step": 10})]
        for kind, t, fields in lines:
            rec = {"t": t, "event": kind, "rank": r, "attempt": 0, **fields}
            if kind == "step":
                rec.update(loss=1.0, loss_bits=float_bits(1.0), seconds=1.0)
            w._f.write(__import__("json").dumps(rec) + "\n")
        w.close()
    (rec,) = recoveries(Journal.load(tmp_path))
    ph = rec.phases
    assert set(ph) == set(RECOVERY_PHASES) and ph["detection"] is None
    assert ph["restart"] == pytest.approx(3.0) and ph["startup"] == pytest.approx(1.5)
    assert ph["rendezvous"] == pytest.approx(0.5) and ph["restore"] == pytest.approx(0.5)
    assert ph["first_step"] == pytest.approx(0.5) and ph["catch_up"] == pytest.approx(1.0)
    assert sum(v for v in ph.values() if v) == pytest.approx(rec.caught_up_seconds) == pytest.approx(7.0)
    assert rec.lost_steps == 2 and rec.recovery_seconds == pytest.approx(6.0)
