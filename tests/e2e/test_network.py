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
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from injectors import network
from injectors.linkprobe import measure_rate, reachable
from injectors.network import CommandFailed, NetworkTopology, NetworkUnavailable

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.netns,
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for network namespaces and tc"),
]

ROOT = Path(__file__).resolve().parents[2]
FAST = 500e6  # an unshaped veth pair through a bridge moves several Gbit/s here


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


def test_throttle_limits_rate_and_unthrottle_restores_it(net: NetworkTopology) -> None:
    assert measure_rate(net, 0, 1, nbytes=20_000_000) > FAST
    shaping = net.throttle(0, network.parse_rate("100mbit"))
    assert shaping.rate_bit == 100_000_000
    assert net.egress_qdisc(0) == "tbf"
    rate = measure_rate(net, 0, 1, nbytes=4_000_000)
    # The throttle is the upper bound; the lower one only says it is not a trickle, and is low because a
    # Python sender on busy shared cores falls well short of the bucket's rate.
    assert 20e6 < rate < 110e6, f"throttled to 100 Mbit/s, measured {rate / 1e6:.1f} Mbit/s"
    net.unthrottle(0)
    net.unthrottle(0)  # nothing left to remove is fine
    assert net.egress_qdisc(0) == "noqueue"
    assert measure_rate(net, 0, 1, nbytes=20_000_000) > FAST


def qdiscs(net: NetworkTopology, i: int) -> list[tuple[str, str]]:
    """(kind, parent) of every qdisc on node i's interface."""
    out = subprocess.run([*net.exec_prefix(i), "tc", "-j", "qdisc", "show", "dev", net.interface(i)],
                         capture_output=True, text=True, check=True).stdout
    return [(q["kind"], q.get("parent", "root") if not q.get("root") else "root") for q in json.loads(out)]


def test_a_throttled_link_serves_packets_by_priority_unless_told_not_to(net: NetworkTopology) -> None:
    """The stores mark replicas as filler (SO_PRIORITY 1); under the throttle a pfifo_fast queue sends
    band 2 (filler) only when bands 0 and 1 are empty. ``classes=False`` leaves tbf's own FIFO."""
    rate = network.parse_rate("20mbit")
    net.throttle(0, rate)
    kinds = qdiscs(net, 0)
    assert ("tbf", "root") in kinds and any(k == "pfifo_fast" and p == "1:1" for k, p in kinds), kinds
    assert 15e6 < measure_rate(net, 0, 1, nbytes=2_000_000) < 22e6  # still shaped through the child
    net.throttle(0, rate, classes=False)
    assert [k for k, _ in qdiscs(net, 0)] == ["tbf"]


def test_partition_cuts_both_ways_and_heal_restores(net: NetworkTopology) -> None:
    net.partition(1)
    assert net.egress_qdisc(1) == "blackhole"
    start = time.monotonic()
    assert not reachable(net, 0, 1, timeout=1.5)
    # It gave up at its timeout instead of waiting out TCP's retries (minutes); the margin over 1.5 s is wide
    # because starting the probe's processes in the namespaces is slow on a loaded machine.
    assert time.monotonic() - start < 15.0
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
    assert net.egress_qdisc(2) == "tbf"
    assert measure_rate(net, 2, 0, nbytes=2_000_000) < 60e6


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
