"""Which versions a store replicates (baft.store.stride): the stride follows the link, and replication stops
when a replica could no longer beat the persistent tier, then resumes after a probe."""
from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from baft.store.stride import (
    DEGRADE_HOLD,
    DEGRADE_ROUNDS,
    MAX_HOLD,
    MAX_STRIDE,
    QUIET_EVERY,
    QUIET_VERSIONS,
    RESUME_SHARE,
    Stride,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stride(period: float = 0.1, persist_every: int | None = 10,
           max_slowdown: float = 0.0) -> tuple[Stride, Clock, list[tuple[str, dict[str, Any]]]]:
    clock, events = Clock(), []
    s = Stride(lambda event, **fields: events.append((event, fields)), max_slowdown, clock)
    # sealed every `period` seconds, each persist committing as it comes (no lag): over a whole persist interval
    # where it is 20 or shorter (then the tier's age is measured, half its interval, and the age rule applies),
    # else five versions (the tests of the slowdown budget go on from version 5)
    for v in range(max(5, persist_every or 0) if (persist_every or 0) <= 20 else 5):
        s.sealed(v, persist_every, persisted=(persist_every or 1) * (v // (persist_every or 1)))
        clock.now += period
    return s, clock, events


def test_the_period_comes_from_the_seals_and_the_persistent_interval_from_the_ranks() -> None:
    s, _, _ = stride(period=0.25, persist_every=7)
    assert abs(s.period - 0.25) < 1e-9 and s.persist_every == 7
    s.sealed(5, None)  # a rank that did not say keeps the last interval
    assert s.persist_every == 7


def test_a_slow_link_doubles_the_stride_and_a_fast_one_halves_it_again() -> None:
    s, _, events = stride(persist_every=None)
    s.round_done(0.25)  # 2.5 versions for a stride of 1
    s.round_done(0.25)  # 2.5 versions for a stride of 2
    assert s.value == 4 and [e for e, _ in events] == ["replication_stride"] * 2
    assert s.wants(8) and not s.wants(6)
    s.round_done(0.01)
    assert s.value == 2 and events[-1][1]["reason"] == "rounds fit again"


def test_replicas_older_than_the_persistent_tiers_checkpoints_stop_replication_and_say_why() -> None:
    s, clock, events = stride(period=0.1, persist_every=10)
    for _ in range(DEGRADE_ROUNDS - 1):
        s.round_done(1.5)  # 15 versions a round: the newest replica 22.5 versions old, the checkpoint 5
        assert not s.degraded
    s.round_done(1.5)
    assert s.degraded and not s.may_start()
    (degraded,) = [f for e, f in events if e == "replication_degraded"]
    assert degraded["replica_age_versions"] == 22.5 and degraded["persistent_age_versions"] == 5
    assert degraded["persist_every"] == 10
    assert "persistent tier" in degraded["reason"]
    clock.now += DEGRADE_HOLD - 0.1
    assert not s.may_start()
    clock.now += 0.2
    assert s.may_start()  # one probe round
    s.round_done(0.3)  # 3 versions: replicas 4.5 old, younger than 5 but not by the resume margin
    assert s.degraded and not s.may_start()
    clock.now += DEGRADE_HOLD + 0.1
    assert not s.may_start()  # a failed probe doubles the wait
    clock.now += DEGRADE_HOLD
    assert s.may_start()
    s.round_done(1.5)
    assert s.hold == min(4 * DEGRADE_HOLD, MAX_HOLD)
    clock.now += s.hold + 0.1
    s.round_done(0.15)  # replicas 2 versions old: at most half the persistent tier's 5
    assert not s.degraded and s.may_start() and "replication_resumed" in [e for e, _ in events[-2:]]


def test_replicas_exactly_as_old_as_the_persistent_tier_keep_replicating() -> None:
    """Three rounds whose median age equals the persistent tier's (15 / 2 versions) degrade nothing: the
    measured period comes out a hair under 0.1 s, and the age a hair over 7.5 (hypothesis found it)."""
    s, _, events = stride(period=0.1, persist_every=15)
    for seconds in (1.0, 0.5, 0.5):
        s.round_done(seconds)
    assert not s.degraded and "replication_degraded" not in [e for e, _ in events]


def test_one_slow_round_among_fast_ones_degrades_nothing() -> None:
    s, _, events = stride(period=0.1, persist_every=10)
    for seconds in (0.05, 3.0, 0.05, 0.05, 3.0, 0.05):  # 0.5 and 30 versions
        s.round_done(seconds)
    assert not s.degraded and "replication_degraded" not in [e for e, _ in events]


def test_without_a_persistent_interval_replication_never_stops() -> None:
    s, _, _ = stride(persist_every=None)
    for _ in range(10):
        s.round_done(100.0)
    assert not s.degraded and s.value == MAX_STRIDE


@settings(max_examples=60, deadline=None)
@given(rounds=st.lists(st.floats(0.001, 20.0), min_size=1, max_size=40), every=st.integers(1, 50))
def test_the_stride_stays_a_power_of_two_within_bounds_and_degradation_follows_the_median(
        rounds: list[float], every: int) -> None:
    s, _, events = stride(period=0.1, persist_every=every)
    ages: list[float] = []
    for seconds in rounds:
        was = s.degraded
        ages.append(s.ages(seconds)[0])
        s.round_done(seconds)
        assert 1 <= s.value <= MAX_STRIDE and s.value & (s.value - 1) == 0
        if not was and s.degraded:  # only after DEGRADE_ROUNDS rounds whose median is older than the checkpoint
            (fields,) = [f for e, f in events if e == "replication_degraded"][-1:]
            tier = s.persistent_age()  # measured from the seals (whole intervals), else half the interval
            assert tier is not None and tier >= every / 2
            assert len(ages) >= DEGRADE_ROUNDS and sorted(ages[-DEGRADE_ROUNDS:])[DEGRADE_ROUNDS // 2] > tier
            # journaled to two decimals: an age just over the tier's may read equal to it
            assert fields["replica_age_versions"] >= fields["persistent_age_versions"] == round(tier, 2)
        if was and not s.degraded:
            assert ages[-1] <= RESUME_SHARE * s.persistent_age()  # type: ignore[operator]
            ages.clear()
    kinds = [e for e, _ in events if e != "replication_stride"]
    assert all(a != b for a, b in zip(kinds, kinds[1:]))  # degraded and resumed alternate


def test_time_away_from_this_strategy_is_not_taken_for_the_pace_of_its_versions() -> None:
    """A benchmark's other arms (or a restart) advance the step while this rank hands over nothing: a gap
    longer than the handover cadence tells nothing about seconds per version."""
    s, clock, _ = stride(period=0.1)
    clock.now += 5.0
    s.sealed(25)  # 20 versions later, after 5 s of another arm's block
    assert abs(s.period - 0.1) < 1e-9
    for v in (27, 29, 31):  # gaps of 2 after a cadence of 1: away too (replicate_every 2 has a cadence of 2)
        clock.now += 0.2
        s.sealed(v)
    assert abs(s.period - 0.1) < 1e-9


@settings(max_examples=50, deadline=None)
@given(period=st.floats(0.01, 2.0), offsets=st.lists(st.floats(0.0, 0.95), min_size=2, max_size=8))
def test_the_period_of_a_node_whose_ranks_seal_apart_is_the_period_of_each(period: float, offsets: list[float]) -> None:
    """Found in a CI flake (two ranks per node): a version's seals by the node's other ranks moved the store's
    mark, so the next version's first seal was timed from the last seal of the one before: a period short by
    the ranks' spread (2 ms for a 100 ms step), a round that fitted looked long and the stride doubled. Each
    rank seals every ``period`` seconds, rank r ``offsets[r]`` periods into it, in any order."""
    clock = Clock()
    s = Stride(lambda event, **fields: None, 0.0, clock)
    t0 = clock.now
    seals = sorted((t0 + v * period + o * period, v) for v in range(12) for o in offsets)
    for at, v in seals:
        clock.now = at
        s.sealed(v)
    assert s.period is not None and abs(s.period - period) <= 1e-9 * max(1.0, period)


def seal_for(s: Stride, clock: Clock, first: int, n: int, per: float, busy: bool) -> int:
    """Seal ``n`` versions from ``first``, ``per`` seconds apart; returns the next version."""
    for v in range(first, first + n):
        clock.now += per
        s.sealed(v, busy=busy)
    return first + n


def test_replication_that_slows_training_beyond_the_budget_stops_and_says_by_how_much() -> None:
    s, clock, events = stride(period=0.1, persist_every=50, max_slowdown=0.25)  # 5 quiet versions, 0.1 s each
    v = seal_for(s, clock, 5, 6, 0.15, busy=True)  # 50% slower while replicas go out
    s.round_done(0.3)  # a fast round by age (3 versions, far under the persistent tier's 25)
    assert s.degraded
    (why,) = [f for e, f in events if e == "replication_degraded"]
    assert why["slowdown"] == 0.5 and "slows training by 50%" in why["reason"] and "max_slowdown" in why["reason"]
    clock.now += DEGRADE_HOLD + 1
    assert s.may_start()
    v = seal_for(s, clock, v, 5, 0.105, busy=True)  # the probe: 5% slower now
    s.round_done(0.3)
    assert not s.degraded and events[-1][0] in ("replication_resumed", "replication_stride")
    assert [f for e, f in events if e == "replication_resumed"][0]["slowdown"] == 0.05


def test_within_the_budget_or_without_one_replication_goes_on() -> None:
    for budget, per in ((0.25, 0.12), (0.0, 0.3)):
        s, clock, _ = stride(period=0.1, persist_every=50, max_slowdown=budget)
        seal_for(s, clock, 5, 8, per, busy=True)
        s.round_done(0.3)
        assert not s.degraded


def test_after_long_sending_a_few_versions_are_timed_without_replica_traffic_when_there_is_a_budget() -> None:
    s, clock, _ = stride(period=0.1, persist_every=50)  # no budget: nothing to time, no version goes unreplicated
    seal_for(s, clock, 5, int(QUIET_EVERY / 0.1) + 5, 0.1, busy=True)
    s.round_done(0.05)
    assert s.may_start()
    s, clock, _ = stride(period=0.1, persist_every=50, max_slowdown=0.25)
    v = seal_for(s, clock, 5, int(QUIET_EVERY / 0.1) + 5, 0.1, busy=True)
    s.round_done(0.05)
    assert not s.may_start()  # holding off to time quiet versions
    v = seal_for(s, clock, v, QUIET_VERSIONS - 1, 0.1, busy=False)
    assert not s.may_start()
    seal_for(s, clock, v, 1, 0.1, busy=False)
    assert s.may_start()


def test_the_age_rule_waits_for_a_whole_interval_of_the_persistent_tier_measured() -> None:
    clock = Clock()
    s, events = Stride(lambda e, **f: events.append((e, f)), 0.0, clock), []  # type: ignore[has-type]
    for v in range(9):  # 9 seals of an interval of 10: the tier's lag is not known yet
        s.sealed(v, 10, persisted=0)
        clock.now += 0.1
    for _ in range(DEGRADE_ROUNDS + 2):
        s.round_done(1.5)  # 22.5 versions old: older than half the interval
    assert not s.degraded and not s.persistent_measured()
    s.sealed(9, 10, persisted=0)
    s.round_done(1.5)
    assert s.persistent_measured() and s.degraded


def test_while_no_persistent_checkpoint_exists_replication_never_stops() -> None:
    """The replicas are then the only copy: stopping would lose everything to a node loss (a CI run of
    link-throttle-replication, persisting every 50, restarted from scratch that way)."""
    clock, events = Clock(), []
    s = Stride(lambda event, **fields: events.append((event, fields)), 0.25, clock)
    for v in range(5):
        clock.now += 0.1
        s.sealed(v, 50, persisted=-1)
    v = seal_for(s, clock, 5, 6, 0.3, busy=True)  # three times slower while replicating
    for _ in range(DEGRADE_ROUNDS + 1):
        s.round_done(30.0)  # and replicas 450 versions old
    assert not s.degraded and "replication_degraded" not in [e for e, _ in events]
    s.sealed(v, 50, persisted=10)  # now the persistent tier holds a copy
    s.round_done(30.0)
    assert s.degraded


def _sealed_with_commit_lag(s: Stride, clock: Clock, every: int, lag: int, versions: int, period: float = 0.1) -> None:
    """Seal versions 0.. with the newest committed persistent checkpoint trailing: the persist of version k*every
    commits ``lag`` versions later."""
    for v in range(versions):
        committed = every * ((v - lag) // every) if v >= lag else -1
        s.sealed(v, every, persisted=committed)
        clock.now += period


@settings(max_examples=60, deadline=None)
@given(every=st.integers(1, 30), lag=st.integers(0, 12), cycles=st.integers(1, 4))
def test_the_persistent_tiers_age_is_measured_with_its_writes_lag(every: int, lag: int, cycles: int) -> None:
    clock = Clock()
    s = Stride(lambda *a, **k: None, 0.0, clock)
    _sealed_with_commit_lag(s, clock, every, lag, lag + cycles * every)
    age = s.persistent_age()
    assert age is not None and age >= every / 2
    assert abs(age - (every / 2 + lag)) < 1e-9  # whole intervals: the sawtooth's mean, plus the lag


def test_a_replica_younger_than_the_lagging_persistent_tier_keeps_replicating_like_with_like() -> None:
    """Rounds of 0.75 s make the newest replica 11.25 versions old: older than half the interval (5), so the
    rule used to stop replication, but the persistent checkpoints commit 7 versions after their step, so the
    persistent tier is 12 versions old at a failure and the replica is the fresher copy."""
    clock = Clock()
    s, events = Stride(lambda e, **f: events.append((e, f)), 0.0, clock), []  # type: ignore[has-type]
    _sealed_with_commit_lag(s, clock, 10, 7, 40)
    assert abs(s.persistent_age() - 12.0) < 1e-9  # type: ignore[operator]
    for _ in range(DEGRADE_ROUNDS + 1):
        s.round_done(0.75)
    assert not s.degraded and "replication_degraded" not in [e for e, _ in events]
    for _ in range(DEGRADE_ROUNDS):
        s.round_done(1.0)  # 15 versions: older than 12 now
    assert s.degraded
    (degraded,) = [f for e, f in events if e == "replication_degraded"]
    assert degraded["persistent_age_versions"] == 12.0 and "lag included" in degraded["reason"]
