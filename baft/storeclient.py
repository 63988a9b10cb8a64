"""How a worker talks to its node's store (:mod:`baft.store`): notifications, restores, rollbacks."""
from __future__ import annotations

import socket
from pathlib import Path

from .wire import request, send


class StoreClient:
    """How a worker talks to its node's store. Notifications use one kept-open connection."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._sock: socket.socket | None = None

    def sealed(self, rank: int, version: int, file: Path) -> bool:
        """Tell the store a version is complete (fire and forget; False if the store is unreachable)."""
        for _ in range(2):
            try:
                if self._sock is None:
                    host, port = self.address.rsplit(":", 1)
                    self._sock = socket.create_connection((host, int(port)), timeout=5)
                send(self._sock, {"op": "sealed", "rank": rank, "version": version, "file": str(file)})
                return True
            except OSError:
                self.close()
        return False

    def locate(self, rank: int) -> list[tuple[int, int]]:
        """(version, node) of every complete copy of ``rank``'s state the stores hold."""
        try:
            reply, _ = request(self.address, {"op": "locate", "rank": rank})
        except OSError:
            return []
        return [(int(v), int(n)) for v, n in reply["copies"]]

    def discard(self, rank: int, version: int) -> list[int] | None:
        """After a restore at ``version``: have every node forget ``rank``'s copies newer than it; the
        versions this node dropped (None if the store is unreachable)."""
        try:
            reply, _ = request(self.address, {"op": "discard", "rank": rank, "version": version}, timeout=120)
        except OSError:
            return None
        return [int(v) for v in reply.get("dropped", [])] if reply.get("ok") else None

    def pull(self, rank: int, version: int, dest: Path) -> int | None:
        """Have the store bring ``version`` of ``rank`` into ``dest``; returns the source node."""
        try:
            reply, _ = request(self.address, {"op": "pull", "rank": rank, "version": version, "dest": str(dest)}, timeout=120)
        except OSError:
            return None
        return int(reply["source"]) if reply.get("ok") else None

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
