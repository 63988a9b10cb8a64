"""Replica placement: ring and group targets, and the chance that k nodes lost at once leave every
state in memory — the exact count checked against listing every loss and against a simulation; and the
same for the loss of a whole failure domain, by where the domains lie in the node numbering."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baft.store.placement import (
    DOMAIN_LAYOUTS,
    PLACEMENTS,
    domain_recovery_probability,
    domains,
    enumerate_probability,
    groups,
    holders,
    recovery_probability,
    simulate,
    spread_order,
    survives,
    targets,
)

shapes = st.integers(2, 11).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, 3), st.integers(0, n)))


@given(shapes, st.sampled_from(PLACEMENTS))
@settings(max_examples=200, deadline=None)
def test_the_exact_probability_is_the_share_of_every_loss_that_keeps_every_state(shape, placement: str) -> None:
    n, r, k = shape
    exact = recovery_probability(n, r, k, placement)
    assert math.isclose(exact, enumerate_probability(n, r, k, placement) if k else 1.0, abs_tol=1e-12)


@given(st.integers(2, 40), st.integers(0, 4), st.sampled_from(PLACEMENTS))
@settings(max_examples=100, deadline=None)
def test_targets_are_other_nodes_as_many_as_asked(n: int, r: int, placement: str) -> None:
    for i in range(n):
        t = targets(i, n, r, placement)
        assert len(t) == len(set(t)) == min(r, n - 1) and i not in t and all(0 <= x < n for x in t)
    if placement == "group":
        gs = groups(n, r)
        assert sorted(x for g in gs for x in g) == list(range(n))  # a partition of the nodes
        for g in gs:
            for i in g:
                assert set(targets(i, n, r, placement)) <= set(g)  # nothing leaves the group


@pytest.mark.parametrize(("n", "r", "k"), [(32, 1, 3), (64, 2, 6), (128, 1, 4), (100, 2, 10)])
def test_the_simulation_agrees_with_the_exact_probability(n: int, r: int, k: int) -> None:
    for placement in PLACEMENTS:
        exact = recovery_probability(n, r, k, placement)
        sim = simulate(n, r, k, placement, trials=20000, seed=1)
        assert abs(sim - exact) < 4 * math.sqrt(exact * (1 - exact) / 20000) + 1e-3, (placement, exact, sim)


@given(shapes)
@settings(max_examples=100, deadline=None)
def test_group_placement_survives_at_least_as_often_as_the_ring_when_groups_divide_the_nodes(shape) -> None:
    n, r, k = shape
    if n % (r + 1) == 0:
        assert recovery_probability(n, r, k, "group") >= recovery_probability(n, r, k, "ring") - 1e-12


def test_a_whole_group_lost_loses_its_states_and_a_split_loss_does_not() -> None:
    hs = holders(4, 1, "group")  # groups {0, 1} and {2, 3}
    assert groups(4, 1) == [[0, 1], [2, 3]]
    assert not all(not h <= {0, 1} for h in hs)  # the whole group gone: its states are gone
    assert all(not h <= {0, 2} for h in hs)  # one of each group: every state survives
    ring = holders(4, 1, "ring")
    assert not all(not h <= {1, 2} for h in ring)  # a ring loses node 1's state with nodes 1 and 2


@given(st.integers(2, 40), st.integers(0, 4), st.integers(1, 12), st.sampled_from(PLACEMENTS),
       st.sampled_from(DOMAIN_LAYOUTS[:2]), st.booleans())
@settings(max_examples=200, deadline=None)
def test_a_domain_loss_is_survived_as_often_as_every_holder_set_says(n, r, d, placement, layout, aware) -> None:
    sets = domains(n, d, layout)
    assert sorted(x for s in sets for x in s) == list(range(n)) and all(0 < len(s) <= d for s in sets)
    hs = holders(n, r, placement, d if aware else 0)  # every node's holders, not only the lost domain's
    kept = sum(survives(frozenset(s), hs) for s in sets) / len(sets)
    assert math.isclose(domain_recovery_probability(n, r, d, placement, layout, aware), kept, abs_tol=1e-12)


@given(st.integers(1, 8), st.integers(1, 8), st.integers(0, 4), st.sampled_from(PLACEMENTS))
@settings(max_examples=200, deadline=None)
def test_told_the_domains_a_placement_sends_each_replica_to_another_domain_while_there_are_any(
        count: int, d: int, r: int, placement: str) -> None:
    """``count`` domains of ``d`` nodes: every node's targets are valid, each node receives as many
    replicas as it sends, and a node and its targets span as many domains as they can (all different
    while there are enough domains; the group placement's remainder group excepted)."""
    n = count * d
    if n < 2:
        return
    assert sorted(spread_order(n, d)) == list(range(n))
    received = [0] * n
    for i in range(n):
        t = targets(i, n, r, placement, d)
        assert len(t) == len(set(t)) == min(r, n - 1) and i not in t and all(0 <= x < n for x in t)
        for x in t:
            received[x] += 1
        spanned = {x // d for x in [i, *t]}
        if placement == "ring" or n % (min(r, n - 1) + 1) == 0:
            assert len(spanned) == min(len(t) + 1, count), (i, t)
    assert set(received) == {min(r, n - 1)}


def test_aligned_racks_take_every_replica_with_them_and_interleaved_ones_none() -> None:
    # 128 nodes in racks of 8, one or two replicas on the next ranks: an aligned rack holds its first
    # node's every copy; interleaved, the next ranks are in other racks.
    for placement in PLACEMENTS:
        for r in (1, 2):
            assert domain_recovery_probability(128, r, 8, placement, "aligned") == 0.0
            assert domain_recovery_probability(128, r, 8, placement, "interleaved") == 1.0
            assert domain_recovery_probability(128, r, 8, placement, "random") == pytest.approx(
                recovery_probability(128, r, 8, placement))
    # Told the racks, the stores send the replicas to other racks: every aligned rack loss is survived
    # (also when the last rack is smaller: 10 nodes in racks of 4, the last of 2).
    for placement in PLACEMENTS:
        for r in (1, 2):
            assert domain_recovery_probability(128, r, 8, placement, "aligned", aware=True) == 1.0
    assert domain_recovery_probability(10, 1, 4, "ring", "aligned", aware=True) == 1.0
    # Replicas reaching past the rack keep a copy even when aligned.
    assert domain_recovery_probability(128, 8, 8, "ring", "aligned") == 1.0
    assert domain_recovery_probability(10, 1, 4, "ring", "aligned") == 0.0  # racks {0..3} {4..7} {8, 9}
    assert domains(10, 4, "interleaved") == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    with pytest.raises(ValueError, match="layout"):
        domains(8, 2, "striped")
