"""TrainState capture/restore: a round trip through the on-disk format restores training bit for bit."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from baft import TrainState, digest_components
from baft.persist import deserialize, serialize
from baft.state import flatten


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
    train(state, gen, 2, 4)
    partial = state.capture(omit=("rng",))
    assert "rng" not in partial and "optimizer" in partial
    full = state.capture()
    assert set(full) - set(partial) == {"rng"}


def test_capture_loads_with_weights_only() -> None:
    state, gen = make([3, 5], "adam", 1)
    train(state, gen, 1, 3)
    tree = deserialize(serialize(state.capture()))  # torch.load(weights_only=True) inside
    keys = dict(flatten(tree))
    assert "rng.python.internal" in keys and "rng.generator.loader" in keys
    assert any(k.startswith("optimizer.state.") for k in keys)


def test_digest_distinguishes_dtype_shape_and_value() -> None:
    from baft.state import digest_leaf

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
