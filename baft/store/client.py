"""How a worker talks to its node's store (:mod:`baft.store.server`): notifications, restores, rollbacks."""
from __future__ import annotations

import socket
import time
from pathlib import Path

from baft.errors import BaftConfigError
from baft.store.wire import SECRET_VARIABLE, connect, request, secret_from_env, send


class StoreClient:
    """How a worker talks to its node's store. Notifications use one kept-open connection; every
    connection proves the run's secret and has the store prove it (:mod:`baft.store.wire`)."""

    def __init__(self, address: str, secret: str | None = None) -> None:
        """``secret``: the run's store secret (None: from ``BAFT_STORE_SECRET``, which the harness sets)."""
        self.address = address
        found = secret if secret is not None else secret_from_env()
        if not found:
            raise BaftConfigError("store", f"the run's store secret in {SECRET_VARIABLE} (the stores answer only peers "
                                  "that know it)", "<not set>")
        self.secret: str = found
        self._sock: socket.socket | None = None

    def sealed(self, rank: int, version: int, file: Path, persist_every: int | None = None,
               persisted: int | None = None) -> bool:
        """Tell the store a version is complete (fire and forget; False if the store is unreachable).
        ``persist_every``, ``persisted``: the rank's persistent interval now and its newest persistent
        checkpoint (-1: none yet); the store stops replicating only when the persistent tier holds a
        copy and a replica would not be the fresher one (or costs more than its budget)."""
        for _ in range(2):
            try:
                if self._sock is None:
                    self._sock = connect(self.address, self.secret, timeout=5)
                send(self._sock, {"op": "sealed", "rank": rank, "version": version, "file": str(file),
                                  "persist_every": persist_every, "persisted": persisted,
                                  "sealed_at": time.monotonic()})  # the node's clock: the store's too
                return True
            except OSError:
                self.close()
        return False

    def locate(self, rank: int) -> list[tuple[int, int]]:
        """(version, node) of every complete copy of ``rank``'s state the stores hold."""
        try:
            reply, _ = request(self.address, {"op": "locate", "rank": rank}, secret=self.secret)
        except OSError:
            return []
        return [(int(v), int(n)) for v, n in reply["copies"]]

    def discard(self, rank: int, version: int) -> list[int] | None:
        """After a restore at ``version``: have every node forget ``rank``'s copies newer than it; the
        versions this node dropped (None if the store is unreachable)."""
        try:
            reply, _ = request(self.address, {"op": "discard", "rank": rank, "version": version}, timeout=120,
                               secret=self.secret)
        except OSError:
            return None
        return [int(v) for v in reply.get("dropped", [])] if reply.get("ok") else None

    def pull(self, rank: int, version: int, dest: Path) -> int | None:
        """Have the store bring ``version`` of ``rank`` into ``dest``; returns the source node."""
        try:
            reply, _ = request(self.address, {"op": "pull", "rank": rank, "version": version, "dest": str(dest)},
                               timeout=120, secret=self.secret)
        except OSError:
            return None
        return int(reply["source"]) if reply.get("ok") else None

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
