"""The device check's model is the size asked for (issue 37, item 5)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.bench.devicecheck import WIDTH, shape_for


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=0.005, max_value=80.0), st.sampled_from(["cuda", "cpu"]))
def test_the_state_is_the_size_asked_for(gigabytes: float, device: str) -> None:
    shape = shape_for(gigabytes, device)
    assert shape.state_bytes / 1e9 == pytest.approx(gigabytes, rel=0.25)
    assert shape.width <= WIDTH and shape.layers >= 2 and shape.wait_seconds > 0
    # the waits hold the whole copy at the rate they assume, with room to spare
    rate = 10e9 if device == "cuda" else 2e9
    assert 2 * shape.microbatches * shape.wait_seconds >= shape.state_bytes / rate


def test_two_gigabytes_on_a_gpu_is_the_issue_s_model() -> None:
    shape = shape_for(2.0, "cuda")
    assert shape.width == WIDTH and shape.state_bytes >= 1.9e9


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_size_that_is_not_one_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        shape_for(bad, "cpu")
