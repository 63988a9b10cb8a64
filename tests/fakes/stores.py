"""Node stores for tests: two serving in this process, sealed slots, waits (the store room's tests share them)."""
from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from baft.snapshot.slotfile import COMPLETE, copies, slot_header, slot_of
from baft.snapshot.slots import SnapshotBuffer
from baft.store.client import StoreClient
from baft.store.config import ReplicationConfig, StoreConfig
from baft.store.handler import Handler, Server
from baft.store.server import Store

from harness.run.nodeenv import free_port

SECRET = "test-secret-" + "0123456789abcdef" * 2


@contextlib.contextmanager
def stores(tmp_path: Path, replication: ReplicationConfig,
           adaptive_stride: bool = False) -> Iterator[tuple[list[str], list[Store]]]:
    """Two nodes' stores serving in this process: their addresses and the Store objects. Their stride stays 1
    unless ``adaptive_stride``: these scripts seal at no steady pace (a version sealed at once after the last
    one replicated), so a round that busy cores slow down would rightly double it and a version a test waits
    for would never be replicated (the stride's own rules are tested in tests/unit/baft/store/test_stride.py)."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    servers = []
    for node in range(2):
        store = Store(StoreConfig(root=tmp_path / f"node{node}", node=node, addresses=addresses,
                                  journal=tmp_path / f"j{node}.jsonl", replication=replication,
                                  secret=SECRET, world_size=8, max_payload=1 << 20))
        if not adaptive_stride:
            store.stride.round_done = lambda seconds: None  # type: ignore[method-assign]
        host, port = addresses[node].rsplit(":", 1)
        server = Server((host, int(port)), Handler)
        server.store = store
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append((server, store))
    try:
        yield addresses, [store for _, store in servers]
    finally:
        for server, store in servers:
            store.close()
            server.shutdown()
            server.server_close()


def seal(root: Path, rank: int, version: int, fill: int) -> Path:
    buf = SnapshotBuffer(root, rank)
    buf.allocate(64, 4096)
    slot = buf.slot_for(version)
    slot.begin(version)
    slot.data().fill_(fill)
    slot.complete(version, b"m")
    path = buf.path(slot_of(version))
    buf.close()
    return path


def replicas_of(node_root: Path, rank: int) -> set[int]:
    """The versions of ``rank`` that a node holds as complete replicas (whichever slot of its ring)."""
    return {v for v, p in copies(node_root, rank) if p.name.startswith("replica-")}


def wait_for(cond, timeout: float = 30.0) -> None:
    """Poll until ``cond()``; the deadline only catches a hang (it is generous: cores here are shared)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def journaled(journal: Path, event: str) -> list[dict]:
    """The lines of a store's journal for ``event``."""
    return [e for e in map(json.loads, journal.read_text().splitlines()) if e["event"] == event]


def sealed_on_node0(root: Path, address: str) -> tuple[Path, StoreClient, Path]:
    """Rank 3 seals version 7 on node 0; returns its slot, the client and the store's kept copy once it is there."""
    path = seal(root / "node0", rank=3, version=7, fill=5)
    client = StoreClient(address)
    assert client.sealed(3, 7, path)
    kept = root / "node0" / "kept-rank-00003.slot0"  # captured into the ring when the round opened
    wait_for(lambda: slot_header(kept) is not None and slot_header(kept)[:2] == (COMPLETE, 7))
    return path, client, kept
