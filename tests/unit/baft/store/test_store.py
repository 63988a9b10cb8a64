"""The node store: replicates sealed slots to the next node, locates and pulls copies for a restore."""
from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from baft.snapshot.slotfile import COMPLETE, copies, slot_header, slot_of
from baft.snapshot.slots import SnapshotBuffer
from baft.store.client import StoreClient
from baft.store.config import ReplicationConfig, StoreConfig
from baft.store.linkmeter import WINDOW
from baft.store.peerlink import Delivery, PeerLink, Unfinished
from baft.store.server import Store
from baft.store.stride import Stride
from baft.store.wire import recv_header, request, server_handshake
from baft.store.wire import send as wire_send

from tests.fakes.stores import SECRET, journaled, replicas_of, seal, sealed_on_node0, stores, wait_for


def test_sealed_versions_reach_the_next_node_and_can_be_pulled_back(two_stores) -> None:
    root, addresses = two_stores
    path, client, kept = sealed_on_node0(root, addresses[0])
    wait_for(lambda: 7 in replicas_of(root / "node1", 3))

    # the store keeps its own copy of what it replicated (the kept slot, checked above)
    # node 0 loses its memory; a new worker of rank 3 there asks its store
    path.unlink()
    kept.unlink()
    assert (7, 1) in client.locate(3)
    dest = root / "node0" / "rank-00003.slot1"
    assert client.pull(3, 7, dest) == 1
    buf = SnapshotBuffer(root / "node0", 3)
    infos = {i.version: i for i in buf.open_existing()}
    assert infos[7].state == COMPLETE and torch.all(buf.slots[1].data() == 5)
    buf.close()
    client.close()


def test_a_torn_slot_is_never_replicated(two_stores) -> None:
    root, addresses = two_stores
    path = seal(root / "node0", rank=0, version=2, fill=1)
    buf = SnapshotBuffer(root / "node0", 0)
    buf.open_existing()
    buf.slots[slot_of(2)].begin(5)  # a writer started the next version in that slot and died
    buf.close()
    StoreClient(addresses[0]).sealed(0, 2, path)
    # Once the store has looked at the slot (and journaled why it skipped it), nothing was sent: checking
    # after a fixed sleep would also pass when the store had not got to it yet.
    journal = root / "j0.jsonl"
    wait_for(lambda: journal.is_file() and "rewritten" in journal.read_text())
    assert not replicas_of(root / "node1", 0)
    assert '"replicated"' not in journal.read_text()


def test_a_round_that_sent_nothing_tells_nothing_about_the_link(tmp_path: Path) -> None:
    """A probe round whose only copy was lost (its slot rewritten first) took no time because it sent
    nothing: it must not pass for a fast link and resume replication (a benchmark run did that)."""
    with stores(tmp_path, ReplicationConfig(replicas=1)) as (addresses, nodes):
        stride = nodes[0].stride
        stride.period, stride.persist_every, stride.degraded = 0.1, 10, True  # degraded; its probe is due
        path = seal(tmp_path / "node0", rank=0, version=2, fill=1)
        buf = SnapshotBuffer(tmp_path / "node0", 0)
        buf.open_existing()
        buf.slots[slot_of(2)].begin(5)  # the slot is reused before the store reads it
        buf.close()
        StoreClient(addresses[0]).sealed(0, 2, path, persist_every=10, persisted=0)
        journal = tmp_path / "j0.jsonl"
        wait_for(lambda: journal.is_file() and "rewritten" in journal.read_text())
        time.sleep(0.3)  # the round has ended by now (nothing else to wait for)
        assert stride.degraded and "replication_resumed" not in journal.read_text()


