"""The per-node checkpoint store: replicates snapshots to peer nodes and serves restores.

One store process runs on each node, started next to the node's torchrun
agent (``python -m baft.store ...``) and outliving its workers. The workers'
snapshot slots are files in the node's shared-memory directory; the store

* learns from each worker when a version is sealed (``sealed``) and copies
  that slot to the stores of the next ``replicas`` nodes in a ring (``put``),
  under a rate limit, newest version first: when a rank seals faster than the
  link carries its replicas, older pending versions are dropped and the drop
  is journaled (the replication frequency degrades instead of the training);
* sends each replica in 256 KiB pieces, each only while no worker of the node
  has pipeline traffic in flight (``baft.traffic``; a piece waits at most 20 ms,
  so replication always progresses);
* keeps the replicas it receives as slot files of the same format
  (``replica-rank-R.slotK``), double-buffered like the originals;
* answers restores: ``locate`` lists every complete copy of a rank's state on
  every node, ``pull`` brings a copy into the asking worker's own slot file.

Wire format: a 4-byte big-endian length, a JSON header, then ``nbytes`` of
payload when the header says so. Everything is on the node's loopback or
between network namespaces; nothing here is authenticated.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .snapshot import COMPLETE, HEADER, MAGIC
from .traffic import TrafficFlags

_FIELDS = struct.Struct("<6q")
#: Replicas are sent in pieces of this size, each gated on training traffic.
PIECE = 256 << 10
#: The longest a piece waits for the node's pipeline traffic to pause (progress is guaranteed).
MAX_DEFER = 0.02
DEFER_POLL = 0.001
TRAFFIC_FILE = "traffic"


# -- wire ---------------------------------------------------------------------------------------
def send(sock: socket.socket, header: dict[str, Any], payload: bytes | memoryview = b"") -> None:
    if payload:
        header = {**header, "nbytes": len(payload)}
    raw = json.dumps(header).encode()
    sock.sendall(struct.pack(">I", len(raw)) + raw)
    if payload:
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("store connection closed")
        got += k
    return bytes(buf)


def recv(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    header = json.loads(_recv_exact(sock, n))
    payload = _recv_exact(sock, header["nbytes"]) if header.get("nbytes") else b""
    return header, payload


def request(address: str, header: dict[str, Any], payload: bytes = b"", timeout: float = 30.0) -> tuple[dict[str, Any], bytes]:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        send(s, header, payload)
        return recv(s)


# -- slot files -----------------------------------------------------------------------------------
def slot_header(path: Path) -> tuple[int, int, int] | None:
    """(state, version, data_len) of a slot file, or None if it is not one."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_FIELDS.size)
    except OSError:
        return None
    if len(raw) < _FIELDS.size:
        return None
    magic, state, version, data_len, _meta_len, _cap = _FIELDS.unpack(raw)
    return (state, version, data_len) if magic == MAGIC else None


def read_complete(path: Path, version: int) -> bytes | None:
    """The used bytes of a slot file (header, data, metadata) if it holds complete
    ``version`` both before and after reading; None if not (or rewritten meanwhile)."""
    before = slot_header(path)
    if before is None or before[0] != COMPLETE or before[1] != version:
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(_FIELDS.size)
            _, _, _, data_len, meta_len, _ = _FIELDS.unpack(head)
            f.seek(0)
            data = f.read(HEADER + data_len + meta_len)
    except OSError:
        return None
    after = slot_header(path)
    if after != before or len(data) < HEADER:
        return None  # rewritten while we read: torn
    return data


def write_slot(path: Path, data: bytes) -> None:
    """Atomically place a slot's used bytes at ``path``, padded to the slot's full size."""
    _, _, _, data_len, _, capacity = _FIELDS.unpack(data[: _FIELDS.size])
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.truncate(HEADER + data_len + capacity)
    os.replace(tmp, path)


def own_slot(root: Path, rank: int, k: int) -> Path:
    return root / f"rank-{rank:05d}.slot{k}"


