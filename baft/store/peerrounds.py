"""Which versions of its peers' rounds a node must keep its own ranks' copies of.

After a peer node is lost, its ranks restore from their replicas on this node, at a version every rank of
the job must have: this node's ranks need their own copies of it too. A peer rank's replicas land here one
round after another; the one a restore can use is the newest that landed whole or, once that one's successor
has begun to arrive, still that one (the successor may never land). So for each peer rank this node needs
the version arriving now and the newest that landed. Versions are job-wide step numbers: a restore at
version v abandons every newer one (:meth:`discard`).
"""
from __future__ import annotations


class PeerRounds:
    """Per peer rank, the version arriving and the newest that landed. Not thread-safe: the store calls it
    under its lock."""

    def __init__(self) -> None:
        self._arriving: dict[int, int] = {}
        self._landed: dict[int, int] = {}

    def arriving(self, rank: int, version: int) -> bool:
        """A replica of peer rank ``rank`` at ``version`` begins to arrive; whether that version is new here
        (no peer rank's version was it)."""
        new = version not in self.needed()
        self._arriving[rank] = version
        return new

    def landed(self, rank: int, version: int) -> None:
        """That replica landed whole."""
        self._landed[rank] = max(version, self._landed.get(rank, version))

    def needed(self) -> set[int]:
        """The versions this node's ranks must keep a copy of."""
        return set(self._arriving.values()) | set(self._landed.values())

    def discard(self, version: int) -> None:
        """The job went back to ``version``: the newer ones are an abandoned timeline's."""
        self._arriving = {r: v for r, v in self._arriving.items() if v <= version}
        self._landed = {r: v for r, v in self._landed.items() if v <= version}
