"""The store's group weight (baft.store.governor): lowered only after enough calm replicas in a row, raised at
once by a late one or a missed version, and slower to lower again each time that happened."""
from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from baft.priority import GROUP_HIGH, GROUP_LOW
from baft.store.governor import CALM, CALM_AT, MAX_CALM, RAISE_AT, GroupGovernor


def governor(refuse: bool = False) -> tuple[GroupGovernor, list[int], list[tuple[str, dict[str, Any]]]]:
    set_to: list[int] = []
    events: list[tuple[str, dict[str, Any]]] = []

    def set_nice(nice: int) -> str:
        set_to.append(nice)
        return "Permission denied" if refuse else ""

    return GroupGovernor(lambda event, **f: events.append((event, f)), set_nice), set_to, events


def test_the_group_is_lowered_after_calm_replicas_and_raised_by_a_late_one_then_needs_twice_as_many() -> None:
    g, set_to, events = governor()
    for _ in range(CALM - 1):
        g.landed(0.1, "sent to b")
    assert not g.lowered and set_to == []
    g.landed(0.2, "received from a peer", counts=False)  # a replica received: may raise, never lowers
    assert not g.lowered
    g.landed(0.2, "sent to b")
    assert g.lowered and set_to == [GROUP_LOW]
    g.landed(0.7, "received from a peer", counts=False)
    g.landed(0.7, "sent to b")  # later than calm, not late: neither
    assert g.lowered and set_to == [GROUP_LOW]
    g.landed(1.5, "still unsent when the next version was sealed", counts=False)
    assert not g.lowered and set_to == [GROUP_LOW, GROUP_HIGH] and g.calm_needed == 2 * CALM
    assert events[-1][0] == "store_group" and events[-1][1]["nice"] == GROUP_HIGH
    assert "1.50 versions after its seal" in events[-1][1]["reason"] and events[-1][1]["late_versions"] == 1.5
    for _ in range(2 * CALM - 1):
        g.landed(0.0, "sent to b")
    assert not g.lowered
    g.landed(0.0, "sent to b")
    assert g.lowered
    g.missed("rank 0's slot of version 7 was rewritten before the store read it")
    assert not g.lowered and g.calm_needed == 4 * CALM and events[-1][1]["reason"].startswith("rank 0's slot")


def test_a_refused_change_is_journaled_once_and_the_group_is_left_alone() -> None:
    g, set_to, events = governor(refuse=True)
    for _ in range(3 * CALM):
        g.landed(0.0, "sent to b")
    assert set_to == [GROUP_LOW] and not g.lowered
    assert [e for e, _ in events] == ["store_group"] and events[0][1]["nice"] is None
    assert "Permission denied" in events[0][1]["reason"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.floats(0, 3 * RAISE_AT, allow_nan=False), st.booleans()), st.none()),
                max_size=600))
def test_the_governor_against_its_rule(steps: list[tuple[float, bool] | None]) -> None:
    """Any sequence of landings (with whether they count towards a calm run; ``None``: a missed version): the
    group is lowered exactly when ``calm_needed`` calm landings that count came in a row since the last change
    or late one, raised exactly at a late landing (counting or not) or a miss while lowered; ``calm_needed``
    doubles at a raise that comes before that many were sent lowered (up to ``MAX_CALM``), and is ``CALM``
    again after a longer spell."""
    g, set_to, events = governor()
    lowered, calm, needed, spell = False, 0, CALM, 0

    def raised() -> int:
        return min(2 * needed, MAX_CALM) if spell < needed else CALM

    for step in steps:
        if step is None:
            g.missed("slot rewritten")
            calm = 0
            if lowered:
                lowered, needed = False, raised()
        else:
            s, counts = step
            g.landed(s, "sent to b", counts=counts)
            spell += lowered and counts
            if s > RAISE_AT:
                calm = 0
                if lowered:
                    lowered, needed = False, raised()
            elif s <= CALM_AT and counts:
                calm += 1
                if not lowered and calm >= needed:
                    lowered, calm, spell = True, 0, 0
        assert g.lowered == lowered and g.calm_needed == needed
    assert len(set_to) == len(events) == g.changes
    assert all(a != b for a, b in zip(set_to, set_to[1:]))  # it alternates: never set twice to the same
    assert all(n == (GROUP_LOW if i % 2 == 0 else GROUP_HIGH) for i, n in enumerate(set_to))


def test_a_late_replica_after_a_long_calm_spell_starts_the_calm_run_afresh() -> None:
    g, _, events = governor()
    for _ in range(CALM):
        g.landed(0.0, "sent to b")
    g.landed(2.0, "sent to b")  # at once: a relapse
    assert g.calm_needed == 2 * CALM
    for _ in range(2 * CALM):
        g.landed(0.0, "sent to b")
    assert g.lowered
    for _ in range(5 * CALM):  # a long good spell lowered
        g.landed(0.1, "sent to b")
    g.landed(0.9, "still unsent when the next version was sealed", counts=False)
    assert not g.lowered and g.calm_needed == CALM and events[-1][1]["calm_needed"] == CALM
