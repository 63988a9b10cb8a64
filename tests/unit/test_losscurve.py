"""Loss-curve verdicts: tolerance bands, the equivalence test, and elastic runs judged by them."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.benchstats import bootstrap_ci
from analysis.errors import ConfigFieldError
from analysis.journal import Journal, JournalWriter, float_bits, rank_journal
from analysis.losscurve import LossExpect, compare_curves, loss_curve
from analysis.verdict import ExpectConfig, WorldSize, judge


def curve(n: int = 40) -> dict[int, float]:
    return {s: 3.0 * math.exp(-s / 15) + 1.0 for s in range(n)}


def test_identical_curves_pass_with_nothing_to_judge() -> None:
    v = compare_curves(curve(), curve(), LossExpect())
    assert v.passed and v.from_step is None and v.steps_compared == 0


@settings(max_examples=60, deadline=None)
@given(rel=st.floats(1e-4, 0.2), rtol=st.floats(1e-4, 0.2), window=st.integers(1, 10))
def test_a_constant_relative_offset_passes_exactly_when_inside_rtol(rel: float, rtol: float, window: int) -> None:
    ref = curve()
    run = {s: v * (1 + rel) if s >= 10 else v for s, v in ref.items()}
    v = compare_curves(ref, run, LossExpect(rtol=rtol, window=window))
    assert v.from_step == 10 and v.steps_compared == 30
    if abs(rel - rtol) > 1e-9:
        assert v.passed == (rel < rtol), v.worst_window


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), noise=st.floats(1e-4, 0.05), window=st.integers(1, 8))
def test_windows_average_out_noise(seed: int, noise: float, window: int) -> None:
    import random

    rng = random.Random(seed)
    ref = curve(60)
    run = {s: v * (1 + rng.uniform(-noise, noise)) for s, v in ref.items()}
    step_by_step = compare_curves(ref, run, LossExpect(rtol=noise, window=1))
    windowed = compare_curves(ref, run, LossExpect(rtol=noise, window=window))
    assert step_by_step.passed  # every point is within noise by construction
    assert windowed.worst_window is not None and step_by_step.worst_window is not None
    assert windowed.worst_window.score <= step_by_step.worst_window.score + 1e-9


@pytest.mark.parametrize("shift, margin, equivalent", [(0.001, 0.01, True), (0.03, 0.01, False), (-0.03, 0.01, False)])
def test_equivalence_needs_the_interval_inside_the_margin(shift: float, margin: float, equivalent: bool) -> None:
    import random

    rng = random.Random(1)
    ref = curve(60)
    run = {s: v * (1 + shift + rng.uniform(-0.002, 0.002)) for s, v in ref.items()}
    v = compare_curves(ref, run, LossExpect(rtol=1.0, window=5, margin=margin))
    eq = v.equivalence
    assert eq is not None and eq.equivalent is equivalent and v.passed is equivalent
    assert eq.interval[0] <= eq.mean_relative_difference <= eq.interval[1]


def test_missing_steps_fail() -> None:
    ref = curve()
    run = {s: v for s, v in ref.items() if s != 33}
    run[3] = ref[3] * 1.0001
    v = compare_curves(ref, run, LossExpect(rtol=0.1))
    assert not v.passed and v.missing_steps == [33]


@pytest.mark.parametrize("field, value", [("rtol", -1.0), ("window", 0), ("margin", 0.0), ("alpha", 0.5), ("from_step", -2)])
def test_bad_expectations_name_their_field(field: str, value: float) -> None:
    with pytest.raises(ConfigFieldError) as e:
        LossExpect(**{field: value})
    assert e.value.field == field


def test_block_bootstrap_interval_contains_the_mean() -> None:
    xs = [math.sin(i / 3) for i in range(50)]
    lo, hi = bootstrap_ci(xs, stat=lambda v: sum(v) / len(v), level=0.9, block=5)
    assert lo <= sum(xs) / len(xs) <= hi and hi - lo > 0


def write_elastic(root: Path, world: int, steps: int, *, lost_at: int | None = None, restore: int = 0,
                  offset: float = 0.0) -> Journal:
    """A run of ``world`` ranks; with ``lost_at`` the upper half stops there and the lower half
    restarts on half the world, its losses off by ``offset`` (relative)."""
    for r in range(world):
        w = JournalWriter(rank_journal(root, r), rank=r, attempt=0)
        w.write("start", node="node0", world_size=world)
        stop = steps if lost_at is None else lost_at
        for s in range(stop):
            loss = 2.0 / (s + 1) + 1.0
            w.write("step", step=s, loss=loss, loss_bits=float_bits(loss))
            w.write("state", step=s + 1, digests={"model": {"w": f"w{s + 1}"}})
        if lost_at is not None and r < world // 2:
            if r == 0:
                w.write("fault", fault="node_loss", id=0, node=1, step=lost_at, phase="iteration")
            w.write("start", node="node0", world_size=world // 2)
            w.write("checkpoint_restored", step=restore, tier="shm", seconds=0.1)
            for s in range(restore, steps):
                loss = (2.0 / (s + 1) + 1.0) * (1 + offset)
                w.write("step", step=s, loss=loss, loss_bits=float_bits(loss))
                w.write("state", step=s + 1, digests={"model": {"w": f"v{s + 1}"}})
        if lost_at is None or r < world // 2:
            w.write("finish", step=steps)
        w.close()
    return Journal.load(root)


@pytest.mark.parametrize("offset, passed", [(0.001, True), (0.05, False)])
def test_an_elastic_run_is_bitwise_before_the_resize_and_judged_by_its_loss_after(
        tmp_path: Path, offset: float, passed: bool) -> None:
    ref = write_elastic(tmp_path / "ref", 4, 20)
    run = write_elastic(tmp_path / "run", 4, 20, lost_at=12, restore=11, offset=offset)
    expect = ExpectConfig(max_lost_steps=1, loss=LossExpect(rtol=0.01, window=3))
    v = judge(ref, run, expect, steps=20, faults_declared=1)
    assert v.world_size == WorldSize(reference=4, final=2, sizes=[4, 2]) and v.completed
    assert v.bitwise_equal and v.resized_records == 2 * 2 * 9  # ranks 0,1: steps 11..19, state + step
    assert v.recoveries[0].lost_steps == 1 and v.recoveries[0].recovery_seconds is not None
    assert v.passed is passed and v.loss_curve is not None and v.loss_curve.from_step == 11
    assert loss_curve(run)[15] == pytest.approx((2.0 / 16 + 1.0) * (1 + offset))


def test_a_resized_run_without_a_loss_expectation_fails(tmp_path: Path) -> None:
    ref = write_elastic(tmp_path / "ref", 4, 10)
    run = write_elastic(tmp_path / "run", 4, 10, lost_at=6, restore=5)
    v = judge(ref, run, ExpectConfig(), steps=10, faults_declared=1)
    assert not v.passed and any("needs expect.loss" in f for f in v.failures)
