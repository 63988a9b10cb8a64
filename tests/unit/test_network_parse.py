"""tc rate spelling (parse_rate, format_rate), and the netem detection on both kinds of kernel: the
host's ``ip``/``tc`` are faked, so both branches are tested whatever this machine's kernel has (no subprocess)."""
from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.errors import ScenarioError
from harness.scenario import parse
from injectors import link, network
from injectors.link import DelayConfig, LinkInjector
from injectors.network import (
    _RATE_UNITS,
    IFNAME,
    CommandFailed,
    NetworkTopology,
    NetworkUnavailable,
    format_rate,
    parse_rate,
)


@pytest.mark.parametrize(("text", "bits"), [
    ("100mbit", 100_000_000),
    ("100", 100),
    ("100bit", 100),
    ("1kbit", 1000),
    ("1kibit", 1024),
    ("1Kibit", 1024),
    ("2gbit", 2_000_000_000),
    ("1gibit", 1024**3),
    ("1tbit", 10**12),
    ("1bps", 8),
    ("1kbps", 8000),  # tc: kbps is kiloBYTES per second
    ("1KBps", 8000),
    ("12.5MBps", 100_000_000),
    ("1mibps", 8 * 1024**2),
    ("1.5mbit", 1_500_000),
    (".5kbit", 500),
    ("1e6", 1_000_000),
    ("1E2MBIT", 100_000_000),
    (" 10mbit ", 10_000_000),
])
def test_parse_rate_follows_tc(text: str, bits: int) -> None:
    assert parse_rate(text) == bits


@pytest.mark.parametrize("text", [
    "", "mbit", "abc", "100 mbit", "100mbits", "100mb", "-5mbit", "0bit", "0", "0.1bit", "1.5.3mbit",
    "nan", "inf", "0x10", "1e", "1e400mbit", "10 0",
])
def test_parse_rate_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rate(text)


def test_parse_rate_rejects_non_strings() -> None:
    with pytest.raises(ValueError):
        parse_rate(100)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_format_rate_rejects_non_positive_ints(bad: object) -> None:
    with pytest.raises(ValueError):
        format_rate(bad)  # type: ignore[arg-type]


def test_format_rate_uses_the_largest_exact_unit() -> None:
    assert format_rate(100_000_000) == "100mbit"
    assert format_rate(1_500_000) == "1500kbit"
    assert format_rate(1001) == "1001bit"
    assert format_rate(3 * 10**12) == "3tbit"


@given(st.integers(min_value=1, max_value=10**15))
def test_format_then_parse_round_trips(bits: int) -> None:
    assert parse_rate(format_rate(bits)) == bits


@given(st.integers(min_value=1, max_value=10**6),
       st.sampled_from(sorted(u for u, s in _RATE_UNITS.items() if s == int(s))),
       st.booleans())
def test_every_unit_scales_an_integer(n: int, unit: str, upper: bool) -> None:
    spelled = f"{n}{unit.upper() if upper else unit}"
    assert parse_rate(spelled) == n * int(_RATE_UNITS[unit])


# --- netem: detected, then used or refused ----------------------------------------------------------

NO_NETEM = "Error: Specified qdisc kind is unknown."  # what tc says on a kernel without sch_netem


class FakeHost:
    """Root with iproute2 whose commands are recorded instead of run; ``netem``: the kernel has sch_netem.
    It keeps the root qdisc of each (namespace, device), so ``tc -j qdisc show`` answers like tc."""

    def __init__(self, netem: bool) -> None:
        self.netem = netem
        self.calls: list[list[str]] = []
        self.root: dict[tuple[str | None, str], str] = {}

    def run(self, cmd: list[str], **_: Any) -> str:
        self.calls.append(list(cmd))
        ns = cmd[2] if cmd[:2] == ["tc", "-n"] else None
        args = cmd[3:] if ns else cmd[1:]
        if cmd[0] == "tc" and args[:1] == ["-j"]:  # -j qdisc show dev DEV root
            kind = self.root.get((ns, args[4]))
            return json.dumps([{"kind": kind}] if kind else [])
        if cmd[0] == "tc" and args[0] == "qdisc":
            op, dev, rest = args[1], args[3], args[4:]
            if rest[:1] == ["parent"]:  # a child under the root (tbf's priority queue): the root stays
                return ""
            rest = rest[1:]  # "root"
            if rest[:1] == ["handle"]:
                rest = rest[2:]
            kind = rest[0] if rest else None
            if kind == "netem" and not self.netem:
                raise CommandFailed(cmd, 2, NO_NETEM)
            if op in ("add", "replace"):
                self.root[(ns, dev)] = kind
            elif op == "del":
                self.root.pop((ns, dev), None)
        return ""

    def netem_commands(self) -> list[list[str]]:
        return [c for c in self.calls if "netem" in c]


