"""Real network namespaces, veths, a bridge and tc qdiscs: topology, throttle, partition, cleanup.

Needs root. Every test removes what it created, also when it fails; the module's
topology is checked to leave nothing behind.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from injectors import network
from injectors.linkprobe import _transfer, reachable
from injectors.network import CommandFailed, NetworkTopology, NetworkUnavailable

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.netns,
    pytest.mark.serial,
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for network namespaces and tc"),
]

ROOT = Path(__file__).resolve().parents[2]


def leftovers(tag: str) -> list[str]:
    """Namespaces and root-namespace links whose names carry the tag."""
    needle = f"baft-{tag}-"
    names = [e["name"] for e in json.loads(subprocess.run(["ip", "-j", "netns", "list"], capture_output=True,
                                                           text=True, check=True).stdout or "[]")]
    links = [e["ifname"] for e in json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True,
                                                            text=True, check=True).stdout or "[]")]
    return [n for n in names + links if n.startswith(needle)]


@pytest.fixture(scope="module")
def topo() -> Iterator[NetworkTopology]:
    t = NetworkTopology(3)
    try:
        yield t
    finally:
        t.close()
    assert leftovers(t.tag) == []


@pytest.fixture
def net(topo: NetworkTopology) -> Iterator[NetworkTopology]:
    """The module topology, with every fault rolled back after the test whatever happened."""
    try:
        yield topo
    finally:
        for i in range(topo.nodes):
            topo.heal(i)
            topo.unthrottle(i)


def test_topology_namespaces_exist_and_nodes_connect(net: NetworkTopology) -> None:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    for i in range(net.nodes):
        assert net.namespace(i) in names
        addrs = subprocess.run([*net.exec_prefix(i), "ip", "-j", "-4", "addr", "show", "dev", net.interface(i)],
                               capture_output=True, text=True, check=True).stdout
        assert net.address(i) in addrs
        assert net.egress_qdisc(i) == "noqueue"
    assert len({net.address(i) for i in range(net.nodes)} | {net.host_address}) == net.nodes + 1
    for src, dst in [(0, 1), (1, 2), (2, 0)]:
        assert reachable(net, src, dst), f"node {src} cannot reach node {dst}"


def tc_stats(net: NetworkTopology, i: int) -> dict[str, dict]:
    """Node i's qdiscs by kind, as ``tc -s`` reports them: options (a tbf's ``rate`` in bytes/s, ``burst``)
    and the counters (``bytes`` and ``packets`` sent on, ``qlen`` packets queued)."""
    out = subprocess.run([*net.exec_prefix(i), "tc", "-s", "-j", "qdisc", "show", "dev", net.interface(i)],
                         capture_output=True, text=True, check=True).stdout
    return {q["kind"]: q for q in json.loads(out)}


def transfer(net: NetworkTopology, src: int, dst: int, nbytes: int) -> None:
    """Move ``nbytes`` over TCP from node src to node dst, all of them arriving (the time it took is not
    looked at: a rate is ``baft bench``'s, on a machine it has to itself)."""
    got, _seconds = _transfer(net, src, dst, nbytes, timeout=30.0)
    assert got == nbytes, f"node {dst} received {got} of {nbytes} bytes"


def test_throttle_installs_a_shaper_that_carries_the_traffic_and_unthrottle_removes_it(net: NetworkTopology) -> None:
    """What the throttle set up and that the traffic went through it, by tc's own configuration and counters.
    That the shaper holds packets back is shown by the queue test below; the rate a link reaches is
    ``baft bench``'s (a rate measured on CI's shared cores once fell short of a bound)."""
    assert net.egress_qdisc(0) == "noqueue"
    shaping = net.throttle(0, network.parse_rate("100mbit"))
    assert shaping.rate_bit == 100_000_000
    assert net.egress_qdisc(0) == "tbf"
    tbf = tc_stats(net, 0)["tbf"]
    assert tbf["options"]["rate"] * 8 == 100_000_000 and tbf["options"]["burst"] == shaping.burst_bytes, tbf
    transfer(net, 0, 1, 4_000_000)
    after = tc_stats(net, 0)
    assert after["tbf"]["bytes"] - tbf["bytes"] >= 4_000_000, after  # every byte left through the shaper
    assert after["pfifo_fast"]["bytes"] == after["tbf"]["bytes"], after  # by way of its priority queue
    net.unthrottle(0)
    net.unthrottle(0)  # nothing left to remove is fine
    assert net.egress_qdisc(0) == "noqueue" and set(tc_stats(net, 0)) <= {"noqueue"}
    transfer(net, 0, 1, 4_000_000)  # and the link carries traffic without it


def qdiscs(net: NetworkTopology, i: int) -> list[tuple[str, str]]:
    """(kind, parent) of every qdisc on node i's interface."""
    out = subprocess.run([*net.exec_prefix(i), "tc", "-j", "qdisc", "show", "dev", net.interface(i)],
                         capture_output=True, text=True, check=True).stdout
    return [(q["kind"], q.get("parent", "root") if not q.get("root") else "root") for q in json.loads(out)]


_ORDER_RECEIVER = r"""
import json, socket, sys
addr, want = sys.argv[1], set(sys.argv[2].split(","))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((addr, 0))
s.settimeout(30)
print(s.getsockname()[1], flush=True)
order = []
while not want <= set(order):
    order.append(s.recv(2048).split(b" ")[0].decode())
print(json.dumps(order), flush=True)
"""

_ORDER_SENDER = r"""
import socket, sys
addr, port, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
normal = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
filler = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
filler.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, 1)  # as the stores mark replicas
pad = b" " + bytes(1400)
normal.sendto(b"P" + pad, (addr, port))  # spends the bucket: what follows waits in the queue
for i in range(k):
    filler.sendto(f"F{i}".encode() + pad, (addr, port))
    normal.sendto(f"N{i}".encode() + pad, (addr, port))
print("queued", flush=True)
sys.stdin.readline()
normal.sendto(b"T" + pad, (addr, port))  # wakes the shaper now rather than at its next token
"""


def arrival_order(net: NetworkTopology, classes: bool, k: int) -> list[str]:
    """Queue k filler packets (F0..) and k ordinary ones (N0..), sent alternately, behind node 0's shaper
    while it lets nothing out; then open it and return the order node 1 got them in.

    The shaper is closed by a rate of 1 kbit/s with a 1600-byte bucket that a first packet spends (the
    next may leave some 10 s later). That all 2k packets were still queued when the rate is raised is read
    from tc's counters, not assumed from the time the sender took."""
    assert reachable(net, 0, 1)  # node 1's address resolved: no ARP among the queued packets
    net.throttle(0, 1000, burst_bytes=1600, latency_ms=200_000, classes=classes)  # tbf's own FIFO holds 2k
    want = ",".join([f"F{i}" for i in range(k)] + [f"N{i}" for i in range(k)])
    py = [sys.executable, "-S", "-c"]
    addr = net.address(1)
    receiver = subprocess.Popen([*net.exec_prefix(1), *py, _ORDER_RECEIVER, addr, want], stdout=subprocess.PIPE,
                                text=True)
    sender = None
    try:
        assert receiver.stdout is not None
        port = receiver.stdout.readline().strip()
        sender = subprocess.Popen([*net.exec_prefix(0), *py, _ORDER_SENDER, addr, port, str(k)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert sender.stdout is not None and sender.stdout.readline().strip() == "queued"
        held = tc_stats(net, 0)["tbf"]
        assert held["qlen"] >= 2 * k, f"the shaper let packets out while they were being queued: {held}"
        net.throttle(0, network.parse_rate("20mbit"), classes=classes)  # tbf changed in place: the queue stays
        sender.communicate("go\n", timeout=30)
        out, _ = receiver.communicate(timeout=30)
    finally:
        for p in (sender, receiver):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert receiver.returncode == 0, out
    return [tag for tag in json.loads(out) if tag[0] in "FN"]


def test_a_throttled_link_serves_packets_by_priority_unless_told_not_to(net: NetworkTopology) -> None:
    """The stores mark replicas as filler (SO_PRIORITY 1); under the throttle a pfifo_fast queue sends
    band 2 (filler) only when bands 0 and 1 are empty. ``classes=False`` leaves tbf's own FIFO.
    Checked by the qdisc tree and the order in which packets queued together arrive, not by a rate."""
    rate = network.parse_rate("20mbit")
    net.throttle(0, rate)
    kinds = qdiscs(net, 0)
    assert ("tbf", "root") in kinds and any(k == "pfifo_fast" and p == "1:1" for k, p in kinds), kinds
    k = 5
    ordinary, filler = [f"N{i}" for i in range(k)], [f"F{i}" for i in range(k)]
    # sent F0 N0 F1 N1 ...: the ordinary packets overtake every queued filler one, each class in its own order
    assert arrival_order(net, classes=True, k=k) == ordinary + filler
    stats = tc_stats(net, 0)
    assert stats["pfifo_fast"]["packets"] == stats["tbf"]["packets"], stats  # all of it through the child
    net.throttle(0, rate, classes=False)
    assert [k for k, _ in qdiscs(net, 0)] == ["tbf"]
    assert arrival_order(net, classes=False, k=k) == [t for pair in zip(filler, ordinary) for t in pair]  # as sent


def test_partition_cuts_both_ways_and_heal_restores(net: NetworkTopology) -> None:
    net.partition(1)
    assert net.egress_qdisc(1) == "blackhole"
    # False, not an error: the probe's connect gave up at its timeout (Unreachable). Had it waited out TCP's
    # retries (minutes) instead, the sender would be killed and reachable() raise, or the test time out.
    assert not reachable(net, 0, 1, timeout=1.5)
    assert not reachable(net, 1, 2, timeout=1.5)
    assert reachable(net, 0, 2), "a partition of node 1 must not cut node 0 from node 2"
    net.heal(1)
    net.heal(1)  # healing twice is fine
    assert reachable(net, 0, 1) and reachable(net, 1, 2)


def test_heal_keeps_a_throttle_set_before_the_partition(net: NetworkTopology) -> None:
    net.throttle(2, 50_000_000)
    net.partition(2)
    assert net.egress_qdisc(2) == "blackhole"
    net.heal(2)
    assert [kind for kind, _ in qdiscs(net, 2)] == ["tbf", "pfifo_fast"]
    before = tc_stats(net, 2)["tbf"]
    assert before["options"]["rate"] * 8 == 50_000_000, before
    transfer(net, 2, 0, 2_000_000)
    assert tc_stats(net, 2)["tbf"]["bytes"] - before["bytes"] >= 2_000_000  # the traffic goes through it


def test_close_removes_everything_and_is_idempotent() -> None:
    t = NetworkTopology(2)
    try:
        assert len(leftovers(t.tag)) == 2 + 2 + 1  # namespaces, host veths, bridge
    finally:
        t.close()
    assert leftovers(t.tag) == []
    t.close()


def test_setup_failure_midway_cleans_up(monkeypatch: pytest.MonkeyPatch) -> None:
    tag = secrets.token_hex(3)
    real_run = network._run

    def failing(cmd: list[str], **kw: object) -> str:
        if cmd[:3] == ["ip", "link", "add"] and "veth" in cmd:
            raise CommandFailed(cmd, 2, "injected failure")
        return real_run(cmd, **kw)

    monkeypatch.setattr(network, "_run", failing)
    try:
        with pytest.raises(CommandFailed, match="injected failure"):
            NetworkTopology(2, tag=tag)
    finally:
        monkeypatch.undo()
        left = leftovers(tag)
        network.cleanup_stale(prefix=f"baft-{tag}-", force=True)
    assert left == []


def test_cleanup_stale_removes_a_crashed_topology_but_not_a_live_one() -> None:
    tag = secrets.token_hex(3)
    code = f"from injectors.network import NetworkTopology; t = NetworkTopology(2, tag={tag!r}); print('up', flush=True); input()"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    live = NetworkTopology(1)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        proc.kill()
        proc.wait()
        assert len(leftovers(tag)) == 5
        listed = network.stale_names(prefix=f"baft-{tag}-")  # a dry run lists and leaves everything
        assert len(listed) == 5 and len(leftovers(tag)) == 5 and network.stale_names(prefix=f"baft-{live.tag}-") == []
        removed = network.cleanup_stale(prefix=f"baft-{tag}-")
        assert sorted(removed) == sorted(listed) == sorted([f"baft-{tag}-n0", f"baft-{tag}-n1", f"baft-{tag}-h0", f"baft-{tag}-h1",
                                          f"baft-{tag}-br"])
        assert leftovers(tag) == []
        assert network.cleanup_stale(prefix=f"baft-{live.tag}-") == []
        assert len(leftovers(live.tag)) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        network.cleanup_stale(prefix=f"baft-{tag}-", force=True)
        live.close()


def test_the_netem_probe_tells_the_truth_about_this_kernel(net: NetworkTopology, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real probe, on whichever kernel this is (both answers, and what follows from each, are tested
    with a faked tc in tests/unit/test_network_parse.py): it leaves no namespace behind, and a real node
    agrees with it: with netem a delay installs it, without netem tc refuses it as the probe found."""
    monkeypatch.setattr(network, "_netem", None)  # probe afresh
    before = network._netns_names()
    available = network.netem_available()
    assert not [n for n in network._netns_names() - before if n.endswith("-probe")]
    if available:
        net.delay(0, 30)
        assert net.egress_qdisc(0) == "netem"
        net.undelay(0)
        network.require_netem("add delay")
    else:
        with pytest.raises(CommandFailed, match="netem"):
            net.delay(0, 30)
        with pytest.raises(NetworkUnavailable, match="cannot add 20ms delay"):
            network.require_netem("add 20ms delay")
    assert net.egress_qdisc(0) == "noqueue"


def test_failed_commands_name_the_command_and_its_stderr() -> None:
    with pytest.raises(CommandFailed) as e:
        network._run(["ip", "link", "del", "dev", "baft-nosuch0"])
    assert "ip link del dev baft-nosuch0" in str(e.value)
    assert "Cannot find device" in str(e.value)


def test_bad_arguments_fail_before_anything_is_created(topo: NetworkTopology) -> None:
    with pytest.raises(network.FaultConfigError):
        NetworkTopology(0)
    with pytest.raises(network.FaultConfigError):
        NetworkTopology(2, tag="Bad-Tag")
    with pytest.raises(network.FaultConfigError):
        topo.throttle(topo.nodes, 1_000_000)
    with pytest.raises(network.FaultConfigError):
        topo.throttle(0, 0)


def test_a_taken_tag_is_refused_without_touching_the_existing_topology(topo: NetworkTopology) -> None:
    before = leftovers(topo.tag)
    with pytest.raises(network.NetworkError, match="already exists"):
        NetworkTopology(1, tag=topo.tag)
    assert leftovers(topo.tag) == before
