"""Which versions a node's store replicates: a stride that follows the link, and when to stop altogether.

A round replicates one version for every rank of the node. When a round takes
longer than the versions it covers, the stride doubles (powers of two keep
every node's choice of versions aligned); it halves when rounds fit easily
again. Replication stops altogether (``replication_degraded``, with the
numbers that decided it; recovery then falls to the persistent tier) — never
while the ranks have no persistent checkpoint yet, the replicas then being the
only copy — when either

* it slows training by more than a budget the user set (``ReplicationConfig.max_slowdown``):
  the store times the ranks' versions while it is sending and while it is not
  (every ``QUIET_EVERY`` seconds of sending it holds off for ``QUIET_VERSIONS``
  versions to measure the second), so replica traffic that delays the
  pipeline's activations on a slow link shows as slower versions; or
* the newest peer copy would on average be older than the newest persistent
  checkpoint: a replica lands ``covered`` versions after it was sealed and at
  best the rounds land one every ``max(1, covered)``, so at a failure it is
  about ``covered + max(1, covered) / 2`` versions old; the persistent tier's
  age is measured alike, writes' lag included: at each seal, how many versions
  the newest *committed* persistent checkpoint the rank reports is behind,
  averaged over whole persist intervals (plus half a version: a failure falls
  between seals); the rule waits until one whole interval has been measured.

After ``DEGRADE_HOLD`` seconds it probes with one round (then after twice as
long, up to ``MAX_HOLD``, while the link stays bad) and resumes when the probe
shows neither (``replication_resumed``): replicas at most ``RESUME_SHARE`` of
the persistent tier's age, the slowdown at most ``RESUME_SHARE`` of the budget.
Torch-free (the store imports it).
"""
from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

#: The largest stride (versions) the store degrades to.
MAX_STRIDE = 64
#: Rounds whose median age decides a degradation (one slow round on busy cores decides nothing).
DEGRADE_ROUNDS = 3
#: Seconds until the first probe once replication is degraded; each probe that finds the link still too
#: bad doubles the wait, up to ``MAX_HOLD`` (a probe round costs the link what a round costs).
DEGRADE_HOLD = 30.0
MAX_HOLD = 240.0
#: A probe resumes replication when both measures are at most this share of their limits.
RESUME_SHARE = 0.5
#: After this many seconds of sending without a version sealed in quiet, hold rounds off for
#: ``QUIET_VERSIONS`` versions to time them without replica traffic.
QUIET_EVERY = 20.0
QUIET_VERSIONS = 4
#: Seals whose distance to the newest committed persistent checkpoint the persistent tier's age averages.
PERSIST_SAMPLES = 256
#: Versions timed each way that the slowdown is the ratio of the medians of.
SAMPLES = 8
MIN_BUSY, MIN_QUIET = 4, 2