def fake_host(monkeypatch: pytest.MonkeyPatch, netem: bool) -> FakeHost:
    fake = FakeHost(netem)
    monkeypatch.setattr(network, "_run", fake.run)
    monkeypatch.setattr(network, "_netem", None)  # not probed yet in this "process"
    monkeypatch.setattr(network, "require_network_privileges", lambda: None)
    monkeypatch.setattr(link, "require_network_privileges", lambda: None)
    return fake


@pytest.fixture(params=[True, False], ids=["kernel-with-netem", "kernel-without-netem"])
def host(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    return fake_host(monkeypatch, request.param)


def fake_topology(nodes: int = 2) -> NetworkTopology:
    """A NetworkTopology's state without creating one (its setup is tested as root in tests/e2e/test_network.py)."""
    t = object.__new__(NetworkTopology)
    t.nodes, t.tag, t.subnet, t._shaping, t._partitioned = nodes, "t0", None, {}, set()
    return t


def delay_scenario() -> dict[str, Any]:
    return {"name": "delayed", "workload": {"model": "gpt-tiny", "stages": 2, "microbatches": 4, "steps": 20, "nodes": 2},
            "checkpoint": {"strategy": "baft", "every": 50, "baft": {"replication": {"replicas": 1}}},
            "faults": [{"delay": {"link": ["node0", "node1"], "ms": 20, "from_step": 5}}], "expect": {"bitwise": True}}


def test_netem_is_probed_once_in_a_throwaway_namespace(host: FakeHost) -> None:
    assert network.netem_available() is host.netem
    ns = host.calls[0][3]
    assert host.calls[0] == ["ip", "netns", "add", ns] and ns.startswith("baft-") and ns.endswith("-probe")
    assert host.netem_commands() == [["tc", "-n", ns, "qdisc", "add", "dev", "p0", "root", "netem", "delay", "1ms"]]
    assert host.calls[-1] == ["ip", "netns", "del", ns]  # removed whether tc could add netem or not
    probed = len(host.calls)
    assert network.netem_available() is host.netem and len(host.calls) == probed  # cached


def test_a_delay_fault_runs_netem_where_the_kernel_has_it_and_is_refused_clearly_where_not(host: FakeHost) -> None:
    cfg = DelayConfig(link=["node0", "node1"], ms=20, from_step=5)
    if not host.netem:
        with pytest.raises(NetworkUnavailable) as e:
            network.require_netem("add 20 ms of delay")
        msg = str(e.value)
        assert "no netem qdisc (sch_netem)" in msg and "cannot add 20 ms of delay" in msg and f"tc said: {NO_NETEM}" in msg
        assert "CONFIG_NET_SCH_NETEM" in msg  # and what to do about it
        with pytest.raises(NetworkUnavailable, match="cannot add 20 ms of delay to link"):
            cfg.preflight()
        with pytest.raises(ScenarioError) as refused:  # `baft validate` / `baft run`: before anything starts
            parse(delay_scenario(), "delayed.yaml")
        assert "faults[0].delay" in str(refused.value) and "netem" in str(refused.value)
        assert parse(delay_scenario(), "delayed.yaml", host=False).faults[0].kind == "delay"  # a cluster's kernel decides
        return
    network.require_netem("add 20 ms of delay")
    cfg.preflight()
    assert parse(delay_scenario(), "delayed.yaml").faults[0].config.ms == 20
    topo = fake_topology()
    probe = len(host.calls)
    inj = LinkInjector(cfg, 0, topo, lambda *a, **k: None)
    inj.inject()
    assert host.calls[probe:] == [["tc", "-n", topo.namespace(n), "qdisc", "replace", "dev", IFNAME, "root", "netem",
                                   "delay", "20ms"] for n in (0, 1)]
    assert all(topo.egress_qdisc(n) == "netem" for n in (0, 1))
    before = len(host.calls)
    inj.rollback()
    assert [c for c in host.calls[before:] if "-j" not in c] == [
        ["tc", "-n", topo.namespace(n), "qdisc", "del", "dev", IFNAME, "root"] for n in (0, 1)]
    assert all(topo.egress_qdisc(n) == "noqueue" for n in (0, 1))


def test_undelay_restores_the_throttle_a_node_had(monkeypatch: pytest.MonkeyPatch) -> None:
    host = fake_host(monkeypatch, netem=True)  # delay is only reached where netem is
    topo = fake_topology()
    topo.throttle(1, 50_000_000)
    topo.delay(1, 7.5)
    assert topo.egress_qdisc(1) == "netem" and host.netem_commands()[-1][-2:] == ["delay", "7.5ms"]
    topo.undelay(1)
    assert topo.egress_qdisc(1) == "tbf"
