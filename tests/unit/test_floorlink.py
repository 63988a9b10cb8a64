"""The floor replicator of ``baft bench`` (``floor:replicate``): real processes on loopback move a replica
whole into the peer's mapping, in the class asked for, and a connection without the token is dropped."""
from __future__ import annotations

import secrets
import socket
import time
from pathlib import Path

from harness.bench.floorlink import TOKEN_BYTES, FloorLink


def _lands(directory: Path, peer: Path, nbytes: int, timeout: float = 20.0) -> bool:
    """Whether the peer's ``received`` file comes to hold the bytes of this replicator's ``source`` of
    ``nbytes``. Both are read again at each look: the source is sized before its bytes are written (found
    in a full run: a source read between the two was all zeros, and no replica could match it)."""
    source, received = directory / "source", peer / "received"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (source.is_file() and received.is_file() and source.stat().st_size == received.stat().st_size == nbytes
                and source.read_bytes() == received.read_bytes()):
            return True
        time.sleep(0.05)
    return False


def test_a_replica_lands_whole_in_the_peer_and_an_intruder_is_dropped(tmp_path: Path) -> None:
    token = secrets.token_bytes(TOKEN_BYTES)
    a = FloorLink("127.0.0.1", tmp_path / "a", token, "idle")
    b = FloorLink("127.0.0.1", tmp_path / "b", token, "normal")
    try:
        assert a.applied.cpu in ("SCHED_IDLE", "nice 19") and b.applied.cpu == "normal"
        # someone without the token connects first: b's replicator must not take its bytes for a's
        host, port = b.address.rsplit(":", 1)
        intruder = socket.create_connection((host, int(port)))
        intruder.sendall(b"\0" * TOKEN_BYTES + (8).to_bytes(8, "little") + b"intruder")
        a.connect(b.address)
        b.connect(a.address)
        nbytes = 300_001  # not a multiple of a page
        a.replicate(nbytes)
        assert _lands(tmp_path / "a", tmp_path / "b", nbytes)
        b.replicate(1000)  # the other way, another size: a new mapping
        assert _lands(tmp_path / "b", tmp_path / "a", 1000)
        intruder.close()
    finally:
        a.close()
        b.close()
    assert a._proc.returncode == 0 and b._proc.returncode == 0  # they ended at the end of their input
    # each counted what it sent and the CPU from its first replica on (the floor replicator's price per GB)
    assert a.report is not None and a.report[0] == nbytes and a.report[1] >= 0
    assert b.report is not None and b.report[0] == 1000


def test_the_floor_arm_runs_beside_a_replicating_baft_only() -> None:
    from harness.bench.bench import FLOOR_ARM, BenchConfig
    from harness.worker.spec import WorkloadConfig

    def names(nodes: int, **kw: object) -> list[str]:
        return [a.name for a in BenchConfig(workload=WorkloadConfig(nodes=nodes, microbatches=8), **kw).arms()]  # type: ignore[arg-type]

    assert FLOOR_ARM in names(nodes=2, strategies=["baft"])
    floor = next(a for a in BenchConfig(workload=WorkloadConfig(nodes=2), strategies=["baft"]).arms()
                 if a.name == FLOOR_ARM)
    assert floor.tier == "persistent" and floor.strategy == "none"  # paired like baft@k, block mean with its drain
    assert FLOOR_ARM not in names(nodes=1, strategies=["baft"])  # nothing to replicate to
    assert FLOOR_ARM not in names(nodes=2, strategies=["sync"])  # no store replicates: nothing to set it beside
    assert FLOOR_ARM not in names(nodes=2, strategies=["baft"], floor_arm=False)
    assert FLOOR_ARM not in names(nodes=2, strategies=["baft"], link_rate="50mbit")
    from harness.bench.bench import floor_with_sync, is_floor

    both = names(nodes=2, strategies=["sync", "baft"], persist_every=[1, 10])
    assert [n for n in both if is_floor(n)] == [FLOOR_ARM, "floor:work@1", floor_with_sync(1), floor_with_sync(10)]
    work = next(a for a in BenchConfig(workload=WorkloadConfig(nodes=2), strategies=["baft"], persist_every=[10]).arms()
                if a.name == "floor:work@10")
    assert (work.tier, work.strategy, work.every) == ("persistent", "baft", 10)  # baft itself, beside its replicator
    arm = next(a for a in BenchConfig(workload=WorkloadConfig(nodes=2), strategies=["sync", "baft"], persist_every=[10]).arms()
               if a.name == floor_with_sync(10))
    assert (arm.tier, arm.strategy, arm.every) == ("persistent", "sync", 10)  # a sync checkpointer beside the floor
    assert [n for n in names(nodes=2, strategies=["baft"]) if is_floor(n)] == [FLOOR_ARM, "floor:work@1"]


def _slot(path: Path, version: int, data: bytes, meta: bytes = b"{}") -> bytes:
    """A sealed slot file of ``version`` at ``path``, written in place as the snapshotter's mapped slots are (the
    replicator keeps each slot file open); its used bytes."""
    from baft.snapshot.slotfile import COMPLETE, HEAD, HEADER, MAGIC

    used = HEAD.pack(MAGIC, COMPLETE, version, len(data), len(meta), 2 * len(data) + len(meta)).ljust(HEADER, b"\0")
    used += data + meta
    with open(path, "r+b" if path.exists() else "wb") as f:
        f.write(used)
    return used


def _holds(path: Path, want: bytes, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and path.stat().st_size == len(want) and path.read_bytes() == want:
            return True
        time.sleep(0.05)
    return False


def test_the_floor_of_the_work_sends_each_sealed_slot_into_the_next_file_of_a_ring(tmp_path: Path) -> None:
    """``floor:work@k`` (issue 55): the snapshotter's sealed slots, through :class:`SlotSender` standing where its
    store client stands, land whole (their used bytes, read from the header) in a ring of the slots' length."""
    from baft.snapshot.slotfile import SLOTS

    from harness.bench.floorlink import SlotSender

    token = secrets.token_bytes(TOKEN_BYTES)
    a = FloorLink("127.0.0.1", tmp_path / "a", token, "idle")
    b = FloorLink("127.0.0.1", tmp_path / "b", token, "idle")
    try:
        a.connect(b.address)
        b.connect(a.address)
        sender = SlotSender(a)
        slots = tmp_path / "slots"
        slots.mkdir()
        for v in range(SLOTS + 1):  # the fourth version goes into the first file again
            used = _slot(slots / f"rank-00000.slot{v % SLOTS}", v, bytes([v + 1]) * (70_001 + v))
            assert sender.sealed(0, v, slots / f"rank-00000.slot{v % SLOTS}")
            assert _holds(tmp_path / "b" / f"received.slot{v % SLOTS}", used), v  # whole, before the next is sent
        assert sender.sent == SLOTS + 1 and sender.locate(0) == [] and sender.pull(0, 1, slots) is None
    finally:
        a.close()
        b.close()
    assert a.report is not None and a.report[0] == sum(4096 + 70_001 + v + 2 for v in range(SLOTS + 1))
