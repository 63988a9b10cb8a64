"""Link faults between node namespaces: throttle, partition, delay.

They act on the infrastructure, not inside a worker, so the harness drives
them: it follows the job's progress in the journal and calls ``inject`` when
the window opens and ``rollback`` when it closes or the run ends (always, in a
``finally``). Each needs root (network namespaces and ``tc``); a scenario with
link faults runs every node in its own namespace (see :mod:`injectors.network`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from .base import Recorder, RunShape
from .errors import FaultConfigError
from .linkprobe import measure_throttle
from .network import NetworkTopology, format_rate, parse_rate, require_netem, require_network_privileges
from .trigger import WindowFault

NodeRef = int | str
"""A node as an index (``1``) or a name (``node1``)."""


def node_index(ref: NodeRef) -> int:
    if isinstance(ref, int) and not isinstance(ref, bool):
        return ref
    m = re.fullmatch(r"node(\d+)", str(ref))
    if m is None:
        raise FaultConfigError("link", "nodes as indices or names like node0", ref)
    return int(m.group(1))


@dataclass(kw_only=True, slots=True)
class LinkFault(WindowFault):
    """A fault on the link between two nodes (or on one node's uplink)."""

    site: ClassVar[Literal["worker", "harness"]] = "harness"
    link: list[NodeRef]
    """The two nodes the link joins, e.g. ``[node0, node1]``; each one's outgoing traffic is affected
    (on a star of namespaces, that is all of the node's traffic, to every node)."""

    def check(self, run: RunShape) -> None:
        WindowFault.check(self, run)
        nodes = [node_index(n) for n in self.link]
        if len(nodes) != 2 or nodes[0] == nodes[1] or not all(0 <= n < run.nodes for n in nodes):
            raise FaultConfigError("link", f"two different nodes among node0..node{run.nodes - 1}", self.link)

    def preflight(self) -> None:
        require_network_privileges()

    @property
    def nodes(self) -> list[int]:
        return [node_index(n) for n in self.link]


@dataclass(kw_only=True, slots=True)
class ThrottleConfig(LinkFault):
    """Shape the link to a rate with a token bucket (``tc qdisc tbf``); the rate actually
    achieved is measured with a real TCP transfer and journaled."""

    kind: ClassVar[str] = "throttle"
    rate: str = "100mbit"
    """Rate in tc's units: ``100mbit``, ``1gbit``, ``500kbit``; ``kbps`` and ``mbps`` are bytes/s."""
    burst: str | None = None
    """Bucket size in bytes (default: 10 ms of the rate, at least 16 KiB)."""
    measure: bool = True
    """Measure the throttled rate once it is in place (a ~2 s-bounded TCP transfer) and journal it."""

    def check(self, run: RunShape) -> None:
        LinkFault.check(self, run)
        try:
            parse_rate(self.rate)
        except ValueError:
            raise FaultConfigError("rate", "a tc rate such as 100mbit, 1gbit, 500kbit", self.rate) from None
        if self.burst is not None and not re.fullmatch(r"\d+", self.burst):
            raise FaultConfigError("burst", "a number of bytes", self.burst)


@dataclass(kw_only=True, slots=True)
class PartitionConfig(LinkFault):
    """Cut the link: everything either node sends or receives is dropped (a ``blackhole`` qdisc
    on both ends of its veth), as on a pulled cable. Collectives stall until the watchdog
    restarts the job or the window ends."""

    kind: ClassVar[str] = "partition"
    fatal: ClassVar[bool] = True  # the stalled job is restarted (by the watchdog), like after a crash
    side: NodeRef | None = None
    """The node that is cut off (default: the second node of ``link``)."""

    @property
    def victim(self) -> int:
        return node_index(self.side) if self.side is not None else self.nodes[1]


@dataclass(kw_only=True, slots=True)
class DelayConfig(LinkFault):
    """Add latency to the link with ``netem``. Refused up front on a kernel without netem
    (this project's development kernel has none): the error says so."""

    kind: ClassVar[str] = "delay"
    ms: float = 10.0
    """Added one-way delay in milliseconds."""

    def check(self, run: RunShape) -> None:
        LinkFault.check(self, run)
        if self.ms <= 0:
            raise FaultConfigError("ms", "milliseconds > 0", self.ms)

    def preflight(self) -> None:
        require_network_privileges()
        require_netem(f"add {self.ms:g} ms of delay to link {self.link}")


class LinkInjector:
    """Applies one link fault to a :class:`NetworkTopology`; ``record`` journals what happened."""

    def __init__(self, config: Any, fault_id: int, topo: NetworkTopology, record: Recorder) -> None:
        self.config, self.fault_id, self.topo, self.record = config, fault_id, topo, record

    def inject(self) -> None:
        c = self.config
        a, b = c.nodes
        if isinstance(c, ThrottleConfig):
            rate = parse_rate(c.rate)
            for n in (a, b):
                self.topo.throttle(n, rate, int(c.burst) if c.burst else None)
            if c.measure:
                measured = measure_throttle(self.topo, a, b, rate)
                self.record("link_measured", id=self.fault_id, rate_bit=rate, measured_bit=round(measured),
                            measured=format_rate(int(measured)))
        elif isinstance(c, PartitionConfig):
            self.topo.partition(c.victim)
        elif isinstance(c, DelayConfig):  # only reached where preflight found netem
            for n in (a, b):
                self.topo.delay(n, c.ms)

    def rollback(self) -> None:
        c = self.config
        if isinstance(c, ThrottleConfig):
            for n in c.nodes:
                self.topo.unthrottle(n)
        elif isinstance(c, PartitionConfig):
            self.topo.heal(c.victim)
        elif isinstance(c, DelayConfig):
            for n in c.nodes:
                self.topo.undelay(n)
