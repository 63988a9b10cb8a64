"""The data pipeline resumes mid-epoch exactly where an uninterrupted one would be."""
from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.data import ResumableBatchSampler, make_dataset
from harness.models import PRESETS
from baft.persist import deserialize, serialize


def batches(sampler: ResumableBatchSampler, n: int) -> list[list[tuple[int, int]]]:
    return list(itertools.islice(iter(sampler), n))


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(8, 64), gb=st.sampled_from([2, 4, 8]), replicas=st.sampled_from([1, 2]),
    stop=st.integers(0, 30), more=st.integers(1, 20), seed=st.integers(0, 1000),
)
def test_resume_mid_epoch(size: int, gb: int, replicas: int, stop: int, more: int, seed: int) -> None:
    for replica in range(replicas):
        ref = ResumableBatchSampler(size, gb, torch.Generator().manual_seed(seed), replica, replicas)
        expected = batches(ref, stop + more)[stop:]

        first = ResumableBatchSampler(size, gb, torch.Generator().manual_seed(seed), replica, replicas)
        batches(first, stop)
        saved = deserialize(serialize(first.state_dict()))
        resumed = ResumableBatchSampler(size, gb, torch.Generator().manual_seed(seed + 99), replica, replicas)
        resumed.load_state_dict(saved)
        assert batches(resumed, more) == expected


def test_epochs_reshuffle_and_cover_everything() -> None:
    s = ResumableBatchSampler(16, 4, torch.Generator().manual_seed(0), 0, 1)
    b = batches(s, 8)
    e0 = sorted(i for batch in b[:4] for (_, i) in batch)
    e1 = [i for batch in b[4:] for (_, i) in batch]
    assert e0 == list(range(16))
    assert sorted(e1) == list(range(16)) and e1 != [i for batch in b[:4] for (_, i) in batch]
    assert {e for batch in b[4:] for (e, _) in batch} == {1}


def test_samples_are_pure_functions_of_seed_epoch_index() -> None:
    ds = make_dataset(PRESETS["gpt-tiny"], 3, 32)
    again = make_dataset(PRESETS["gpt-tiny"], 3, 32)
    x, y = ds[(0, 5)]
    x2, y2 = again[(0, 5)]
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, y3 = ds[(1, 5)]  # another epoch: same target, maybe other augmentation noise
    assert torch.equal(y, y3)
    mlp = make_dataset(PRESETS["mlp"], 3, 32)
    assert mlp[(0, 1)][0].shape == (32,)
