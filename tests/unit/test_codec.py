"""The pickle-free codec round-trips every kind of leaf a state tree holds, fingerprint for fingerprint."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from baft.state.codec import decode, encode
from baft.state.fingerprint import digest_components

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=5))
tensors = st.builds(
    lambda shape, dtype, seed: (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 100).to(dtype),
    st.lists(st.integers(0, 4), max_size=3), st.sampled_from([torch.float32, torch.float64, torch.int64, torch.uint8, torch.bfloat16]),
    st.integers(0, 1000),
)
numpy_leaves = st.one_of(
    st.builds(lambda v, t: np.dtype(t).type(v), st.integers(0, 100), st.sampled_from(["int64", "int32", "uint8", "float32",
                                                                                        "float64", "bool"])),
    st.builds(lambda shape, t, seed: (np.random.default_rng(seed).standard_normal(shape) * 50).astype(t),
              st.lists(st.integers(0, 4), max_size=3), st.sampled_from(["float32", "float64", "int64", "uint16"]),
              st.integers(0, 1000)),
)
trees = st.recursive(
    st.one_of(scalars, tensors, numpy_leaves),
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.lists(kids, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=4).filter(lambda k: not k.startswith("$")), kids, max_size=4),
        st.dictionaries(st.integers(0, 9), kids, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(tree=trees)
def test_round_trip_keeps_fingerprints(tree) -> None:
    back = decode(encode({"x": tree}))
    assert digest_components({"c": back}) == digest_components({"c": {"x": tree}})


def test_special_floats_and_real_state() -> None:
    tree = {"a": math.inf, "b": -0.0, "c": (1, 2.5), 3: [torch.tensor(7)]}
    back = decode(encode(tree))
    assert back["a"] == math.inf and math.copysign(1, back["b"]) == -1 and back["c"] == (1, 2.5)
    assert back[3][0].item() == 7 and back[3][0].dim() == 0
    opt = torch.optim.Adam(torch.nn.Linear(2, 2).parameters())
    sd = opt.state_dict()
    again = decode(encode(sd))
    assert again["param_groups"][0]["betas"] == sd["param_groups"][0]["betas"]
    assert isinstance(again["param_groups"][0]["betas"], tuple)


def test_numpy_leaves_keep_their_type_and_dtype() -> None:
    tree = {"pos": np.int64(7), "mean": np.float32(0.5), "flag": np.bool_(True), "w": np.arange(6, dtype=np.uint32).reshape(2, 3),
            "names": np.array(["a", "bc"])}
    back = decode(encode(tree))
    for k, v in tree.items():
        assert type(back[k]) is type(v) and back[k].dtype == v.dtype and np.array_equal(back[k], v), k
    assert back["w"].flags.writeable  # a copy, not a view of the blob
    with pytest.raises(TypeError, match="Python objects"):
        encode({"x": np.array([object()])})


def test_a_large_array_is_fingerprinted_by_every_byte() -> None:
    """An ndarray's repr elides its middle once it is large: two arrays differing there had one fingerprint."""
    a = np.zeros(10_000, dtype=np.float32)
    b = a.copy()
    b[5_000] = 1.0
    assert digest_components({"data": {"a": a}}) != digest_components({"data": {"a": b}})
    assert digest_components({"data": {"a": a}}) == digest_components({"data": {"a": a.copy()}})