def replica_slot(root: Path, rank: int, k: int) -> Path:
    return root / f"replica-rank-{rank:05d}.slot{k}"


def copies(root: Path, rank: int) -> list[tuple[int, Path]]:
    """Complete copies of ``rank``'s state on this node: (version, file)."""
    out = []
    for k in (0, 1):
        for p in (own_slot(root, rank, k), replica_slot(root, rank, k)):
            h = slot_header(p)
            if h is not None and h[0] == COMPLETE:
                out.append((h[1], p))
    return out


# -- the server ---------------------------------------------------------------------------------------
class Store:
    """State and logic of one node's store (the TCP server calls :meth:`handle`)."""

    def __init__(self, root: Path, node: int, addresses: list[str], replicas: int, rate: float, journal: Path | None,
                 yield_to_training: bool = True) -> None:
        self.root, self.node, self.addresses = root, node, addresses
        self.replicas = min(replicas, len(addresses) - 1)
        self.rate = rate
        self.root.mkdir(parents=True, exist_ok=True)
        self.flags = TrafficFlags(self.root / TRAFFIC_FILE) if yield_to_training else None
        self._journal = open(journal, "a", buffering=1) if journal else None
        self._jlock = threading.Lock()
        self._cond = threading.Condition()
        self._pending: dict[int, tuple[int, str]] = {}  # rank -> newest sealed (version, file)
        self._closed = False
        threading.Thread(target=self._replicate_loop, name="store-replicate", daemon=True).start()

    def log(self, event: str, **fields: Any) -> None:
        if self._journal is None:
            return
        line = json.dumps({"t": time.time(), "event": event, "node": f"node{self.node}", **fields}) + "\n"
        with self._jlock:
            self._journal.write(line)

    @property
    def targets(self) -> list[str]:
        n = len(self.addresses)
        return [self.addresses[(self.node + i) % n] for i in range(1, self.replicas + 1)]

    def handle(self, header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
        op = header.get("op")
        if op == "ping":
            return {"ok": True, "node": self.node}, b""
        if op == "sealed":
            with self._cond:
                old = self._pending.get(header["rank"])
                if old is not None:
                    self.log("replication_skipped", rank=header["rank"], version=old[0],
                             reason=f"version {header['version']} sealed before it was sent")
                self._pending[header["rank"]] = (header["version"], header["file"])
                self._cond.notify()
            return {"ok": True}, b""
        if op == "put":
            k = header["version"] % 2
            write_slot(replica_slot(self.root, header["rank"], k), payload)
            return {"ok": True}, b""
        if op == "query":
            return {"copies": [[v, str(p)] for v, p in copies(self.root, header["rank"])]}, b""
        if op == "fetch":
            for v, p in copies(self.root, header["rank"]):
                if v == header["version"]:
                    data = read_complete(p, v)
                    if data is not None:
                        return {"ok": True}, data
            return {"ok": False}, b""
        if op == "locate":
            found: list[list[Any]] = [[v, self.node] for v, _ in copies(self.root, header["rank"])]
            for i, addr in enumerate(self.addresses):
                if i == self.node:
                    continue
                try:
                    reply, _ = request(addr, {"op": "query", "rank": header["rank"]}, timeout=5)
                    found += [[v, i] for v, _ in reply["copies"]]
                except OSError:
                    continue  # that node is down: its copies are gone
            return {"copies": found}, b""
        if op == "pull":
            rank, version, dest = header["rank"], header["version"], Path(header["dest"])
            order = [self.node] + [i for i in range(len(self.addresses)) if i != self.node]
            for i in order:
                try:
                    reply, data = (self.handle({"op": "fetch", "rank": rank, "version": version}, b"") if i == self.node
                                   else request(self.addresses[i], {"op": "fetch", "rank": rank, "version": version}))
                except OSError:
                    continue
                if reply.get("ok"):
                    t = time.perf_counter()
                    write_slot(dest, data)
                    self.log("pulled", rank=rank, version=version, source=f"node{i}", bytes=len(data),
                             seconds=time.perf_counter() - t)
                    return {"ok": True, "source": i}, b""
            return {"ok": False}, b""
        return {"ok": False, "error": f"unknown op {op!r}"}, b""

    def _replicate_loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._pending:
                    self._cond.wait()
                if self._closed:
                    return
                rank = next(iter(self._pending))
                version, file = self._pending.pop(rank)
            data = read_complete(Path(file), version)
            if data is None:
                self.log("replication_skipped", rank=rank, version=version, reason="slot rewritten before it was read")
                continue
            for target in self.targets:
                t = time.perf_counter()
                try:
                    deferred = self._send_put(target, rank, version, data)
                except OSError as e:
                    self.log("replication_failed", rank=rank, version=version, peer=target, reason=str(e))
                    continue
                self.log("replicated", rank=rank, version=version, peer=target, bytes=len(data),
                         seconds=time.perf_counter() - t, deferred_seconds=deferred)

    def _send_put(self, target: str, rank: int, version: int, data: bytes) -> float:
        """Send a replica in pieces: each piece waits (up to ``MAX_DEFER``) until no local rank
        has pipeline traffic in flight, and the pieces keep the average under ``rate``.
        Returns the seconds spent deferring to training traffic."""
        host, port = target.rsplit(":", 1)
        deferred = 0.0
        view = memoryview(data)
        with socket.create_connection((host, int(port)), timeout=30) as s:
            raw = json.dumps({"op": "put", "rank": rank, "version": version, "nbytes": len(data)}).encode()
            s.sendall(struct.pack(">I", len(raw)) + raw)
            start = time.perf_counter()
            for off in range(0, len(data), PIECE):
                if self.flags is not None:
                    t = time.perf_counter()
                    while not self.flags.idle() and time.perf_counter() - t < MAX_DEFER:
                        time.sleep(DEFER_POLL)
                    deferred += time.perf_counter() - t
                s.sendall(view[off : off + PIECE])
                if self.rate > 0:
                    ahead = (off + PIECE) / self.rate - (time.perf_counter() - start)
                    if ahead > 0:
                        time.sleep(ahead)
            recv(s)
        return deferred

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        store: Store = self.server.store  # type: ignore[attr-defined]
        try:
            while True:
                header, payload = recv(self.request)
                reply, data = store.handle(header, payload)
                if header.get("op") != "sealed":  # notifications get no answer
                    send(self.request, reply, data)
        except (ConnectionError, OSError, json.JSONDecodeError):
            return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


# -- the worker's side ------------------------------------------------------------------------------
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m baft.store", description="per-node BAFT checkpoint store")
    p.add_argument("--root", type=Path, required=True, help="the node's shared-memory directory")
    p.add_argument("--node", type=int, required=True, help="this node's index")
    p.add_argument("--addresses", required=True, help="comma-separated host:port of every node's store, by node index")
    p.add_argument("--replicas", type=int, default=1, help="peer nodes that hold a replica of each snapshot")
    p.add_argument("--rate", type=float, default=0.0, help="replication rate limit in bytes/s (0: none)")
    p.add_argument("--journal", type=Path, help="JSONL file for the store's events")
    p.add_argument("--no-yield", action="store_true", help="send replicas even while training traffic is in flight")
    a = p.parse_args(argv)
    addresses = a.addresses.split(",")
    store = Store(a.root, a.node, addresses, a.replicas, a.rate, a.journal, yield_to_training=not a.no_yield)
    host, port = addresses[a.node].rsplit(":", 1)
    server = _Server((host, int(port)), _Handler)
    server.store = store  # type: ignore[attr-defined]
    (a.root / "store.pid").write_text(str(os.getpid()))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    store.log("store_start", pid=os.getpid(), address=addresses[a.node])
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        store.close()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
