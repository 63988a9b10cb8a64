"""Planner invariants (hypothesis): exact cover, window budgets, stability under re-planning."""
from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from baft.bubbles.planner import PlannerConfig, make_chunks, owned, plan

sizes = st.lists(st.integers(0, 5000), min_size=0, max_size=30)
windows = st.lists(st.floats(0, 0.01, allow_nan=False), min_size=0, max_size=12)


def spans_of(sz: list[int]) -> list[tuple[int, int]]:
    out, off = [], 0
    for n in sz:
        out.append((off, n))
        off += (n + 63) // 64 * 64
    return out


@settings(max_examples=200, deadline=None)
@given(sz=sizes, chunk=st.integers(1024, 4096), replicas=st.integers(1, 4))
def test_chunks_cover_every_byte_exactly_once(sz: list[int], chunk: int, replicas: int) -> None:
    spans = spans_of(sz)
    chunks = make_chunks(spans, chunk)
    covered: dict[int, list[tuple[int, int]]] = {}
    for c in chunks:
        assert 0 < c.nbytes <= chunk
        assert c.offset == spans[c.tensor][0] + c.tensor_offset
        covered.setdefault(c.tensor, []).append((c.tensor_offset, c.nbytes))
    for t, (_, n) in enumerate(spans):
        parts = sorted(covered.get(t, []))
        pos = 0
        for off, size in parts:
            assert off == pos  # no gap, no overlap
            pos += size
        assert pos == n
    # Replicas split the chunks: each chunk belongs to exactly one replica, whole tensors
    # each, balanced to within the largest tensor.
    shares = [owned(chunks, r, replicas) for r in range(replicas)]
    assert sorted(c.index for s in shares for c in s) == [c.index for c in chunks]
    for t in {c.tensor for c in chunks}:
        assert sum(any(c.tensor == t for c in s) for s in shares) == 1
    loads = [sum(c.nbytes for c in s) for s in shares]
    biggest = max((n for _, n in spans), default=0)
    assert max(loads) - min(loads) <= biggest


@settings(max_examples=200, deadline=None)
@given(sz=sizes, win=windows, bw=st.floats(1e5, 1e10), fill=st.floats(0.1, 1.0))
def test_plan_respects_budgets_and_accounts_for_everything(sz: list[int], win: list[float], bw: float, fill: float) -> None:
    chunks = make_chunks(spans_of(sz), 1024)
    cfg = PlannerConfig(chunk_bytes=1024, fill=fill)
    p = plan(chunks, win, bw, cfg)
    by_index = {c.index: c for c in chunks}
    for w, assigned in zip(win, p.assignment):
        assert sum(by_index[i].nbytes for i in assigned) / bw <= w * fill + 1e-12
    placed = [i for a in p.assignment for i in a] + p.overflow
    assert placed == [c.index for c in chunks]  # every chunk once, in order
    assert p.overflow_bytes == sum(by_index[i].nbytes for i in p.overflow)
    assert p.fits == (not p.overflow)


@settings(max_examples=100, deadline=None)
@given(sz=sizes, win=windows, bw=st.floats(1e5, 1e10))
def test_replanning_with_the_same_measurements_is_stable(sz: list[int], win: list[float], bw: float) -> None:
    chunks = make_chunks(spans_of(sz), 2048)
    cfg = PlannerConfig(chunk_bytes=2048)
    a = plan(chunks, win, bw, cfg)
    b = plan(chunks, list(win), bw, cfg)
    assert a.assignment == b.assignment and a.overflow == b.overflow
    # More room never moves a chunk into overflow that fit before.
    c = plan(chunks, [w * 2 for w in win], bw, cfg)
    assert set(c.overflow) <= set(a.overflow)


@settings(max_examples=100, deadline=None)
@given(sz=st.lists(st.integers(1, 5000), min_size=1, max_size=20), it=st.floats(0.01, 1.0), budget=st.floats(0.001, 0.5))
def test_every_k_bounds_the_amortised_stall(sz: list[int], it: float, budget: float) -> None:
    chunks = make_chunks(spans_of(sz), 1024)
    p = plan(chunks, [], 1e6, PlannerConfig(chunk_bytes=1024, overflow="every_k", stall_budget=budget), iteration_seconds=it)
    assert not p.fits
    assert p.every & (p.every - 1) == 0 and p.every <= 64  # a power of two, capped
    if p.every < 64:
        assert p.stall_seconds / p.every <= budget * it + 1e-12
    assert p.every == 1 or p.stall_seconds / (p.every // 2) > budget * it  # the smallest such power
    assert math.isfinite(p.stall_seconds)


@settings(max_examples=100, deadline=None)
@given(ks=st.lists(st.integers(0, 6), min_size=2, max_size=8), horizon=st.integers(64, 500))
def test_independent_every_k_choices_share_versions(ks: list[int], horizon: int) -> None:
    """Ranks pick k on their own; powers of two keep a common version within any max-k span."""
    everies = [2**k for k in ks]
    common = [v for v in range(horizon) if all(v % e == 0 for e in everies)]
    assert common and all(b - a == max(everies) for a, b in zip(common, common[1:]))


def test_every_k_is_one_before_any_iteration_was_measured() -> None:
    chunks = make_chunks(spans_of([4096] * 4), 1024)
    p = plan(chunks, [], 1e6, PlannerConfig(chunk_bytes=1024, overflow="every_k"), iteration_seconds=0.0)
    assert p.every == 1
