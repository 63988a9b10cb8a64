"""Clock skew: one rank's (or one node's) clocks run ahead of or behind the others.

A training job reads wall-clock time for timeouts, heartbeats, checkpoint
names and lease expiry; a host whose clock has drifted breaks those in ways
a healthy cluster never shows. On a cluster this is Chaos Mesh's TimeChaos,
which shifts what ``clock_gettime`` returns inside the chosen containers
(see :mod:`injectors.chaosmesh.manifests`).

There is no honest local injector: a per-process wall-clock offset needs
``clock_gettime`` intercepted in the process (what Chaos Mesh's daemon does
through ptrace and the vDSO); Linux time namespaces offset only
``CLOCK_MONOTONIC`` and ``CLOCK_BOOTTIME``, and only for processes started
inside them; ``date -s`` moves the whole host's clock, every rank at once. So
:meth:`ClockSkewConfig.preflight` refuses, naming the cluster path.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from injectors.base import RunShape
from injectors.chaosmesh.formats import parse_go_duration
from injectors.chaosmesh.schema import CLOCK_IDS
from injectors.errors import FaultConfigError, HostUnsupported
from injectors.trigger import WindowFault
from injectors.worker import WindowInjector

LOCAL_UNSUPPORTED = (
    "clock_skew runs only on a cluster: baft run SCENARIO --target k8s (Chaos Mesh TimeChaos). This host "
    "cannot offset one process's wall clock: Linux time namespaces shift only CLOCK_MONOTONIC/CLOCK_BOOTTIME "
    "and only for new children, and date -s moves the whole host's clock")
"""Why a local run refuses clock_skew, and what to run instead."""


@dataclass(kw_only=True, slots=True)
class ClockSkewConfig(WindowFault):
    """Shift the clocks of one rank's pod (or one node's pods) by ``offset`` for the window."""

    kind: ClassVar[str] = "clock_skew"
    rank: int | None = None
    """Global rank whose pod's clocks are shifted (every rank of that pod); exactly one of rank, node."""
    node: int | None = None
    """Scenario node whose pods' clocks are shifted; exactly one of rank, node."""
    offset: str
    """How far the clocks are moved, a signed Go duration: ``-10m`` (behind), ``5s``, ``1h30m``; not zero."""
    clock_ids: list[str] = field(default_factory=lambda: ["CLOCK_REALTIME"])
    """Which clocks move (TimeChaos ``clockIds``): any of CLOCK_REALTIME, CLOCK_MONOTONIC,
    CLOCK_PROCESS_CPUTIME_ID, CLOCK_THREAD_CPUTIME_ID, CLOCK_MONOTONIC_RAW, CLOCK_REALTIME_COARSE,
    CLOCK_MONOTONIC_COARSE, CLOCK_BOOTTIME, CLOCK_REALTIME_ALARM, CLOCK_BOOTTIME_ALARM."""

    def check(self, run: RunShape) -> None:
        WindowFault.check(self, run)
        self.check_fields()

    def check_fields(self) -> None:
        """The checks that need no run shape (the cluster mapping calls them too)."""
        if (self.rank is None) == (self.node is None):
            raise FaultConfigError("rank", "exactly one of rank and node",
                                   "<both>" if self.rank is not None else "<neither>")
        try:
            seconds = parse_go_duration(self.offset)
        except ValueError:
            seconds = None
        if not seconds:
            raise FaultConfigError("offset", "a nonzero signed Go duration such as -10m, 5s or 1h30m", self.offset)
        ids = self.clock_ids
        if not isinstance(ids, list) or not ids or len(set(ids)) != len(ids) \
                or not all(isinstance(c, str) and c in CLOCK_IDS for c in ids):
            raise FaultConfigError("clock_ids", "a non-empty list of distinct clock ids among "
                                   + ", ".join(CLOCK_IDS), ids)

    def preflight(self) -> None:
        raise HostUnsupported(LOCAL_UNSUPPORTED)

    def targets(self, rank: int, node: int, local_rank: int) -> bool:
        return rank == self.rank or node == self.node


class ClockSkewInjector(WindowInjector):
    """Refuses: a local run never gets here (preflight refuses first), and must not pretend to skew."""

    def begin(self) -> None:
        raise HostUnsupported(LOCAL_UNSUPPORTED)
