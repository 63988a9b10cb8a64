"""What replication costs the cores: two real store processes on loopback, one rank per node sealing 1.26 MB
versions. The stores' CPU (from ``/proc``) per replicated GB stays within a stated multiple of the floor measured
beside it (a plain sendfile loop, both sides), and near zero while no rank seals anything; the stores run in the
idle classes and say so. Before the kept connections and the rings written in place, the stores paid 12-14 times
the floor (issue 33): this fails if that comes back."""
from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from baft.snapshot.slotfile import slot_of
from baft.snapshot.slots import SnapshotBuffer
from baft.store.client import StoreClient

from harness.bench.floor import measure

from .storeprocs import two_stores

pytestmark = [pytest.mark.e2e, pytest.mark.serial]

SIZE = 1_260_000  # the reference workload's gpt-tiny stage: 1.26 MB a version
#: The bound: the stores' CPU per replicated GB over the floor's. Measured at 3.5-4.5 here (the floor is a stream
#: of back-to-back copies; one replica per version, each after an idle gap and with an answer, costs the plain
#: program itself 2-2.5 times that); 12-14 before issue 33; 2.6-3.0 since the kept copy is read into its mapping
#: and a replica sent from one (2026-12-06, 2.0-2.1 ms of the two stores' CPU per 1.26 MB replica, 2.6-2.8 before).
#: In CI the test runs beside the parallel part on two busy cores: 6.1 there once (2026-12-07, a floor of 0.29),
#: so the bound leaves room for that load and still fails the 12-14 this guards against.
TIMES_FLOOR = 8.0


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(params=["idle"])
def stores(request: pytest.FixtureRequest, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[subprocess.Popen], list[str], Path]]:
    """Two store processes as the harness starts them, in the CPU class the test asks for (the idle classes
    by default)."""
    with two_stores(tmp_path, monkeypatch, request.param, "cost") as started:
        yield started


@pytest.mark.parametrize("stores", ["normal"], indirect=True)  # the cost of the work, not how long it waits for a core:
# in the idle class, beside the tests that run in parallel (at nice 19), a store rightly skips versions
def test_replication_costs_the_stores_a_small_multiple_of_the_floor_and_nothing_when_idle(stores, tmp_path: Path) -> None:
    procs, addresses, base = stores
    buffers = [SnapshotBuffer(base / f"node{n}", n) for n in range(2)]
    clients = [StoreClient(a) for a in addresses]
    for b in buffers:
        b.allocate(SIZE - 4096 - 8192, 8192)

    def seal(version: int) -> None:
        for n in range(2):
            slot = buffers[n].slot_for(version)
            slot.begin(version)
            slot.data()[:64].fill_(version % 101)
            slot.complete(version, b"m" * 100)
            assert clients[n].sealed(n, version, buffers[n].path(slot_of(version)))

    def replicated(first: int) -> list[dict]:
        return [e for n in range(2) for e in map(json.loads, (tmp_path / f"store{n}.jsonl").read_text().splitlines())
                if e["event"] == "replicated" and e["version"] >= first]

    count = 150
    for v in range(20):  # connections made, rings allocated and touched
        seal(v)
        time.sleep(0.03)
    time.sleep(0.5)
    before = sum(_cpu(p.pid) for p in procs)
    for v in range(20, 20 + count):
        seal(v)
        time.sleep(0.03)  # ~30 ms between versions: an iteration of a small pipeline
    deadline = time.monotonic() + 30
    while len(replicated(20)) < 2 * count * 0.95 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    after = sum(_cpu(p.pid) for p in procs)
    sent = replicated(20)
    assert len(sent) >= count, f"only {len(sent)} of {2 * count} replicas landed"  # enough bytes to price
    gb = sum(e["bytes"] for e in sent) / 1e9
    floor = measure(SIZE, 400)["cpu_seconds_per_gb"]
    per_gb = (after - before) / gb
    assert per_gb <= TIMES_FLOOR * floor, (f"the stores spent {per_gb:.2f} CPU-s per replicated GB, "
                                           f"{per_gb / floor:.1f}x the floor of {floor:.3f}")

    time.sleep(2.0)  # nothing sealed: no polling, nothing to do
    idle = sum(_cpu(p.pid) for p in procs)
    time.sleep(3.0)
    assert sum(_cpu(p.pid) for p in procs) - idle <= 0.05  # /proc counts in 10 ms ticks: a few at most

    connected = [e for n in range(2) for e in map(json.loads, (tmp_path / f"store{n}.jsonl").read_text().splitlines())
                 if e["event"] == "peer_connected"]
    assert len(connected) <= 4  # per store: the first replica paced (probing the link), then one kept connection
    for c in clients:
        c.close()
    for b in buffers:
        b.close()


def test_the_stores_run_in_the_idle_classes_and_journal_it(stores, tmp_path: Path) -> None:
    procs, _, _ = stores
    for n, p in enumerate(procs):
        assert os.sched_getscheduler(p.pid) == os.SCHED_IDLE
        start = next(e for e in map(json.loads, (tmp_path / f"store{n}.jsonl").read_text().splitlines())
                     if e["event"] == "store_start")
        assert (start["cpu_class"], start["io_class"]) == ("SCHED_IDLE", "idle") and "priority_note" not in start
