"""TrainState capture/restore: a round trip through the on-disk format restores training bit for bit;
fingerprints: equal bytes, equal digests; any flipped byte, dtype or shape changes them; norms are accurate."""
from __future__ import annotations

import random
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from baft import TrainState, digest_components
from baft.persist.commits import deserialize, serialize
from baft.state import fingerprint as state_mod
from baft.state.fingerprint import (
    BLOCK_BYTES,
    digest_leaf,
    fingerprint_components,
    fingerprint_leaf,
    flatten,
)


def make(widths: list[int], opt: str, seed: int) -> tuple[TrainState, torch.Generator]:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.Dropout(0.2), torch.nn.BatchNorm1d(b)]
    model = torch.nn.Sequential(*layers)
    optimizer = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
        "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    }[opt](model.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    gen = torch.Generator().manual_seed(seed + 1)
    return TrainState(model=model, optimizer=optimizer, scheduler=scheduler, generators={"loader": gen}), gen


def train(state: TrainState, gen: torch.Generator, steps: int, width: int) -> list[float]:
    losses = []
    for _ in range(steps):
        x = torch.randn(8, width, generator=gen)
        noise = torch.randn(8, 1) + float(np.random.rand()) + random.random()  # global RNGs matter too
        loss = (state.model(x).pow(2).mean() + noise.mean() * 0).float()
        state.optimizer.zero_grad()
        loss.backward()
        state.optimizer.step()
        state.scheduler.step()
        state.step += 1
        losses.append(loss.item())
    return losses


@settings(max_examples=25, deadline=None)
@given(
    widths=st.lists(st.integers(2, 12), min_size=2, max_size=4),
    opt=st.sampled_from(["sgd", "adam", "adamw"]),
    before=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_round_trip_continues_bitwise(widths: list[int], opt: str, before: int, seed: int) -> None:
    state, gen = make(widths, opt, seed)
    random.seed(seed)
    np.random.seed(seed)
    train(state, gen, before, widths[0])
    blob = serialize(state.capture())
    expected_digests = digest_components(state.capture())
    expected = train(state, gen, 3, widths[0])

    # A fresh job with different init and RNG positions, restored from the bytes.
    fresh, fresh_gen = make(widths, opt, seed + 7)
    random.seed(seed + 1)
    torch.manual_seed(seed + 3)
    fresh.restore(deserialize(blob))
    assert digest_components(fresh.capture()) == expected_digests
    assert train(fresh, fresh_gen, 3, widths[0]) == expected
    assert fresh.step == state.step


def test_omitted_component_is_absent_and_changes_the_future() -> None:
    state, gen = make([4, 4], "adam", 0)
    random.seed(0)
    np.random.seed(0)
    train(state, gen, 2, 4)
    partial = state.capture(omit=("rng",))
    assert "rng" not in partial and "optimizer" in partial
    full = state.capture()
    assert set(full) - set(partial) == {"rng"}
    blob_full, blob_partial = serialize(full), serialize(partial)
    expected = train(state, gen, 3, 4)  # the future from step 2: the loader's draws and dropout's masks

    def resumed(blob: bytes) -> list[float]:
        torch.manual_seed(99)  # a restarted process: its generators are somewhere else
        gen.manual_seed(99)
        state.restore(deserialize(blob))
        return train(state, gen, 3, 4)

    assert resumed(blob_full) == expected  # the generators were restored: the same draws, the same steps
    without_rng = resumed(blob_partial)
    assert without_rng != expected  # same weights and optimizer, other draws: another future
    assert state.step == 5


def test_capture_loads_with_weights_only() -> None:
    state, gen = make([3, 5], "adam", 1)
    train(state, gen, 1, 3)
    tree = deserialize(serialize(state.capture()))  # torch.load(weights_only=True) inside
    keys = dict(flatten(tree))
    assert "rng.python.internal" in keys and "rng.generator.loader" in keys
    assert any(k.startswith("optimizer.state.") for k in keys)


def test_digest_distinguishes_dtype_shape_and_value() -> None:
    a = torch.zeros(4)
    assert digest_leaf(a) == digest_leaf(torch.zeros(4))
    assert digest_leaf(a) != digest_leaf(torch.zeros(2, 2))
    assert digest_leaf(a) != digest_leaf(torch.zeros(4, dtype=torch.float64))
    b = a.clone()
    b[3] = -0.0  # a sign bit is a different bit pattern
    assert digest_leaf(a) != digest_leaf(b)
    assert digest_leaf(torch.tensor(1.0)) != digest_leaf(torch.tensor(2.0))  # 0-dim


def test_restore_without_model_is_refused() -> None:
    from baft import BaftError

    state, _ = make([2, 2], "sgd", 0)
    with pytest.raises(BaftError):
        state.restore({"rng": {}})


# --- fingerprints: xxh3-128 digests and L2 norms -------------------------------------------

#: Dtypes whose every bit pattern is a valid value (bool is not: a flipped byte is not a bool).
BYTE_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8]
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def random_bytes_tensor(dtype: torch.dtype, numel: int, seed: int) -> torch.Tensor:
    """A tensor of uniformly random bytes: NaNs, infinities and subnormals included."""
    gen = torch.Generator().manual_seed(seed)
    size = numel * dtype.itemsize
    return torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen).view(dtype)


