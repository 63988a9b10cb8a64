"""The store's scheduling group: lowered while its replicas keep up, raised when they fall behind.

With autogroups on, a node store leads a scheduling group of its own, and that
group's weight decides how it shares a busy core with the ranks' groups
(:mod:`baft.priority`). At the lowest weight (nice 19) the store runs on what
training leaves — measured on a 2-core machine (issue 33), a few points of
training's time saved — but on a machine with nothing left it falls behind,
and a replica that lands late is a node loss that loses more steps. So under
the ``adaptive`` priority the store starts at nice 0 and the
governor watches each replica: one that takes longer than ``RAISE_AT``
(three quarters of a version: before a round outlasts its version and the
stride doubles) between its seal and its landing here or at the peer (waiting for the
node's training traffic to pause left out: that wait is by design), a round
still unsent that long when a rank seals the next version (a store starved of
CPU would never see its late replicas land), or a version the store could not
take before its slot was reused, raises the group to nice 0 at once; ``calm``
replicas in a row that it sent in at most ``CALM_AT`` versions lower it to
nice 19. A raise that comes before the store sent ``calm`` replicas lowered
doubles ``calm`` (up to ``MAX_CALM``), so a machine that cannot give the store
its time keeps it raised instead of trying again and again; one after a longer
spell starts it afresh (a sporadic late replica). Every change is journaled
(``store_group``: the nice value and why). Paced replicas (the link, not the
CPU, is the bottleneck) decide nothing. Measured on two nodes of a 2-core
machine (docs/bench.md): 3-4 points of training's time saved against ``idle``,
and now and then a replica a version late (the newest peer copy 2 versions old
at worst instead of 1) — which is why ``idle``, not this, is the default.
Torch-free.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from baft.priority import GROUP_HIGH, GROUP_LOW

#: A replica later than this many versions after its seal raises the group.
RAISE_AT = 0.75
#: A replica at most this many versions after its seal counts towards lowering it.
CALM_AT = 0.5
#: Replicas in a row at most ``CALM_AT`` late before the group is lowered (first, and the most).
CALM, MAX_CALM = 32, 2048


class GroupGovernor:
    """Sets its process's group weight through ``set_nice(nice) -> '' or why not`` as replicas land;
    ``log(event, **fields)`` journals each change. Thread-safe (the replicate thread and the handlers call it)."""

    def __init__(self, log: Callable[..., None], set_nice: Callable[[int], str]) -> None:
        self.log = log
        self.set_nice = set_nice
        self.lowered = False
        """Whether the group is at nice 19 now (it starts at nice 0, as :func:`baft.priority.apply` left it)."""
        self.calm_needed = CALM
        """Calm replicas in a row that lower the group next."""
        self.changes = 0
        """Changes made so far."""
        self._calm = 0
        self._spell = 0  # replicas sent since the group was lowered
        self._off = False  # the kernel refused a change: the group stays as it is
        self._lock = threading.Lock()

    def landed(self, versions: float, what: str, counts: bool = True) -> None:
        """A replica took ``versions`` (seconds over the seconds per version) from its seal to ``what`` ('sent to
        PEER', 'received from a peer', 'still unsent when the next version was sealed'); only the ones that
        ``counts`` (the replicas this store sent) make a calm run, any may raise the group."""
        with self._lock:
            if self.lowered and counts:
                self._spell += 1
            if versions > RAISE_AT:
                self._calm = 0
                if self.lowered:
                    self._change(GROUP_HIGH, f"a replica {what} {versions:.2f} versions after its seal, more than "
                                 f"{RAISE_AT:g}", late_versions=round(versions, 3))
            elif versions <= CALM_AT and counts:
                self._calm += 1
                if not self.lowered and self._calm >= self.calm_needed:
                    self._change(GROUP_LOW, f"{self._calm} replicas in a row landed at most {CALM_AT:g} versions "
                                 "after their seal")

    def missed(self, reason: str) -> None:
        """A version could not be replicated because the store was too late for it (``reason``)."""
        with self._lock:
            self._calm = 0
            if self.lowered:
                self._change(GROUP_HIGH, reason)

    def _change(self, nice: int, reason: str, **fields: Any) -> None:
        if self._off:
            return
        why = self.set_nice(nice)
        if why:
            self._off = True
            self.log("store_group", nice=None, reason=f"the group's weight could not be set to nice {nice}: {why}; "
                     "it stays as it is")
            return
        self._calm = 0
        if nice == GROUP_HIGH and self.lowered:  # a quick relapse doubles the calm run needed; after a long spell, a
            # sporadic late replica starts it afresh
            self.calm_needed = min(2 * self.calm_needed, MAX_CALM) if self._spell < self.calm_needed else CALM
        self._spell = 0
        self.lowered = nice == GROUP_LOW
        self.changes += 1
        self.log("store_group", nice=nice, reason=reason, calm_needed=self.calm_needed, **fields)