class Stride:
    """One store's choice of versions. ``log(event, **fields)`` journals the changes; ``max_slowdown``:
    the share by which replication may slow the ranks' versions (0: no limit)."""

    def __init__(self, log: Callable[..., None], max_slowdown: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.max_slowdown = max_slowdown
        self.clock = clock
        self.value = 1
        """Replicate only versions that are multiples of this (a power of two)."""
        self.period: float | None = None
        """Seconds per version, from the sealed notifications (smoothed)."""
        self.persist_every: int | None = None
        """The persistent tier's interval in versions, as the ranks last reported it (None: unknown)."""
        self.persisted: int | None = None
        """The newest persistent checkpoint the ranks reported (-1: none yet; None: never told)."""
        self.degraded = False
        """Whether replication is stopped (too slow to beat the persistent tier, or too costly)."""
        self.hold = DEGRADE_HOLD
        """Seconds until the next probe while degraded."""
        self._last_seal: tuple[int, float] | None = None
        self._cadence: int | None = None
        self._ages: deque[float] = deque(maxlen=DEGRADE_ROUNDS)
        self._behind: deque[int] = deque(maxlen=PERSIST_SAMPLES)  # version - committed persistent, per seal
        self._busy: deque[float] = deque(maxlen=SAMPLES)
        self._quiet: deque[float] = deque(maxlen=SAMPLES)
        self._quiet_at = clock()  # when a version was last timed without replica traffic
        self._quiet_left = 0
        self.probe_at = 0.0
        """When (``clock``) a degraded store probes the link with a round."""

    def sealed(self, version: int, persist_every: int | None = None, busy: bool = False,
               persisted: int | None = None) -> None:
        """A local rank sealed ``version`` (and persists every ``persist_every`` versions; its newest
        persistent checkpoint is ``persisted``, -1: none yet); ``busy``: the store was sending replica
        data since the previous version was sealed."""
        now = self.clock()
        if self._last_seal is not None and version > self._last_seal[0]:
            gap = version - self._last_seal[0]
            # Versions are handed over at a cadence (every one, or every replicate_every-th); a longer gap
            # is time the rank spent not training this strategy (a restart, another arm of a benchmark),
            # not the pace of its versions.
            self._cadence = gap if self._cadence is None else min(self._cadence, gap)
            if gap == self._cadence:
                per = (now - self._last_seal[1]) / gap
                self.period = per if self.period is None else 0.8 * self.period + 0.2 * per
                (self._busy if busy else self._quiet).append(per)
                if not busy:
                    self._quiet_at = now
            if self._quiet_left:
                self._quiet_left -= 1
        if self._last_seal is None or version > self._last_seal[0]:
            self._last_seal = (version, now)  # each version timed at its first seal (the node's ranks seal apart)
        if persist_every is not None:
            self.persist_every = persist_every
        if persisted is not None:
            self.persisted = persisted
            if persisted >= 0 and version >= persisted:
                self._behind.append(version - persisted)

    def wants(self, version: int) -> bool:
        return version % self.value == 0

    def may_start(self) -> bool:
        """Whether a round may start now: not while versions are being timed in quiet, nor while
        degraded between probes."""
        if self._quiet_left:
            return False
        return not self.degraded or self.clock() >= self.probe_at

    def ages(self, seconds: float) -> tuple[float, float | None]:
        """Versions' age at a failure of the newest peer copy (rounds of ``seconds``, back to back at best:
        one lands every ``max(1, covered)`` versions) and of the newest persistent checkpoint (None: the
        persistent interval is unknown)."""
        covered = seconds / self.period if self.period else 0.0  # versions sealed while a round travelled
        return covered + max(1.0, covered) / 2, self.persistent_age()

    def persistent_measured(self) -> bool:
        """Whether the persistent tier's age has been measured over a whole interval (until then the age rule
        waits: half the interval would leave out the writes' lag, and a replica could stop for a tier that is
        in truth older)."""
        return self.persist_every is not None and len(self._behind) >= self.persist_every

    def persistent_age(self) -> float | None:
        """The persistent tier's age at a failure in versions: measured over whole persist intervals (the
        newest committed checkpoint's distance at each seal, plus half a version), else half the interval
        (None: the interval is unknown)."""
        every = self.persist_every
        if every is None:
            return None
        whole = (len(self._behind) // every) * every
        if not whole:
            return every / 2
        recent = list(self._behind)[-whole:]
        return max(every / 2, sum(recent) / whole + 0.5)

    def slowdown(self) -> float | None:
        """How much slower the ranks' versions come while replica data is sent (None: not measured yet)."""
        if len(self._busy) < MIN_BUSY or len(self._quiet) < MIN_QUIET:
            return None
        return statistics.median(self._busy) / statistics.median(self._quiet) - 1

    def round_done(self, seconds: float) -> None:
        """A round took ``seconds``: degrade, resume or change the stride."""
        if self.period is None or self.period <= 0:
            return
        replica, persistent = self.ages(seconds)
        self._ages.append(replica)
        slow = self.slowdown()
        if self.degraded:
            self._after_probe(seconds, replica, persistent, slow)
            return
        if self.persisted is None or self.persisted < 0:
            pass  # the replicas are the only copy there is: replication never stops then
        elif self.max_slowdown > 0 and slow is not None and slow > self.max_slowdown:
            self._degrade(seconds, f"replication slows training by {slow:.0%} (a version every "
                          f"{statistics.median(self._busy):.3f} s while replicas are sent, "
                          f"{statistics.median(self._quiet):.3f} s otherwise), more than the budget of "
                          f"{self.max_slowdown:.0%} (replication.max_slowdown)", slowdown=round(slow, 3))
            return
        elif (persistent is not None and len(self._ages) == DEGRADE_ROUNDS and self.persistent_measured()
              and statistics.median(self._ages) > persistent * (1 + 1e-9)):  # older, not equal up to rounding
            age = statistics.median(self._ages)
            self._degrade(seconds, f"the link makes the newest peer copy {age:.1f} versions old at a failure (median "
                          f"of the last {DEGRADE_ROUNDS} rounds), older than the persistent tier's {persistent:.3g} (it "
                          f"saves every {self.persist_every}, its writes' lag included)", replica_age_versions=round(age, 2))
            return
        if self.max_slowdown > 0 and self.clock() - self._quiet_at > QUIET_EVERY:
            self._quiet_left = QUIET_VERSIONS  # time a few versions without replica traffic (they are not replicated)
        if seconds > self.value * self.period and self.value < MAX_STRIDE:
            self._set(self.value * 2, "a round took longer than its versions", seconds)
        elif self.value > 1 and seconds < 0.3 * (self.value // 2) * self.period:
            self._set(self.value // 2, "rounds fit again", seconds)

    def _degrade(self, seconds: float, why: str, **fields: Any) -> None:
        self.degraded = True
        self.hold = DEGRADE_HOLD
        self.probe_at = self.clock() + self.hold
        self._busy.clear()  # a probe times its own versions
        self.log("replication_degraded", round_seconds=round(seconds, 4), version_seconds=round(self.period or 0, 4),
                 persistent_age_versions=_rounded(self.ages(0)[1]), persist_every=self.persist_every, stride=self.value,
                 probe_seconds=self.hold, reason=why + ": replication stops and recovery is left to the persistent tier",
                 **fields)

    def _after_probe(self, seconds: float, replica: float, persistent: float | None, slow: float | None) -> None:
        too_old = persistent is not None and replica > RESUME_SHARE * persistent
        too_slow = self.max_slowdown > 0 and slow is not None and slow > RESUME_SHARE * self.max_slowdown
        if too_old or too_slow:
            self.hold = min(2 * self.hold, MAX_HOLD)
            self.probe_at = self.clock() + self.hold
            self._busy.clear()
            return
        self.degraded = False
        self._ages.clear()
        cost = f", training {slow:.0%} slower while it was sent" if slow is not None else ""
        self.log("replication_resumed", round_seconds=round(seconds, 4), replica_age_versions=round(replica, 2),
                 persistent_age_versions=_rounded(persistent), persist_every=self.persist_every,
                 slowdown=round(slow, 3) if slow is not None else None,
                 reason=f"a probe round makes the newest peer copy {replica:.1f} versions old at a failure "
                 f"(the persistent tier's: {_rounded(persistent)}){cost}")

    def _set(self, value: int, reason: str, seconds: float) -> None:
        self.value = value
        self.log("replication_stride", stride=value, reason=reason, round_seconds=round(seconds, 4),
                 version_seconds=round(self.period, 4) if self.period else None)


def _rounded(age: float | None) -> float | None:
    return None if age is None else round(age, 2)