# Up to ~3 norm blocks of float32, so the block boundaries and the carried tail are crossed.
sizes = st.one_of(st.integers(0, 64), st.integers(BLOCK_BYTES // 8 - 3, 3 * BLOCK_BYTES // 4 + 5))


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(BYTE_DTYPES), numel=sizes, seed=st.integers(0, 2**16), data=st.data())
def test_equal_tensors_equal_fingerprints_and_any_flipped_byte_changes_it(
    dtype: torch.dtype, numel: int, seed: int, data: st.DataObject
) -> None:
    t = random_bytes_tensor(dtype, numel, seed)
    twin = t.clone()  # other memory, same bytes
    digest, norm = fingerprint_leaf(t)
    assert re.fullmatch(r"[0-9a-f]{32}", digest), digest  # 128 bits in lowercase hex
    twin_digest, twin_norm = fingerprint_leaf(twin)
    assert twin_digest == digest and digest_leaf(t) == digest
    assert (norm is None) == (not dtype.is_floating_point)
    if norm is not None and not np.isnan(norm):
        assert twin_norm == norm  # the norm is a function of the bytes: bit for bit
    if numel:
        raw = twin.view(torch.uint8)
        i = data.draw(st.integers(0, raw.numel() - 1), label="byte")
        raw[i] ^= data.draw(st.integers(1, 255), label="mask")
        assert fingerprint_leaf(twin)[0] != digest


@settings(max_examples=30, deadline=None)
@given(numel=st.integers(1, 64), seed=st.integers(0, 2**16), data=st.data())
def test_dtype_and_shape_are_part_of_the_fingerprint(numel: int, seed: int, data: st.DataObject) -> None:
    t = random_bytes_tensor(torch.int32, numel, seed)
    assert digest_leaf(t) != digest_leaf(t.view(torch.float32))  # same bytes, other dtype
    assert digest_leaf(t) != digest_leaf(t.view(torch.uint8))
    rows = data.draw(st.sampled_from([d for d in range(1, numel + 1) if numel % d == 0]), label="rows")
    assert digest_leaf(t) != digest_leaf(t.reshape(rows, numel // rows, 1))  # same bytes, other shape
    if numel > 1:
        assert digest_leaf(t.reshape(1, numel)) != digest_leaf(t.reshape(numel, 1))


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(FLOATS),
    values=st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), max_size=40),
    scale_exp=st.integers(-40, 40),
    numel=st.integers(0, 3 * BLOCK_BYTES // 4 + 5),
    seed=st.integers(0, 2**16),
)
def test_norm_matches_float64_vector_norm(dtype: torch.dtype, values: list[float], scale_exp: int, numel: int,
                                          seed: int) -> None:
    """Hand-picked extremes (subnormal, 3e38: their float32 squares underflow or overflow) and
    scaled normal noise over several blocks: all within 1e-6 of the float64 norm."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(numel, generator=gen, dtype=torch.float64) * 10.0**scale_exp
    t = torch.cat([torch.tensor(values, dtype=torch.float64), noise]).to(dtype)
    _, norm = fingerprint_leaf(t)
    expected = float(torch.linalg.vector_norm(t, dtype=torch.float64))
    if np.isinf(expected):  # float16/bfloat16 casts of huge noise overflow to inf
        assert norm == expected
    else:
        assert norm == pytest.approx(expected, rel=1e-6, abs=1e-300)


@pytest.mark.parametrize("stage_bytes", [3, 1000, 64 << 20])
@settings(max_examples=25, deadline=None)
@given(
    dtype=st.sampled_from(BYTE_DTYPES),
    shape=st.lists(st.integers(1, 40), min_size=2, max_size=3),
    seed=st.integers(0, 2**16),
    how=st.sampled_from(["transpose", "step", "column", "expand"]),
)
def test_non_contiguous_fingerprints_like_its_contiguous_copy(
    stage_bytes: int, dtype: torch.dtype, shape: list[int], seed: int, how: str
) -> None:
    """Staged in pieces of any size (down to 3 bytes: the norm's blocks then straddle pieces)."""
    base = random_bytes_tensor(dtype, int(np.prod(shape)), seed).reshape(shape)
    view = {
        "transpose": lambda: base.transpose(0, -1),
        "step": lambda: base[::2],
        "column": lambda: base[..., 1:2] if shape[-1] > 1 else base.transpose(0, -1),
        "expand": lambda: base[:1].expand(3, *shape[1:]),
    }[how]()
    old, state_mod.STAGE_BYTES = state_mod.STAGE_BYTES, stage_bytes
    try:
        got = fingerprint_leaf(view)
    finally:
        state_mod.STAGE_BYTES = old
    want = fingerprint_leaf(view.contiguous())
    assert got[0] == want[0]
    assert got[1] == want[1] or (got[1] is not None and np.isnan(got[1]) and np.isnan(want[1]))


def test_components_carry_norms_for_float_tensors_only() -> None:
    state, gen = make([4, 3], "adam", 0)
    train(state, gen, 2, 4)
    comps = state.capture()
    digests, norms = fingerprint_components(comps, state.param_names())
    assert digests == digest_components(comps, state.param_names())
    assert fingerprint_components(comps, with_norms=False)[1] == {}
    assert "state.0.weight.exp_avg" in norms["optimizer"]  # renamed like the digests
    assert all(len(d) == 32 for leaves in digests.values() for d in leaves.values())

    digests, norms = fingerprint_components(comps)  # keys as flatten names them
    for comp, tree in comps.items():
        for key, leaf in flatten(tree):
            if key in digests[comp]:  # optimizer param index lists are skipped
                is_float = isinstance(leaf, torch.Tensor) and leaf.is_floating_point()
                assert (key in norms.get(comp, {})) == is_float, f"{comp}.{key}"
    assert "torch" in digests["rng"] and "torch" not in norms.get("rng", {})  # a uint8 RNG state has no norm
    w = comps["model"]["0.weight"]
    assert norms["model"]["0.weight"] == pytest.approx(float(torch.linalg.vector_norm(w, dtype=torch.float64)), rel=1e-7)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensor_fingerprints_like_the_device_digest_of_its_cpu_copy() -> None:
    """A CUDA tensor is fingerprinted where it lives (:mod:`baft.state.devicedigest`): its digest is the device
    digest's of its CPU copy, bit for bit, and its norm that of the host pass within rounding."""
    from baft.state.devicedigest import device_fingerprint

    gen = torch.Generator().manual_seed(0)
    for t in [torch.randn(3_000_000, generator=gen), torch.randn(700, 900, generator=gen).to(torch.bfloat16),
              torch.randn(1000, 800, generator=gen, dtype=torch.float64).t(), torch.arange(10**6)]:
        digest, norm = fingerprint_leaf(t.cuda())
        assert digest == device_fingerprint(t)[0]
        host_norm = fingerprint_leaf(t)[1]
        assert (norm is None) == (host_norm is None)
        if norm is not None:
            assert norm == pytest.approx(host_norm, rel=2e-7)
