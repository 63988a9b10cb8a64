"""A run whose node stores are under attack from a process that does not know the run's secret:
garbage, wrong proofs, oversized frames, connections left quiet. The run must pass bit for bit and
every store must have refused the attacker (``store_refused`` in its journal)."""
from __future__ import annotations

import json
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from baft.store.wire import connect, recv, send

from .conftest import ROOT, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _attempts(address: str, quiet: list[socket.socket]) -> None:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2) as s:  # garbage for a handshake
            recv(s)
            s.sendall(b"\x00\x00\x10\x00" + b"\xff" * 64)
        try:  # a proof made with another secret
            with connect(address, "not-the-runs-secret-" + "z" * 20, timeout=2) as s:
                send(s, {"op": "pull", "rank": 0, "version": 0, "dest": "/etc/passwd"})
                recv(s)
        except OSError:
            pass
        with socket.create_connection((host, int(port)), timeout=2) as s:  # a length far beyond any header
            recv(s)
            s.sendall(struct.pack(">I", 0xFFFFFFFF))
        quiet.append(socket.create_connection((host, int(port)), timeout=2))  # says nothing, stays open
    except OSError:
        pass  # the store is restarting, or already gone at the end of the run


def test_a_run_beside_an_attacker_passes_and_the_stores_refuse_it(tmp_path: Path, ref_cache: Path) -> None:
    out = tmp_path / "out"
    done = threading.Event()
    quiet: list[socket.socket] = []

    def attacker() -> None:
        launcher = out / "faulted" / "journal" / "launcher.jsonl"
        while not done.is_set():
            addresses = []
            if launcher.is_file():
                addresses = [e["address"] for e in map(json.loads, launcher.read_text().splitlines())
                             if e["event"] == "store_start"]
            for address in addresses[-2:]:
                _attempts(address, quiet)
            time.sleep(0.2)

    thread = threading.Thread(target=attacker, daemon=True)
    thread.start()
    try:
        rc, text, v = run_cli(ROOT / "scenarios/ci/baft-kill-during-replication.yaml", out, ref_cache)
    finally:
        done.set()
        thread.join(timeout=10)
        for s in quiet:
            s.close()
    assert rc == 0 and v["bitwise_equal"] and v["recoveries"][0]["restored_tier"] == "shm", text
    for node in (0, 1):
        events = [json.loads(line) for line in (out / "faulted" / "journal" / f"store-node{node}.jsonl").read_text().splitlines()]
        reasons = [e["reason"] for e in events if e["event"] == "store_refused"]
        assert any("did not prove" in r for r in reasons), (node, reasons[:5])
        assert any("a header of" in r for r in reasons), (node, reasons[:5])
        assert any(e["event"] == "replicated" for e in events)  # and the real traffic flowed
