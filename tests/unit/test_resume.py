"""Where a restarted script resumed (analysis.resume.locate): exact, torn, a component not restored, or none."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.resume import locate

COMPONENTS = ("model", "optimizer", "scheduler", "rng", "data")


def reference(steps: int) -> dict[int, dict[str, dict[str, str]]]:
    """Every component different at every step (as training makes them), plus the probe's step counter."""
    return {k: {**{c: {"x": f"{c}@{k}"} for c in COMPONENTS}, "step": {"step": str(k)}} for k in range(steps)}


@settings(max_examples=60, deadline=None)
@given(steps=st.integers(2, 30), data=st.data())
def test_a_state_equal_to_the_reference_at_k_resumed_from_k(steps: int, data: st.DataObject) -> None:
    ref = reference(steps)
    k = data.draw(st.integers(0, steps - 1))
    first = {**ref[k], "step": {"step": "0"}}  # the probe's own count restarts: never compared
    p = locate(first, ref)
    assert (p.step, p.exact) == (k, True) and p.description == f"every component equals the reference at step {k}"


@settings(max_examples=60, deadline=None)
@given(steps=st.integers(3, 30), data=st.data())
def test_components_of_two_steps_are_torn_and_a_missing_one_is_named(steps: int, data: st.DataObject) -> None:
    ref = reference(steps)
    k = data.draw(st.integers(0, steps - 1))
    j = data.draw(st.integers(0, steps - 1).filter(lambda s: s != k))
    other = data.draw(st.sampled_from(COMPONENTS[1:]))
    first = {**ref[k], other: ref[j][other]}
    p = locate(first, ref)
    if other in ("optimizer", "scheduler"):  # the training state of two steps
        assert p.step == k and not p.exact and p.description == f"torn: model equals step {k}, {other} equals step {j}"
    else:  # not restored with it: the RNG of a fresh start, the batch the epoch began with
        assert p.step == k and not p.exact and p.description == f"model equals step {k}, but {other} equals step {j}"
    lost = {**ref[k], other: {"x": "never"}}
    p = locate(lost, ref)
    assert p.step == k and p.description == f"model equals step {k}; {other} matches no step of the reference"


def test_a_model_of_no_step_matches_nothing() -> None:
    ref = reference(5)
    p = locate({**ref[2], "model": {"x": "elsewhere"}}, ref)
    assert p.step is None and p.description.startswith("matches no step of the reference (model")


def test_an_unchanging_component_does_not_hide_the_step() -> None:
    """A component that is the same at every step (no scheduler stepping, say) equals every step; the
    resume is where the rest agree."""
    ref = reference(6)
    for k in ref:
        ref[k]["scheduler"] = {"x": "constant"}
    p = locate({**ref[4]}, ref)
    assert (p.step, p.exact) == (4, True) and p.equal_at["scheduler"] == list(range(6))


def test_a_model_equal_at_several_steps_anchors_where_the_other_components_agree() -> None:
    """Frozen weights (or an fp16 step the scaler skipped) make the model equal steps 5 and 6: the resume is
    where the optimizer and the data agree (5), and only the RNG, which did move, is named."""
    ref = {s: {"model": {"w": "w5" if s in (5, 6) else f"w{s}"}, "optimizer": {"m": f"m{s}"},
               "data": {"i": f"d{s}"}, "rng": {"t": f"r{s}"}} for s in range(10)}
    first = {"model": {"w": "w5"}, "optimizer": {"m": "m5"}, "data": {"i": "d5"}, "rng": {"t": "r0"}}
    point = locate(first, ref)
    assert point.step == 5 and not point.exact
    assert point.description == "model equals step 5, but rng equals step 0"
