"""Which versions a node's store replicates: a stride that follows the link, and when to stop altogether.

A round replicates one version for every rank of the node. When a round takes
longer than the versions it covers, the stride doubles (powers of two keep
every node's choice of versions aligned); it halves when rounds fit easily
again. When the link is so slow that the newest peer copy would on average be
older than the newest persistent checkpoint (a replica lands ``covered``
versions after it was sealed and at best the rounds land one every ``max(1,
covered)``, so at a failure the newest replica is about ``covered + max(1,
covered) / 2`` versions old, against half the persistent interval
for the persistent tier), replicating costs the link and the cores for
nothing: the store stops (``replication_degraded``, with the numbers that
decided it) and recovery falls to the persistent tier. After ``DEGRADE_HOLD``
seconds it probes with one round (then after twice as long, up to
``MAX_HOLD``, while the link stays slow) and resumes when the replicas' age would be
at most ``RESUME_SHARE`` of the persistent tier's (``replication_resumed``).
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
#: Rounds whose median decides a degradation (one slow round on busy cores decides nothing).
DEGRADE_ROUNDS = 3
#: Seconds until the first probe once replication is degraded; each probe that finds the link still too
#: slow doubles the wait, up to ``MAX_HOLD`` (a probe round costs the link what a round costs).
DEGRADE_HOLD = 30.0
MAX_HOLD = 240.0
#: A probe resumes replication when the replicas' age would be at most this share of the persistent tier's.
RESUME_SHARE = 0.5


class Stride:
    """One store's choice of versions. ``log(event, **fields)`` journals the changes."""

    def __init__(self, log: Callable[..., None], clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.clock = clock
        self.value = 1
        """Replicate only versions that are multiples of this (a power of two)."""
        self.period: float | None = None
        """Seconds per version, from the sealed notifications (smoothed)."""
        self.persist_every: int | None = None
        """The persistent tier's interval in versions, as the ranks last reported it (None: unknown)."""
        self.degraded = False
        """Whether replication is stopped because the persistent tier is fresher."""
        self._last_seal: tuple[int, float] | None = None
        self._cadence: int | None = None
        self._ages: deque[float] = deque(maxlen=DEGRADE_ROUNDS)
        self._probe_at = 0.0
        self.hold = DEGRADE_HOLD
        """Seconds until the next probe while degraded."""

    def sealed(self, version: int, persist_every: int | None = None) -> None:
        """A local rank sealed ``version`` (and persists every ``persist_every`` versions)."""
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
        if self._last_seal is None or version >= self._last_seal[0]:
            self._last_seal = (version, now)
        if persist_every is not None:
            self.persist_every = persist_every

    def wants(self, version: int) -> bool:
        return version % self.value == 0

    def may_start(self) -> bool:
        """Whether a round may start now: always, except while degraded between probes."""
        return not self.degraded or self.clock() >= self._probe_at

    def ages(self, seconds: float) -> tuple[float, float | None]:
        """Versions' age at a failure of the newest peer copy (rounds of ``seconds``, back to back at best:
        one lands every ``max(1, covered)`` versions) and of the newest persistent checkpoint (None: the
        persistent interval is unknown)."""
        covered = seconds / self.period if self.period else 0.0  # versions sealed while a round travelled
        every = self.persist_every
        return covered + max(1.0, covered) / 2, (every / 2 if every is not None else None)

    def round_done(self, seconds: float) -> None:
        """A round took ``seconds``: degrade, resume or change the stride."""
        if self.period is None or self.period <= 0:
            return
        replica, persistent = self.ages(seconds)
        self._ages.append(replica)
        if self.degraded:
            if persistent is not None and replica > RESUME_SHARE * persistent:
                self.hold = min(2 * self.hold, MAX_HOLD)
                self._probe_at = self.clock() + self.hold
                return
            self.degraded = False
            self._ages.clear()
            self.log("replication_resumed", round_seconds=round(seconds, 4), replica_age_versions=round(replica, 2),
                     persistent_age_versions=persistent, persist_every=self.persist_every,
                     reason=f"a probe round makes the newest peer copy {replica:.1f} versions old at a failure, at "
                     f"most {RESUME_SHARE:g} of the persistent tier's {persistent:g}")
        elif (persistent is not None and len(self._ages) == DEGRADE_ROUNDS
              and statistics.median(self._ages) > persistent):
            self.degraded = True
            self.hold = DEGRADE_HOLD
            self._probe_at = self.clock() + self.hold
            age = statistics.median(self._ages)
            self.log("replication_degraded", round_seconds=round(seconds, 4), version_seconds=round(self.period, 4),
                     replica_age_versions=round(age, 2), persistent_age_versions=persistent,
                     persist_every=self.persist_every, stride=self.value, probe_seconds=self.hold,
                     reason=f"the link makes the newest peer copy {age:.1f} versions old at a failure (median of "
                     f"the last {DEGRADE_ROUNDS} rounds), older than the persistent tier's {persistent:g} (it saves "
                     f"every {self.persist_every}): replication stops and recovery is left to the persistent tier")
            return
        if seconds > self.value * self.period and self.value < MAX_STRIDE:
            self._set(self.value * 2, "a round took longer than its versions", seconds)
        elif self.value > 1 and seconds < 0.3 * (self.value // 2) * self.period:
            self._set(self.value // 2, "rounds fit again", seconds)

    def _set(self, value: int, reason: str, seconds: float) -> None:
        self.value = value
        fields: dict[str, Any] = {"stride": value, "reason": reason, "round_seconds": round(seconds, 4),
                                  "version_seconds": round(self.period, 4) if self.period else None}
        self.log("replication_stride", **fields)
