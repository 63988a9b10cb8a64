"""What a node store answers for a restore: which complete copies of a rank it holds (``query``), here and on
every node that answers (``locate``), the bytes of one (``fetch``), and one brought into the asking worker's own
slot file (``pull``). Each answer takes the store (:class:`StoreView`) and the request's header. Torch-free."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from baft.snapshot.slotfile import copies, read_complete, write_slot

Reply = tuple[dict[str, Any], bytes]


class StoreView(Protocol):
    """What answering a restore needs of the store (:class:`baft.store.server.Store`): its place, a request's rank and
    version checked (``checked``: ``ValueError`` if not a rank of the job), where a rank's slot file is, a peer's
    answer, its journal."""

    @property
    def root(self) -> Path: ...
    @property
    def node(self) -> int: ...
    @property
    def addresses(self) -> list[str]: ...
    def checked(self, rank: Any, version: Any) -> tuple[int, int]: ...
    def own_slot_path(self, rank: Any, version: Any, path: Any) -> Path: ...
    def request(self, address: str, header: dict[str, Any], timeout: float = 30.0) -> Reply: ...
    def log(self, event: str, **fields: Any) -> None: ...


def query(store: StoreView, header: dict[str, Any]) -> Reply:
    """The complete copies of a rank this node holds."""
    store.checked(header.get("rank"), 0)
    return {"copies": [[v, str(p)] for v, p in copies(store.root, header["rank"])]}, b""


def fetch(store: StoreView, header: dict[str, Any]) -> Reply:
    """The bytes of one complete copy held here."""
    store.checked(header.get("rank"), header.get("version"))
    for v, p in copies(store.root, header["rank"]):
        if v == header["version"]:
            data = read_complete(p, v)
            if data is not None:
                return {"ok": True}, data
    return {"ok": False}, b""


def locate(store: StoreView, header: dict[str, Any]) -> Reply:
    """The complete copies of a rank on every node that answers."""
    store.checked(header.get("rank"), 0)
    found: list[list[Any]] = [[v, store.node] for v, _ in copies(store.root, header["rank"])]
    for i, addr in enumerate(store.addresses):
        if i == store.node:
            continue
        try:
            reply, _ = store.request(addr, {"op": "query", "rank": header["rank"]}, timeout=5)
            found += [[v, i] for v, _ in reply["copies"]]
        except OSError:
            continue  # that node is down: its copies are gone
    return {"copies": found}, b""


def pull(store: StoreView, header: dict[str, Any]) -> Reply:
    """Bring a copy (from this node or a peer) into the rank's slot file."""
    rank, version = store.checked(header.get("rank"), header.get("version"))
    dest = store.own_slot_path(rank, version, header.get("dest"))
    order = [store.node] + [i for i in range(len(store.addresses)) if i != store.node]
    for i in order:
        try:
            reply, data = (fetch(store, {"rank": rank, "version": version}) if i == store.node
                           else store.request(store.addresses[i], {"op": "fetch", "rank": rank, "version": version}))
        except OSError:
            continue
        if reply.get("ok"):
            t = time.perf_counter()
            write_slot(dest, data)
            store.log("pulled", rank=rank, version=version, source=f"node{i}", bytes=len(data),
                     seconds=time.perf_counter() - t)
            return {"ok": True, "source": i}, b""
    return {"ok": False}, b""


#: The ops these answer, by name.
ANSWERS: dict[str, Callable[[StoreView, dict[str, Any]], Reply]] = {"query": query, "fetch": fetch, "locate": locate, "pull": pull}