def test_replica_sockets_are_marked_as_the_lowest_class_of_traffic(two_stores, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a queue serves by priority (a NIC's traffic classes, the harness's throttled links) replicas
    go after every training packet: SO_PRIORITY filler (1) and DSCP Lower Effort."""
    import socket

    from baft.store import peerlink

    socks: list[socket.socket] = []
    real = peerlink.connect
    monkeypatch.setattr(peerlink, "connect", lambda *a, **k: socks.append(real(*a, **k)) or socks[-1])
    root, addresses = two_stores
    sealed_on_node0(root, addresses[0])
    wait_for(lambda: 7 in replicas_of(root / "node1", 3))
    (kept,) = socks  # the connection stays open for the next replica
    assert (kept.getsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY), kept.getsockopt(socket.IPPROTO_IP, socket.IP_TOS)) \
        == (peerlink.FILLER_PRIORITY, peerlink.LOWER_EFFORT_TOS)


def test_unknown_ops_and_missing_versions_are_answered(two_stores) -> None:
    _, addresses = two_stores
    reply, _ = request(addresses[1], {"op": "frobnicate"})
    assert reply["ok"] is False and "unknown" in reply["error"]
    assert StoreClient(addresses[1]).pull(9, 9, Path("/nonexistent/x")) is None


def test_replicas_wait_for_training_traffic_to_pause(two_stores, monkeypatch: pytest.MonkeyPatch) -> None:
    """A piece waits while a local rank's pipeline transfer is in flight (up to MAX_DEFER), and not at all
    when none is. The flag is held until the replica has arrived, so the wait is certain, not a race
    between this thread's sleep and the store's."""
    from baft.store import peerlink
    from baft.store.traffic import TRAFFIC_FILE, TrafficFlag

    monkeypatch.setattr(peerlink, "MAX_DEFER", 0.5)
    root, addresses = two_stores
    client = StoreClient(addresses[0])

    def replicated(version: int) -> dict:
        wait_for(lambda: version in replicas_of(root / "node1", 0))
        wait_for(lambda: any(json.loads(line).get("version") == version for line in
                             (root / "j0.jsonl").read_text().splitlines() if '"replicated"' in line))
        return [json.loads(line) for line in (root / "j0.jsonl").read_text().splitlines()
                if '"replicated"' in line and json.loads(line)["version"] == version][-1]

    flag = TrafficFlag(root / "node0" / TRAFFIC_FILE, rank=1)
    flag.set(True)  # rank 1 of node 0 is waiting on a pipeline transfer, and stays so
    client.sealed(0, 1, seal(root / "node0", rank=0, version=1, fill=3))
    busy = replicated(1)
    flag.set(False)
    # its one piece waited out the cap, the traffic never pausing (a lower bound the wait's loop guarantees: it
    # ends only when the flags clear or its timeout has passed)
    assert busy["deferred_seconds"] >= 0.5
    client.sealed(0, 2, seal(root / "node0", rank=0, version=2, fill=4))
    idle = replicated(2)
    assert idle["deferred_seconds"] == 0.0  # nothing in flight: sent at once (the wait returns before it looks at a clock)
    flag.close()
    client.close()


def test_a_link_too_slow_to_beat_the_persistent_tier_stops_replication_until_a_probe_finds_it_fast(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank seals a version every ~10 ms and persists every 40; at 8 kB/s a round of its ~4 kB replica takes
    ~0.5 s (about 50 versions): the store stops replicating, journals why, keeps probing while the link is
    slow, and resumes once a probe round is fast (the newest replica at most 10 versions old at a failure,
    half the persistent tier's 20: a fast round may take ~70 ms on busy cores and still resume)."""
    from baft.store import stride as replstride

    monkeypatch.setattr(replstride, "DEGRADE_HOLD", 0.6)
    with stores(tmp_path, ReplicationConfig(replicas=1, rate=8_000, yield_to_training=False),
                adaptive_stride=True) as (addresses, nodes):
        client, stop = StoreClient(addresses[0]), threading.Event()

        def train() -> None:
            v = 0
            while not stop.is_set():
                v += 1
                # the persistent tier commits every 40th version as it comes: 20 versions old at a failure
                client.sealed(0, v, seal(tmp_path / "node0", rank=0, version=v, fill=v % 7), persist_every=40,
                              persisted=40 * (v // 40))
                time.sleep(0.01)

        trainer = threading.Thread(target=train, daemon=True)
        trainer.start()
        journal = tmp_path / "j0.jsonl"

        try:
            wait_for(lambda: journal.is_file() and journaled(journal, "replication_degraded"))
            (why,) = journaled(journal, "replication_degraded")
            assert why["persist_every"] == 40 and why["replica_age_versions"] > 20 and "persistent tier" in why["reason"]
            sent = len(journaled(journal, "replicated"))
            time.sleep(0.4)  # no probe before the hold is over: nothing sent
            assert len(journaled(journal, "replicated")) == sent and nodes[0].stride.degraded
            wait_for(lambda: len(journaled(journal, "replicated")) > sent)  # a probe round, still slow
            assert nodes[0].stride.degraded and not journaled(journal, "replication_resumed")
            nodes[0].link.rate = 0  # the link is fast again
            wait_for(lambda: journaled(journal, "replication_resumed"))
            n = len(journaled(journal, "replicated"))
            wait_for(lambda: len(journaled(journal, "replicated")) >= n + 5)  # replicating again, round after round
        finally:
            stop.set()
            trainer.join()
            client.close()


def test_rounds_replicate_one_version_for_every_local_rank(two_stores) -> None:
    """Ranks of a node are replicated at the same versions, so a restore finds a common one."""
    root, addresses = two_stores
    client = StoreClient(addresses[0])
    client.sealed(0, 4, seal(root / "node0", rank=0, version=4, fill=1))
    # The first round is over (rank 0's version 4 sent) before rank 1 seals anything: no sleep to race.
    wait_for(lambda: 4 in replicas_of(root / "node1", 0) and '"replicated"' in (root / "j0.jsonl").read_text())
    client.sealed(1, 5, seal(root / "node0", rank=1, version=5, fill=2))  # rank 1 has no version 4
    client.sealed(0, 5, seal(root / "node0", rank=0, version=5, fill=3))

    # the sender journals a replica once the receiver has it: wait for the lines, not only the files
    wait_for(lambda: (root / "j0.jsonl").read_text().count('"replicated"') >= 3)

    events = [json.loads(line) for line in (root / "j0.jsonl").read_text().splitlines()]
    sent = [(e["rank"], e["version"]) for e in events if e["event"] == "replicated"]
    assert sent[0] == (0, 4) and sorted(sent[1:]) == [(0, 5), (1, 5)]  # the first round saw only rank 0
    client.close()


def test_a_version_every_local_rank_replicated_is_never_journaled_as_skipped(tmp_path: Path) -> None:
    """Found in amp-bf16-fsdp's journals (two ranks per node): a round opens at the first rank's seal, and the
    second rank's seal of the same version counted it again among the versions no round took, so every round
    after the first journaled ``replication_skipped`` (and the bench counted it) though none was."""
    with stores(tmp_path, ReplicationConfig(replicas=1)) as (addresses, nodes):
        clients = [StoreClient(addresses[0]), StoreClient(addresses[0])]

        def replicated() -> set[tuple[int, int]]:
            return {(e["rank"], e["version"]) for e in journaled(tmp_path / "j0.jsonl", "replicated")}

        for rank in (0, 1):
            assert clients[rank].sealed(rank, 3, seal(tmp_path / "node0", rank=rank, version=3, fill=3))
        wait_for(lambda: set(nodes[0]._sealed) == {0, 1})  # from here a round waits for both ranks' seals
        for v in range(4, 9):
            for rank in (0, 1):  # rank 1 seals each version after rank 0 has opened its round
                assert clients[rank].sealed(rank, v, seal(tmp_path / "node0", rank=rank, version=v, fill=v))
            wait_for(lambda v=v: {(0, v), (1, v)} <= replicated())
        assert journaled(tmp_path / "j0.jsonl", "replication_skipped") == []
        for c in clients:
            c.close()


def test_a_whole_replica_goes_from_the_thread_that_took_the_seal_a_paced_one_from_the_replicate_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33: handing each replica from the thread that takes a rank's seal to the replicate thread cost a
    wake-up and a hand-off per replica (0.13-0.15 ms of the two stores' 2.0 per replica, measured). While the link
    keeps up, the notice's thread sends it; paced pieces (a slow link, or before the link is probed) stay with the
    replicate thread, so a notice never waits behind a slow link."""
    sends: list[tuple[int, str, bool]] = []
    original = PeerLink.send

    def send(link: PeerLink, rank: int, version: int, fd: int, nbytes: int, patience: float | None = None):  # type: ignore[no-untyped-def]
        paced = link.meter.paced()
        got = original(link, rank, version, fd, nbytes, patience)
        if isinstance(got, Delivery):  # delivered by this thread (else left unfinished for the replicate thread)
            sends.append((version, threading.current_thread().name, paced))
        return got

    monkeypatch.setattr(PeerLink, "send", send)
    with stores(tmp_path, ReplicationConfig(replicas=1)) as (addresses, nodes):
        client = StoreClient(addresses[0])
        for v in range(WINDOW // 2 + 6):  # a small replica is one piece: WINDOW // 2 of them probe the link
            assert client.sealed(0, v, seal(tmp_path / "node0", rank=0, version=v, fill=v))
            wait_for(lambda v=v: v in replicas_of(tmp_path / "node1", 0))
        client.close()
    paced = [(v, name) for v, name, p in sends if p]
    whole = [(v, name) for v, name, p in sends if not p]
    assert paced and whole, sends  # the first replicas probe the link in pieces, the rest go whole
    assert all(name == "store-replicate" for _, name in paced), paced
    # whole ones go from the thread that took the seal; one the link held up past 50 ms (the first, on a new
    # connection; any, on busy cores: a CI run saw two) is finished by the replicate thread: not a time asserted
    assert len(whole) >= 3 and any(name != "store-replicate" for _, name in whole[1:]), whole


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(["seal0", "seal1", "seal0", "seal1", "round", "round", "round", ("stride", 1),
                                 ("stride", 2), ("stride", 3)]), max_size=50))
def test_every_version_no_round_took_is_journaled_as_skipped_once_and_no_other(actions: list) -> None:
    """Local ranks 0 and 1 seal in any order (at most two versions apart) while this node's rounds take what its
    stride wants: the versions ``replication_skipped`` lists are sealed ones no round took, each in one line,
    and every sealed version between two rounds that no round took is among them."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        store = Store(StoreConfig(root=root / "node0", node=0, addresses=["127.0.0.1:1", "127.0.0.1:2"],
                                  replication=ReplicationConfig(replicas=1), secret=SECRET, world_size=8,
                                  journal=root / "j.jsonl"))
        with store._cond:  # the rounds are driven here, one send at a time, not by its thread
            store._closed = True
            store._cond.notify_all()
        store.stride.round_done = lambda seconds: None  # the stride changes only when an action says
        opened: list[int] = []
        start = store._start_round

        def spy() -> None:
            before = store._current
            start()
            if store._current is not None and store._current != before:
                opened.append(store._current)

        store._start_round = spy  # type: ignore[method-assign]
        newest = {0: -1, 1: -1}
        try:
            for action in actions:
                if action in ("seal0", "seal1"):
                    rank = int(action[-1])
                    if newest[rank] - newest[1 - rank] >= 2:
                        continue  # the pipeline keeps the ranks within two versions of each other
                    newest[rank] += 1
                    store.handle({"op": "sealed", "rank": rank, "version": newest[rank],
                                  "file": str(seal(root / "node0", rank, newest[rank], fill=newest[rank] % 100))})
                elif action == "round":
                    with store._cond:
                        job = store._next_send()
                        if job is not None:
                            store._sent.add(job[0])
                else:
                    store.stride.value = action[1]
        finally:
            store.close()
        lines = [e for e in map(json.loads, (root / "j.jsonl").read_text().splitlines())
                 if e["event"] == "replication_skipped" and "skipped" in e]
        listed = [u for e in lines for u in e["versions"]]
        assert all(e["skipped"] == len(e["versions"]) for e in lines)
        assert len(listed) == len(set(listed))  # each version counted once
        sealed = set(range(max(newest.values()) + 1))
        assert set(listed) <= sealed - set(opened)  # never a version a round took: no false alarm
        if opened:
            passed = {u for u in sealed - set(opened) if min(opened) < u < max(opened)}
            assert passed <= set(listed)  # and none passed over in silence


def test_a_node_holds_its_ranks_at_the_versions_its_peer_replicates_whatever_its_own_rounds_took(tmp_path: Path) -> None:
    """Found in CI (link-throttle-replication, 1 run in 8): the two nodes' strides followed their own links,
    node 0's rounds kept versions 4, 8, 12 and node 1's replicas on node 0 were 5 and 6; node 1 was lost and
    no version was common to every rank: the job restarted from scratch. A node keeps its own ranks' copies
    at the versions its peer replicates to it."""
    with stores(tmp_path, ReplicationConfig(replicas=1)) as (addresses, nodes):
        nodes[0].stride.value = 4  # node 0's link measured slower: its rounds take every 4th version (and stays so)
        c0, c1 = StoreClient(addresses[0]), StoreClient(addresses[1])
        for v in (4, 5):
            c0.sealed(0, v, seal(tmp_path / "node0", rank=0, version=v, fill=v))
        c1.sealed(1, 5, seal(tmp_path / "node1", rank=1, version=5, fill=50))
        wait_for(lambda: 5 in replicas_of(tmp_path / "node0", 1))
        c1.sealed(1, 9, seal(tmp_path / "node1", rank=1, version=9, fill=90))  # node 1 is ahead of node 0 now
        wait_for(lambda: 9 in replicas_of(tmp_path / "node0", 1))
        held = lambda: {v for v, p in copies(tmp_path / "node0", 0) if p.name.startswith("held-")}  # noqa: E731
        for v in range(6, 14):  # node 0's own slots move past 5 and 9; its rounds take multiples of 4
            c0.sealed(0, v, seal(tmp_path / "node0", rank=0, version=v, fill=v))
            if v == 9:  # (a slot is reused three versions later: a job's steps take longer than this loop's)
                wait_for(lambda: 9 in held())
        wait_for(lambda: replicas_of(tmp_path / "node1", 0) - {4})
        mine = {v for v, _ in copies(tmp_path / "node0", 0)}
        assert {5, 9} <= mine, mine  # node 1 lost now: rank 1 restores at 9 from its replica, rank 0 too
        assert {v for v, p in copies(tmp_path / "node0", 0) if p.name.startswith("rank-")} == {11, 12, 13}
        five = next(p for v, p in copies(tmp_path / "node0", 0) if v == 5 and p.name.startswith("held-"))
        assert five.read_bytes() == seal(tmp_path / "copy", rank=0, version=5, fill=5).read_bytes()
        assert 9 in nodes[0].discard(0, 6)  # a restore at 6 forgets the held 9 (with newer kept copies)
        assert held() == {5}
        c0.close()
        c1.close()


def test_a_peers_version_kept_by_this_nodes_own_round_is_held_when_the_kept_ring_reuses_it(tmp_path: Path) -> None:
    """Where both nodes' rounds took the same version (the common case), no second copy is made at once; the
    kept copy is copied to the held ring only when the kept ring is about to be rewritten."""
    with stores(tmp_path, ReplicationConfig(replicas=1)) as (addresses, nodes):
        c0, c1 = StoreClient(addresses[0]), StoreClient(addresses[1])
        kept = lambda: {v for v, p in copies(tmp_path / "node0", 0) if p.name.startswith("kept-")}  # noqa: E731
        held = lambda: {v for v, p in copies(tmp_path / "node0", 0) if p.name.startswith("held-")}  # noqa: E731
        c0.sealed(0, 5, seal(tmp_path / "node0", rank=0, version=5, fill=5))
        wait_for(lambda: 5 in kept())
        c1.sealed(1, 5, seal(tmp_path / "node1", rank=1, version=5, fill=50))
        wait_for(lambda: 5 in replicas_of(tmp_path / "node0", 1))
        assert held() == set()  # the kept copy of 5 serves
        for v in (6, 7, 8):  # three more rounds of node 0's own: its kept ring reuses the file of 5
            c0.sealed(0, v, seal(tmp_path / "node0", rank=0, version=v, fill=v))
            wait_for(lambda: v in replicas_of(tmp_path / "node1", 0))
        assert kept() == {6, 7, 8} and held() == {5}
        assert {v for v, _ in copies(tmp_path / "node0", 0)} & replicas_of(tmp_path / "node0", 1) == {5}
        c0.close()
        c1.close()


# -- the config: one object from the scenario to the store process -------------------------------------
def store_args(root: Path, *extra: str) -> list[str]:
    return ["--root", str(root), "--node", "1", "--addresses", "a:1,b:2", *extra]


def test_the_store_command_line_parses_into_its_config(tmp_path: Path) -> None:
    from baft.store.cli import parse_args

    replication = ReplicationConfig(replicas=2, rate=5e6, yield_to_training=False)
    cfg = parse_args(store_args(tmp_path, "--replication", replication.to_json(), "--listen", "10.0.0.7",
                                "--world-size", "4"))
    assert cfg == StoreConfig(root=tmp_path, node=1, addresses=["a:1", "b:2"], listen="10.0.0.7", replication=replication,
                              secret=SECRET, world_size=4)
    assert SECRET not in " ".join(store_args(tmp_path)) and SECRET not in repr(cfg)  # from the environment only
    assert parse_args(store_args(tmp_path)).replication == ReplicationConfig()  # defaults in one place
    assert parse_args(store_args(tmp_path, "--replication", '{"rate": 7}')).replication == ReplicationConfig(rate=7.0)


@pytest.mark.parametrize(("extra", "says"), [
    (["--replication", '{"replicas": -1}'], "replicas: expected an integer >= 0"),
    (["--replication", '{"replicas": true}'], "replicas: expected an integer >= 0"),
    (["--replication", '{"domain_nodes": -1}'], "domain_nodes: expected an integer >= 0"),
    (["--replication", '{"colour": 1}'], "keys among replicas, placement, domain_nodes, rate, yield_to_training"),
    (["--replication", "fast"], "a JSON object"),
    (["--node", "2"], "a node index in 0..1"),
    (["--listen", "0.0.0.0"], "listen: expected this node's own address"),
    (["--listen", "::"], "listen: expected this node's own address"),
])
def test_a_bad_store_config_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     extra: list[str], says: str) -> None:
    from baft.store.cli import parse_args

    with pytest.raises(SystemExit) as info:
        parse_args(store_args(tmp_path, *extra))
    assert info.value.code == 2 and says in capsys.readouterr().err


def test_the_store_help_documents_every_replication_key(capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses

    from baft.store.cli import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = capsys.readouterr().out
    for f in dataclasses.fields(ReplicationConfig):
        assert f"{f.name} (default " in out
    assert "Peer nodes that keep a copy" in out and "The node's shared-memory directory" in out


def test_the_checkpoint_section_holds_the_replication_config() -> None:
    from baft import BaftConfigError, CheckpointConfig
    from baft.config import BaftConfig

    c = CheckpointConfig(strategy="baft", baft=BaftConfig(replication=ReplicationConfig(replicas=2, rate=1e6,
                                                                                       yield_to_training=False)))
    assert c.baft.replication == ReplicationConfig(replicas=2, rate=1e6, yield_to_training=False)
    assert CheckpointConfig().baft.replication == ReplicationConfig()  # the section's defaults are the store's
    for key, value in (("replicas", -1), ("rate", -1.0)):
        with pytest.raises(BaftConfigError) as info:
            CheckpointConfig(baft=BaftConfig(replication=ReplicationConfig(**{key: value})))
        assert info.value.field == key


def test_the_fleet_hands_each_store_the_scenarios_replication_config(tmp_path: Path) -> None:
    from baft import CheckpointConfig
    from baft.config import BaftConfig
    from baft.store.cli import parse_args

    from analysis.journal import JournalWriter
    from harness.run.storefleet import StoreFleet, StoreSpec

    ckpt = CheckpointConfig(strategy="baft", baft=BaftConfig(replication=ReplicationConfig(replicas=2, rate=3e6,
                                                                                          yield_to_training=False)))
    journal = JournalWriter(tmp_path / "launcher.jsonl")
    fleet = StoreFleet(StoreSpec(base=tmp_path / "shm", replication=ckpt.replication), 3, tmp_path, journal,
                       secret=SECRET, world_size=6)
    cmd = fleet.command(2)
    assert cmd[1:3] == ["-m", "baft.store"]
    cfg = parse_args(cmd[3:])
    assert cfg.replication == ckpt.replication
    assert (cfg.node, cfg.addresses, cfg.root, cfg.world_size) == (2, fleet.addresses, tmp_path / "shm" / "node2", 6)
    assert SECRET not in " ".join(cmd)  # the secret goes through the environment
    journal.close()


@pytest.mark.parametrize("where", ["another directory", "dot-dot", "another name", "another rank", "a link out"])
def test_a_request_never_makes_the_store_write_or_read_outside_its_root(two_stores, where: str) -> None:
    """A pull writes the copy where the request says, a seal reads the file it names: both must be the
    rank's own slot in the store's root, or anyone who can reach the port could write (or read and
    replicate) any file the store's user can."""
    root, addresses = two_stores
    path, client, _ = sealed_on_node0(root, addresses[0])
    outside = root / "outside"
    outside.mkdir()
    link = root / "node0" / "rank-00003.slot1"
    dest = {"another directory": outside / "rank-00003.slot1",
            "dot-dot": root / "node0" / ".." / "outside" / "rank-00003.slot1",
            "another name": root / "node0" / "evil",
            "another rank": root / "node0" / "rank-00004.slot1",
            "a link out": link}[where]
    path.unlink()
    if where == "a link out":
        link.symlink_to(outside / "target")
    assert client.pull(3, 7, dest) is None
    assert not (outside / "rank-00003.slot1").exists() and not (outside / "target").exists()
    assert not (root / "node0" / "evil").exists() and not (root / "node0" / "rank-00004.slot1").exists()
    # a directory below the root is the store's own (an elastic restore pulls into one)
    below = root / "node0" / "resize-rank3"
    below.mkdir()
    assert client.pull(3, 7, below / "rank-00003.slot1") == 0 and slot_header(below / "rank-00003.slot1")[:2] == (COMPLETE, 7)
    # a seal naming a file outside the root is refused too, and nothing of it is replicated
    secret = outside / "secret"
    secret.write_bytes(b"x" * 64)
    assert client.sealed(3, 8, secret)  # a notification: no answer, the store journals the refusal
    journal = root / "j0.jsonl"
    wait_for(lambda: "not rank 3's slot for version 8" in journal.read_text())
    assert 8 not in replicas_of(root / "node1", 3)
    client.close()


def test_the_replica_ring_keeps_three_versions_whatever_the_stride(two_stores) -> None:
    # Hole e: replicas of every 3rd version (replicate_every: 3) all went to slot v % 3 = 0, one replica kept
    root, addresses = two_stores
    payload = seal(root / "src", rank=5, version=0, fill=1).read_bytes()
    for version in (0, 3, 6, 9):
        head = bytearray(payload)
        head[16:24] = version.to_bytes(8, "little")  # the header's version field
        reply, _ = request(addresses[1], {"op": "put", "rank": 5, "version": version}, bytes(head))
        assert reply["ok"], reply
    assert replicas_of(root / "node1", 5) == {3, 6, 9}  # the newest three; the oldest made room
    reply, _ = request(addresses[1], {"op": "put", "rank": 5, "version": 9}, bytes(head))  # the same again
    assert replicas_of(root / "node1", 5) == {3, 6, 9}


def test_a_request_with_a_bad_rank_or_version_is_refused(two_stores) -> None:
    _, addresses = two_stores
    for bad in ({"rank": "0", "version": 1}, {"rank": 0, "version": -1}, {"rank": None, "version": 1}):
        reply, _ = request(addresses[0], {"op": "pull", "dest": "x", **bad})
        assert reply["ok"] is False and "integers" in reply["error"], reply
        reply, _ = request(addresses[0], {"op": "put", **bad}, b"\0" * 64)
        assert reply["ok"] is False and "integers" in reply["error"], reply
    reply, _ = request(addresses[0], {"op": "put", "rank": 0, "version": 1}, b"\0" * 64)  # not a slot's bytes
    assert reply["ok"] is False and "not a snapshot slot" in reply["error"], reply


def test_a_discard_forgets_a_ranks_newer_copies_on_every_node(two_stores) -> None:
    root, addresses = two_stores
    client = StoreClient(addresses[0])
    for v in (1, 2, 3):
        client.sealed(0, v, seal(root / "node0", rank=0, version=v, fill=v))
        wait_for(lambda: v in replicas_of(root / "node1", 0))
    kept = {v for v, p in copies(root / "node0", 0) if p.name.startswith("kept-")}
    assert 3 in kept
    assert client.discard(0, 1) == sorted(v for v in kept if v > 1)  # this node's kept copies
    assert replicas_of(root / "node1", 0) <= {1}  # and the peer's replicas, forwarded
    assert not {v for v, p in copies(root / "node0", 0) if p.name.startswith("kept-") and v > 1}
    # the worker's own slots are its own to mark: the store leaves them
    assert {v for v, p in copies(root / "node0", 0) if p.name.startswith("rank-")} == {1, 2, 3}
    reply, _ = request(addresses[0], {"op": "discard", "rank": 0, "version": "2"})
    assert reply["ok"] is False and ">= -1" in reply["error"]
    client.close()


def test_a_kept_copy_is_the_slots_bytes_copied_file_to_file_in_place(tmp_path: Path) -> None:
    from baft.snapshot.slotfile import kept_slot
    from baft.store.ring import SlotRing

    src = seal(tmp_path / "a", rank=1, version=4, fill=9)
    ring = SlotRing([kept_slot(tmp_path, 1, k) for k in range(3)])
    k, used = ring.copy_from(src, 4)
    dest = kept_slot(tmp_path, 1, k)
    assert dest.read_bytes()[:used] == src.read_bytes()[:used]
    assert dest.stat().st_size == src.stat().st_size  # the slot's size
    inode = dest.stat().st_ino
    assert ring.copy_from(src, 5) is None  # not that version: nothing copied
    assert ring.copy_from(seal(tmp_path / "a", rank=1, version=7, fill=3), 7, k) == (k, used)
    assert dest.stat().st_ino == inode and slot_header(dest)[:2] == (COMPLETE, 7)  # rewritten in place
    ring.close()


# -- a property: after any interleaving, a lost peer's newest complete replica has its match here -------------
ACTIONS = st.lists(st.sampled_from(["seal"] * 4 + ["seal0", "seal1", "round", "round", ("announce", -1), ("announce", 0),
                                     ("announce", 1), ("announce", 3), ("stride", 1), ("stride", 2), ("stride", 4)]),
                   max_size=60)
#: The CI failure's pattern: this node's stride takes every 4th version, the peer replicates 5, this node moves on.
NODES_APART = [("stride", 4)] + ["seal", "round", "round"] * 6 + [("announce", 0)] + ["seal", "round", "round"] * 3
#: Both nodes' rounds took the same version (the kept copy serves), then this node's next rounds reuse its kept file.
KEPT_REUSED = ["seal", "round", "round", ("announce", 0)] + ["seal", "round", "round"] * 3


@settings(max_examples=150, deadline=None)
@example(NODES_APART)
@example(KEPT_REUSED)
@given(ACTIONS)
def test_any_interleaving_leaves_every_local_rank_a_copy_of_the_peers_last_two_rounds(actions: list) -> None:
    """Local ranks 0 and 1 seal in any order (at most two versions apart), this node's rounds take whatever
    versions its stride wants, the peer (ranks 2 and 3) replicates rounds near the local ranks' newest, before
    or after them. Whatever the interleaving, each of the peer's last two rounds (its newest complete replica,
    or the one before while one travels) has a copy here for every local rank that sealed it while it could
    still be read (a rank already three versions past it when it was announced is journaled as skipped)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        store = Store(StoreConfig(root=root / "node0", node=0, addresses=["127.0.0.1:1", "127.0.0.1:2"],
                                  replication=ReplicationConfig(replicas=1), secret=SECRET, world_size=8))
        with store._cond:  # the rounds are driven here, one send at a time, not by its thread
            store._closed = True
            store._cond.notify_all()
        store.stride.round_done = lambda seconds: None  # the stride changes only when an action says
        newest = {0: -1, 1: -1}
        announced: list[int] = []
        holdable: dict[tuple[int, int], bool] = {}
        try:
            for action in actions:
                if action in ("seal", "seal0", "seal1"):
                    for rank in ((0, 1) if action == "seal" else (int(action[-1]),)):
                        if newest[rank] - newest[1 - rank] >= 2:
                            continue  # the pipeline keeps the ranks within two versions of each other
                        newest[rank] += 1
                        store.handle({"op": "sealed", "rank": rank, "version": newest[rank],
                                      "file": str(seal(root / "node0", rank, newest[rank], fill=newest[rank] % 100))})
                elif action == "round":
                    with store._cond:
                        job = store._next_send()
                        if job is not None:
                            store._sent.add(job[0])
                elif action[0] == "stride":
                    store.stride.value = action[1]
                else:
                    v = max(announced[-1] + 1 if announced else 0, max(newest.values()) - action[1])
                    for rank in (0, 1):  # whether this node can still hold its copy of v
                        sealed = store._sealed.get(rank, {})
                        holdable[(rank, v)] = v in sealed or newest[rank] < v
                    for peer in (2, 3):
                        if announced:  # the peer's rounds are one after another: the previous one landed
                            with store._cond:
                                store._peers_rounds.landed(peer, announced[-1])
                        store._hold(peer, v)
                    announced.append(v)
                for v in announced[-2:]:
                    for rank in (0, 1):
                        if holdable[(rank, v)] and newest[rank] >= v:
                            have = {u for u, _ in copies(root / "node0", rank)}
                            assert v in have, (rank, v, have, announced, newest)
        finally:
            store.close()


@contextlib.contextmanager
def quiet_store(root: Path) -> Iterator[Store]:
    """A node-0 store whose rounds nobody drives (its replicate thread stopped): its holds, driven by hand."""
    store = Store(StoreConfig(root=root, node=0, addresses=["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"],
                              replication=ReplicationConfig(replicas=2), secret=SECRET, world_size=8))
    with store._cond:
        store._closed = True
        store._cond.notify_all()
    try:
        yield store
    finally:
        store.close()


def test_two_peers_rounds_keep_their_copies_however_far_apart_their_strides(tmp_path: Path) -> None:
    """Found in review: with replicas from two peers (replicas: 2), the held ring kept the three newest versions
    of any peer, so a slow peer's only round here (10) was evicted by a fast peer's 12, 15, 18, 21."""
    with quiet_store(tmp_path) as store:
        store.stride.value = 64  # this node's own rounds take none of these versions
        for v in range(23):
            store.handle({"op": "sealed", "rank": 0, "version": v,
                          "file": str(seal(tmp_path, 0, v, fill=v % 100))})
            if v == 10:
                store._hold(5, 10)  # the slow peer's rank 5: version 10 arrives and lands
                store._peers_rounds.landed(5, 10)
            if v in (12, 15, 18, 21):
                store._hold(6, v)  # the fast peer's rank 6
                store._peers_rounds.landed(6, v)
        held = {v for v, p in copies(tmp_path, 0) if p.name.startswith("held-")}
        assert held == {10, 18, 21}, held


def test_a_restore_forgets_the_abandoned_timelines_peer_rounds(tmp_path: Path) -> None:
    """Found in review: after a restore at 20, the peer's rounds of the old timeline (56, 60) stayed the ones to
    keep, so the new timeline's 24 and 28 were neither held nor kept from being reused."""
    with quiet_store(tmp_path) as store:
        store.stride.value = 64
        for v in range(0, 61):
            store.handle({"op": "sealed", "rank": 0, "version": v, "file": str(seal(tmp_path, 0, v, fill=1))})
            if v % 4 == 0 and v:
                store._hold(5, v)
                store._peers_rounds.landed(5, v)
        store.discard(0, 20)  # the job restored version 20
        for v in range(21, 32):  # the new timeline, the peer replicating 24 and 28 again
            store.handle({"op": "sealed", "rank": 0, "version": v, "file": str(seal(tmp_path, 0, v, fill=2))})
            if v in (24, 28):
                store._hold(5, v)
                store._peers_rounds.landed(5, v)
        assert {24, 28} <= {v for v, _ in copies(tmp_path, 0)}
        assert store._peers_rounds.needed() == {28}


class _StallingPeer:
    """A peer store that proves the secret and takes puts (checking each body against ``expect``), but while
    ``stall`` is set reads nothing more: a peer that stopped (SIGSTOP, a hung node) as far as a sender can tell."""

    def __init__(self) -> None:
        # Its receive buffer stays small, as a stopped peer's fills: loopback's autotuning would grow it to
        # tcp_rmem's most (32 MB here), and a body that fits stalls nothing mid-way (a CI flake).
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # accepted connections inherit it
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.stall = threading.Event()
        self.bodies: list[tuple[int, bytes]] = []  # (version, body) of each put taken
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            server_handshake(conn, SECRET)
            conn.settimeout(None)
            while True:
                header = recv_header(conn)
                body = bytearray()
                while len(body) < header["nbytes"]:
                    while self.stall.is_set():
                        time.sleep(0.01)
                    chunk = conn.recv(min(1 << 16, header["nbytes"] - len(body)))
                    if not chunk:
                        return
                    body += chunk
                while self.stall.is_set():
                    time.sleep(0.01)
                self.bodies.append((header["version"], bytes(body)))
                wire_send(conn, {"ok": True})

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("floats", [64, 8 << 20])  # stalled on the answer; stalled in the middle of the body
def test_a_ranks_notices_are_never_stuck_behind_a_stalled_peer_and_the_replica_finishes_where_it_stopped(
        tmp_path: Path, floats: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread that takes a rank's seal sends the replica while the link keeps up (issue 33): if the peer then
    stalls, it must not wait with it (the rank's next notices, the governor and the holds need it); the replicate
    thread finishes the send from the byte where it stopped, on the same connection, once the peer reads again."""
    left: list[Unfinished] = []  # what the notice thread left to the replicate thread
    finish = PeerLink.finish
    monkeypatch.setattr(PeerLink, "finish", lambda link, rest: (left.append(rest), finish(link, rest))[1])
    monkeypatch.setattr(Stride, "round_done", lambda stride, seconds: None)  # every version (no stride on busy cores)
    peer = _StallingPeer()
    root = tmp_path / "node0"
    store = Store(StoreConfig(root=root, node=0, addresses=["127.0.0.1:1", peer.address], journal=tmp_path / "j0.jsonl",
                              replication=ReplicationConfig(replicas=1), secret=SECRET, world_size=8))
    buf = SnapshotBuffer(root, 0)
    buf.allocate(floats, 4096)

    def seal_notice(v: int) -> None:
        slot = buf.slot_for(v)
        slot.begin(v)
        slot.data().fill_(v)
        slot.complete(v, b"m")
        store.handle({"op": "sealed", "rank": 0, "version": v, "file": str(buf.path(slot_of(v)))})

    def replicated() -> list[int]:
        return [e["version"] for e in journaled(tmp_path / "j0.jsonl", "replicated")]

    try:
        v, whole = 0, 0
        while whole < 1:  # the first replicas probe the link in pieces; the first whole one makes a connection
            whole += not store.link.paced()
            seal_notice(v)
            wait_for(lambda v=v: v in replicated())
            v += 1
        peer.stall.set()
        t0 = time.monotonic()
        seal_notice(v)  # this notice's thread sends it whole, and the peer stops reading
        seal_notice(v + 1)
        assert time.monotonic() - t0 < 5, "a notice waited for a stalled peer"  # (IO_TIMEOUT is 30 s)
        assert {v, v + 1} <= set(store._sealed[0])
        peer.stall.clear()
        wait_for(lambda: v in replicated())
        nbytes = next(e["bytes"] for e in journaled(tmp_path / "j0.jsonl", "replicated") if e["version"] == v)
        kept = {ver: path for ver, path in copies(root, 0) if path.name.startswith("kept-")}
        with open(kept[v], "rb") as f:
            expected = f.read(nbytes)
        assert dict(peer.bodies)[v] == expected  # in step: the rest went from the byte where the first send stopped
        left = [rest for rest in left if rest.started]  # (not: the first whole one, for a new connection)
        assert [rest.version for rest in left] == [v]
        if floats < 1 << 20:  # it all fit in the sockets' buffers: only the answer was left to wait for
            assert left[0].sent == len(left[0].frame) + nbytes
        else:  # the sockets' buffers hold a few MB: it stopped in the middle (or at the start) of the body
            assert left[0].sent < len(left[0].frame) + nbytes
    finally:
        store.close()
        buf.close()
        peer.close()
