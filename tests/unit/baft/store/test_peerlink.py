"""How replicas travel (baft.store.peerlink, baft.store.linkmeter, baft.store.traffic): one kept connection per peer, whole replicas
where the link keeps up and paced pieces where it is the bottleneck, a new connection (journaled) when the peer's
store was replaced, and a wait for training traffic that sleeps until woken instead of polling."""
from __future__ import annotations

import ctypes
import errno
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from baft.store import traffic
from baft.store.client import StoreClient
from baft.store.config import ReplicationConfig
from baft.store.linkmeter import FAST_RATE, PACE_HOLD, WHOLE, WINDOW, LinkMeter
from baft.store.traffic import TRAFFIC_FILE, TrafficFlag, TrafficFlags

from tests.fakes.stores import replicas_of, seal, stores, wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_replicas_go_paced_until_the_link_is_probed_then_whole_and_paced_again_when_whole_ones_crawl() -> None:
    clock = Clock()
    meter = LinkMeter(0.0, True, clock=clock)
    assert meter.paced()  # nothing measured yet: probe with small pieces
    for _ in range(WINDOW // 2):
        meter.measure(64 << 10, 0.0001)  # loopback: no piece blocks
    assert not meter.paced()
    for _ in range(WHOLE - 1):
        meter.measure_whole(1_260_000, 1_260_000 / (FAST_RATE / 5))
    assert not meter.paced()  # one slow answer is a busy receiver, not a slow link
    change = meter.measure_whole(1_260_000, 1_260_000 / (FAST_RATE / 5))
    assert change is not None and change.limited_by_link and meter.paced()
    assert meter.capacity is not None and meter.capacity < FAST_RATE
    clock.now += PACE_HOLD + 1
    for _ in range(WINDOW // 2):
        meter.measure(64 << 10, 0.0001)  # the paced pieces no longer block: try whole again
    assert not meter.paced()
    assert LinkMeter(1e6, True, clock=clock).paced()  # a configured rate always paces


def test_one_connection_carries_every_replica_and_a_replaced_peer_gets_a_new_one(tmp_path: Path) -> None:
    with stores(tmp_path, ReplicationConfig()) as (addresses, nodes):
        client = StoreClient(addresses[0])
        for v in range(1, 7):
            client.sealed(0, v, seal(tmp_path / "node0", rank=0, version=v, fill=v))
            wait_for(lambda: v in replicas_of(tmp_path / "node1", 0))
        (link,) = nodes[0]._peers.values()
        assert link.connections <= 2  # the first replica paced, the rest over one kept connection

        # the kept connection dies (the peer's store was replaced, a middlebox dropped it): the next replica
        # finds out, says so, connects again and lands
        link._sock.shutdown(socket.SHUT_RDWR)
        client.sealed(0, 7, seal(tmp_path / "node0", rank=0, version=7, fill=7))
        wait_for(lambda: 7 in replicas_of(tmp_path / "node1", 0))
        wait_for(lambda: '"version": 7' in (tmp_path / "j0.jsonl").read_text())
        journal = [json.loads(line) for line in (tmp_path / "j0.jsonl").read_text().splitlines()]
        failed = [e for e in journal if e["event"] == "peer_connection_failed"]
        assert len(failed) == 1 and failed[0]["peer"] == addresses[1]
        assert [e["reason"] for e in journal if e["event"] == "peer_connected"][-1] == "a failed connection"
        assert journal[-1]["event"] == "replicated" and journal[-1]["version"] == 7
        client.close()


def test_waiting_for_training_traffic_sleeps_until_a_rank_clears_its_flag(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Read from the futex waits themselves (how each ended: woken, or timed out), not from the time taken."""
    if traffic._syscall is None:
        pytest.skip("no futex here: the store polls")
    real = traffic._syscall
    waits: list[int] = []  # the errno each futex wait of the store ended with (0: woken)

    def syscall(nr: int, addr: object, op: int, *rest: object) -> int:
        rc = real(nr, addr, op, *rest)
        if op == traffic._FUTEX_WAIT:
            waits.append(ctypes.get_errno() if rc else 0)
        return rc

    monkeypatch.setattr(traffic, "_syscall", syscall)
    flag = TrafficFlag(tmp_path / TRAFFIC_FILE, rank=5)
    flags = TrafficFlags(tmp_path / TRAFFIC_FILE)
    store = threading.get_native_id()
    word = hex(ctypes.addressof(flags._word))

    def asleep_on_the_word() -> bool:
        """Whether the store's thread is inside the futex wait on the generation word (the kernel says so)."""
        call = Path(f"/proc/self/task/{store}/syscall").read_text().split()
        return call[:2] == [str(traffic._SYS_FUTEX), word]

    def clear_once_the_store_sleeps() -> None:
        for _ in range(10_000):  # (10 s at most: only a broken wait never sleeps)
            if asleep_on_the_word():
                break
            time.sleep(0.001)
        flag.set(False)

    try:
        assert flags.wait_idle(1.0) == 0.0 and waits == []  # nothing in flight: no wait at all
        flag.set(True)
        clearer = threading.Thread(target=clear_once_the_store_sleeps, daemon=True)
        clearer.start()
        flags.wait_idle(10.0)  # (a ceiling for a broken wake-up, which would then fail below)
        clearer.join(10)
        # Asleep on the futex, not polling (one wait, a signal aside), and woken by the clear (0), not at the
        # timeout (ETIMEDOUT)
        assert 1 <= len(waits) <= 3 and waits[-1] == 0 and set(waits) <= {0, errno.EINTR}, waits
        flag.set(True)
        waits.clear()
        assert flags.wait_idle(0.2) >= 0.2 and not flags.idle()  # never cleared: it gives up at the bound
        assert waits and waits[-1] == errno.ETIMEDOUT, waits
    finally:
        flag.close()
        flags.close()
