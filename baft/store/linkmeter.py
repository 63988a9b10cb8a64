"""How fast a node's store may send replica data: the link's capacity, learnt from the sends themselves.

Paced, replicas go in small pieces through a small socket buffer: a piece's send
that blocks measured the link (a piece that cannot leave waits for the wire);
one that returns at once measured nothing. When most recent pieces blocked, the
link is the bottleneck and, with ``yield``, the store paces itself to a share of
what the link was measured to carry, leaving the rest to training. Unpaced, a
replica goes whole (:mod:`baft.store.peerlink`) and only its delivery, from the first
byte to the peer's answer, is timed: when the median of the last few falls below
:data:`FAST_RATE` the link is taken for the bottleneck as well. Torch-free (the
store imports it).
"""
from __future__ import annotations

import collections
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

#: With ``yield``, replication takes at most this share of the link's measured capacity.
LINK_SHARE = float(os.environ.get("BAFT_LINK_SHARE", "0.5"))
#: The link is taken for the bottleneck when at least this share of recent pieces blocked
#: (measured: 0.33-0.56 on a 50 Mbit/s tbf link, 0-0.13 on loopback with busy cores).
LINK_BOUND = 0.3
#: Seconds the pacing holds after the link last looked like the bottleneck.
PACE_HOLD = 10.0
#: A send that blocks at least this long measured the link, not the kernel's buffer.
BLOCKED_SEND = 0.002
#: Pieces remembered (capacity is the median rate of the blocked ones among them).
WINDOW = 32
#: Bytes/s below which whole replicas, delivered unpaced, say the link is the bottleneck (160 Mbit/s: loopback and
#: a data-centre link deliver a 1.26 MB replica at 100+ MB/s even to a receiver in the idle class on busy cores,
#: measured here; a 50 Mbit/s link at 6).
FAST_RATE = 20e6
#: Whole replicas whose median delivery rate decides.
WHOLE = 4


@dataclass(frozen=True, slots=True)
class PaceChange:
    """The link started or stopped looking like the bottleneck (what the store journals)."""

    limited_by_link: bool
    link_bytes_per_s: float
    pace_bytes_per_s: float


class LinkMeter:
    """The link as one store's sends see it. ``rate``: the configured limit in bytes/s (0: none);
    ``yielding``: pace to ``share`` of the measured capacity once the link is the bottleneck."""

    def __init__(self, rate: float, yielding: bool, share: float = LINK_SHARE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.yielding = yielding
        self.share = share
        self.clock = clock
        self.capacity: float | None = None
        """Estimate of the link's bytes/s, from piece sends that had to wait for the link."""
        self.limited = False
        """Whether the link looked like the bottleneck lately (the pace then holds for ``PACE_HOLD``)."""
        self._rates: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self._blocked: collections.deque[bool] = collections.deque(maxlen=WINDOW)
        self._whole: collections.deque[float] = collections.deque(maxlen=WHOLE)
        self._limited_until = 0.0

    @property
    def probed(self) -> bool:
        """Whether enough pieces were measured to tell a slow link from a fast one."""
        return len(self._blocked) >= WINDOW // 2

    def paced(self) -> bool:
        """Whether replicas go paced, in pieces: with a configured rate, before the link was probed, and
        while it looks like the bottleneck; else whole."""
        return self.rate > 0 or not self.probed or self.limited or self.clock() < self._limited_until

    def pace(self) -> float:
        """Bytes/s to send at: the configured rate, and with ``yield``, once the link is found to be
        the bottleneck, at most ``share`` of its measured capacity (0: unlimited)."""
        limits = [self.rate] if self.rate > 0 else []
        if self.yielding and self.limited and self.capacity is not None and self.share > 0:
            limits.append(self.share * self.capacity)
        return min(limits, default=0.0)

    def blocked_share(self) -> float:
        """The share of recent pieces whose send blocked."""
        return sum(self._blocked) / max(1, len(self._blocked))

    def measure(self, nbytes: int, seconds: float) -> PaceChange | None:
        """Learn from one piece's send: a slow link blocks (nearly) every piece at its rate; a
        receiver that was merely descheduled on busy cores blocks some pieces, not most.
        Returns the change when the link starts or stops looking like the bottleneck."""
        blocked = seconds >= BLOCKED_SEND
        self._blocked.append(blocked)
        if blocked:
            self._rates.append(nbytes / seconds)
            self.capacity = statistics.median(self._rates)
        now = self.clock()
        if len(self._blocked) >= WINDOW // 2 and self.blocked_share() >= LINK_BOUND:
            # Paced sends stop blocking, so once the link is found slow the pacing holds for a
            # while before the store tries full speed again (and re-detects a link still slow).
            self._limited_until = now + PACE_HOLD
        return self._change(now)

    def measure_whole(self, nbytes: int, seconds: float) -> PaceChange | None:
        """Learn from one replica sent whole: the time from its first byte to the peer's answer. Returns the
        change when the link starts looking like the bottleneck."""
        self._whole.append(nbytes / max(seconds, 1e-9))
        now = self.clock()
        if len(self._whole) == WHOLE and statistics.median(self._whole) < FAST_RATE:
            self.capacity = statistics.median(self._whole)
            self._limited_until = now + PACE_HOLD
            self._whole.clear()
            self._blocked.clear()  # paced pieces measure it afresh
        return self._change(now)

    def _change(self, now: float) -> PaceChange | None:
        limited = now < self._limited_until
        if limited == self.limited:
            return None
        self.limited = limited
        if not limited:
            self._whole.clear()
        return PaceChange(limited, self.capacity or 0.0, self.pace())
