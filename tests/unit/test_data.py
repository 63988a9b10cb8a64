"""The data pipeline resumes mid-epoch exactly where an uninterrupted one would be."""
from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from baft.persist.commits import deserialize, serialize

from harness.worker.data import ResumableBatchSampler, make_dataset
from harness.worker.shapes import PRESETS


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


@settings(max_examples=60, deadline=None)
@given(size=st.integers(8, 32), gb=st.sampled_from([2, 4, 8]), stop=st.integers(0, 12), more=st.integers(0, 12),
       seed=st.integers(0, 1000))
def test_a_restore_leaves_the_generator_where_an_uninterrupted_run_has_it(size: int, gb: int, stop: int, more: int,
                                                                          seed: int) -> None:
    """As a checkpoint restores it: the generator's saved state first (the rng component), then the sampler.
    At every boundary — also the first, before the epoch's permutation was drawn — the generator must then be
    where the uninterrupted run's is, and stay so (anything else drawing from it would see other numbers)."""
    ref_gen = torch.Generator().manual_seed(seed)
    ref = ResumableBatchSampler(size, gb, ref_gen, 0, 1)
    it = iter(ref)
    for _ in range(stop):
        next(it)
    saved = deserialize(serialize({"data": ref.state_dict(), "generator": ref_gen.get_state()}))
    gen = torch.Generator().manual_seed(seed + 7)
    resumed = ResumableBatchSampler(size, gb, gen, 0, 1)
    gen.set_state(saved["generator"])
    resumed.load_state_dict(saved["data"])
    assert torch.equal(gen.get_state(), ref_gen.get_state())
    it2 = iter(resumed)
    for _ in range(more):
        assert next(it2) == next(it)
        assert torch.equal(gen.get_state(), ref_gen.get_state())


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
