"""Network plumbing for multi-node runs on one host: namespaces, a bridge, and link faults.

Each harness "node" (a torchrun agent with its workers, plus the node's checkpoint
store) runs in its own network namespace, wired to a Linux bridge in the root
namespace by a veth pair. Link faults are then ordinary qdiscs on those veths:

- ``throttle``: a ``tbf`` qdisc on the node's in-namespace interface, so all of its
  outgoing traffic is shaped (measured 95 Mbit/s for 100 Mbit/s on this host). Under
  it, a ``pfifo_fast`` queue serves packets by their socket priority, strict priority
  like a NIC's traffic classes: what a socket marks as filler (the stores' replicas,
  ``SO_PRIORITY`` 1) leaves only when no training packet is queued.
- ``partition``: a ``blackhole`` qdisc on both ends of the node's veth. Packets are
  silently dropped in both directions, as on a cut cable: connects time out and
  open TCP connections stall, rather than failing fast with "network unreachable"
  as a downed interface would. It is removed by deleting the qdisc. (This kernel
  has no tc classifiers or actions and no iptables/nft, so drop filters are out.)
- delay and loss need ``netem``; :func:`require_netem` says clearly when the kernel
  lacks it (the measured development kernel does).

Everything is done with the ``ip`` and ``tc`` binaries (iproute2) so each step can be
repeated by hand from the error message. Everything created can be removed
idempotently: :meth:`NetworkTopology.close` after any partial setup, and
:func:`cleanup_stale` for what a crashed run left behind.
"""
from __future__ import annotations

import ipaddress
import json
import math
import os
import platform
import re
import secrets
import shutil
import signal
import subprocess
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from .errors import FaultConfigError, HostUnsupported, InjectorError

PREFIX = "baft-"
"""Every namespace and root-namespace link this module creates starts with this."""
IFNAME = "baft0"
"""The node's interface inside its namespace (the same name in every node: GLOO_SOCKET_IFNAME=baft0).
Distinct from any root-namespace name, so a process accidentally started outside its
namespace fails loudly instead of binding to the host's interface."""
SUBNETS = ipaddress.IPv4Network("10.213.0.0/16")
"""Each topology takes one /24 of this range (node i is .i+1, the bridge .254)."""
_IFNAMSIZ = 15
_NAME_RE = re.compile(r"^baft-([0-9a-z]+)-(br|n\d+|h\d+|probe)$")
_OURS = {"tbf", "blackhole", "netem"}
_SBIN = os.pathsep.join(["/usr/local/sbin", "/usr/sbin", "/sbin"])


class NetworkError(InjectorError):
    """A network namespace, link or qdisc operation failed."""


class CommandFailed(NetworkError):
    """An ``ip``/``tc`` command exited non-zero; the message carries the command and its stderr."""

    def __init__(self, cmd: Sequence[str], returncode: int, stderr: str) -> None:
        self.cmd, self.returncode, self.stderr = list(cmd), returncode, stderr.strip()
        super().__init__(f"command failed (exit {returncode}): {' '.join(self.cmd)}: {self.stderr or '(no stderr)'}")


class NetworkUnavailable(NetworkError, HostUnsupported):
    """This host cannot do network faults (no root, no iproute2, or a kernel feature missing)."""


# --- tc rates -------------------------------------------------------------------------------------

_RATE_UNITS: dict[str, float] = {
    # tc(8), "RATES": bare number or "bit" = bits/s; SI and IEC prefixes; "bps" = *bytes*/s.
    "bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
    "kibit": 1024.0, "mibit": 1024.0**2, "gibit": 1024.0**3, "tibit": 1024.0**4,
    "bps": 8.0, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12,
    "kibps": 8 * 1024.0, "mibps": 8 * 1024.0**2, "gibps": 8 * 1024.0**3, "tibps": 8 * 1024.0**4,
}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d+))?([a-zA-Z]*)\s*$")


def parse_rate(text: str) -> int:
    """Parse a tc rate ("100mbit", "12.5MBps", "1gibit", "800000") into bits per second.

    Follows tc's table and its case-insensitivity: ``kbit`` is 1000 bit/s, ``kibit``
    1024 bit/s, ``kbps`` 1000 *bytes*/s, a bare number is bit/s. Scenario files use
    the same spelling as a hand-typed ``tc`` command, so there is one meaning.
    Raises ValueError for anything else, or a rate below 1 bit/s.
    """
    if not isinstance(text, str):
        raise ValueError(f"rate must be a string like '100mbit', found {text!r}")
    m = _RATE_RE.match(text)
    unit = m.group(3).lower() if m else ""
    if m is None or (unit and unit not in _RATE_UNITS):
        raise ValueError(f"not a tc rate: {text!r} (expected a number and one of {', '.join(_RATE_UNITS)})")
    mantissa, exponent = m.group(1), m.group(2)
    value = float(f"{mantissa}e{exponent}" if exponent else mantissa) * _RATE_UNITS[unit or "bit"]
    if not math.isfinite(value) or round(value) < 1:
        raise ValueError(f"rate {text!r} is not a positive finite rate")
    return int(round(value))


def format_rate(rate_bit: int) -> str:
    """Spell a rate in bits/s as tc does, exactly (the largest SI bit unit that divides it)."""
    if isinstance(rate_bit, bool) or not isinstance(rate_bit, int) or rate_bit < 1:
        raise ValueError(f"rate must be a positive int of bits/s, found {rate_bit!r}")
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if rate_bit % scale == 0:
            return f"{rate_bit // scale}{unit}"
    return f"{rate_bit}bit"


# --- commands -------------------------------------------------------------------------------------

def _binary(name: str) -> str:
    """The absolute path of an iproute2 binary (root's PATH may lack /usr/sbin under sudo -E)."""
    found = shutil.which(name) or shutil.which(name, path=_SBIN)
    if found is None:
        raise NetworkUnavailable(f"network faults need the '{name}' command; install iproute2 "
                                 "(Debian/Ubuntu: apt-get install iproute2) or drop the network faults")
    return found


def _run(cmd: Sequence[str], *, timeout: float = 20.0) -> str:
    """Run one command; return its stdout or raise :class:`CommandFailed` naming it and its stderr."""
    argv = [_binary(cmd[0]) if cmd[0] in ("ip", "tc") else cmd[0], *cmd[1:]]
    try:
        done = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=timeout)
    except subprocess.CalledProcessError as e:
        raise CommandFailed(cmd, e.returncode, e.stderr or "") from None
    except subprocess.TimeoutExpired:
        raise CommandFailed(cmd, -1, f"timed out after {timeout} s") from None
    return done.stdout


def require_network_privileges() -> None:
    """Raise :class:`NetworkUnavailable` unless this process can create namespaces and qdiscs."""
    if os.geteuid() != 0:
        raise NetworkUnavailable("network faults need root (CAP_NET_ADMIN) to create network namespaces and tc "
                                 "qdiscs; run as root or drop the network faults")
    _binary("ip")
    _binary("tc")


def _netns_names() -> set[str]:
    out = _run(["ip", "-j", "netns", "list"]).strip()
    return {e["name"] for e in json.loads(out)} if out else set()


def _links() -> dict[str, dict]:
    """Links of the root namespace by name."""
    out = _run(["ip", "-j", "link", "show"]).strip()
    return {e["ifname"]: e for e in json.loads(out)} if out else {}


def _root_qdisc(dev: str, netns: str | None = None) -> str:
    """The kind of the root qdisc on ``dev`` ("noqueue" when nothing is installed on a veth)."""
    out = _run(["tc", *(["-n", netns] if netns else []), "-j", "qdisc", "show", "dev", dev, "root"]).strip()
    entries = json.loads(out) if out else []
    return entries[0]["kind"] if entries else "noqueue"


def _clear_root(dev: str, netns: str | None = None) -> None:
    """Delete a root qdisc this module installed; a default one (noqueue, pfifo_fast) stays."""
    if _root_qdisc(dev, netns) in _OURS:
        _run(["tc", *(["-n", netns] if netns else []), "qdisc", "del", "dev", dev, "root"])


def _kill_netns_processes(netns: str) -> None:
    """SIGKILL whatever still runs in a namespace, so it really goes away with its veths."""
    try:
        pids = _run(["ip", "netns", "pids", netns]).split()
    except CommandFailed:
        return
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        pass
    return True


def _still_linked(name: str) -> Callable[[], bool]:
    """Whether link ``name`` is still there, asked later."""
    return lambda: name in _links()


def _still_netns(name: str) -> Callable[[], bool]:
    """Whether namespace ``name`` is still there, asked later."""
    return lambda: name in _netns_names()


def _remove(kind: str, name: str, cmd: list[str], still_there: Callable[[], bool], errors: list[str]) -> None:
    """Run a delete; a failure counts only if the object is still there (another cleanup may have won)."""
    try:
        _run(cmd)
    except CommandFailed as e:
        if still_there():
            errors.append(f"{kind} {name}: {e}")


# --- netem ----------------------------------------------------------------------------------------

_netem: tuple[bool, str] | None = None


def netem_available() -> bool:
    """Whether the kernel has the netem qdisc (needed for delay and loss), probed once and cached.

    The probe adds ``netem`` to a veth inside a throwaway namespace, which also makes
    the kernel auto-load ``sch_netem`` if it exists as a module. Needs root (raises
    :class:`NetworkUnavailable` otherwise): without it nothing can be probed, and a
    network fault cannot run anyway.
    """
    global _netem
    if _netem is None:
        require_network_privileges()
        ns = f"{PREFIX}{secrets.token_hex(3)}-probe"
        _run(["ip", "netns", "add", ns])
        try:
            _run(["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"])
            try:
                _run(["tc", "-n", ns, "qdisc", "add", "dev", "p0", "root", "netem", "delay", "1ms"])
                _netem = (True, "")
            except CommandFailed as e:
                _netem = (False, e.stderr)
        finally:
            _run(["ip", "netns", "del", ns])
    return _netem[0]


def require_netem(what: str) -> None:
    """Raise :class:`NetworkUnavailable` saying that ``what`` (e.g. "add 20ms delay") needs netem."""
    if not netem_available():
        said = f" (tc said: {_netem[1]})" if _netem and _netem[1] else ""
        raise NetworkUnavailable(
            f"this kernel ({platform.release()}) has no netem qdisc (sch_netem): cannot {what}{said}; use a "
            "kernel built with CONFIG_NET_SCH_NETEM or drop delay/loss faults (bandwidth throttling and "
            "partitions work without netem)")


# --- topology -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Shaping:
    """A tbf throttle on one node's egress, remembered so heal() can restore it after a partition."""

    rate_bit: int
    burst_bytes: int
    latency_ms: float
    classes: bool = True
    """Serve queued packets by socket priority (a ``pfifo_fast`` child: bands 0, 1, 2; filler in band 2)."""


class NetworkTopology:
    """N nodes, each in its own network namespace, on one bridge; with link faults per node.

    Node i is namespace ``baft-<tag>-n<i>`` with interface :data:`IFNAME` at
    ``10.213.<s>.<i+1>/24``; its veth peer ``baft-<tag>-h<i>`` is a port of bridge
    ``baft-<tag>-br``, which holds ``.254`` so the root namespace (the harness) can
    reach every node. The bridge is created first and carries ``owner=<pid>`` as its
    alias, which is how :func:`cleanup_stale` tells a live topology from a crashed one.
    A failure during setup removes whatever was created and re-raises.
    """

    def __init__(self, nodes: int, tag: str | None = None) -> None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= 100:
            raise FaultConfigError("nodes", "an int in 1..100", nodes)
        if tag is not None and not re.fullmatch(r"[0-9a-z]{1,8}", tag):
            raise FaultConfigError("tag", "1-8 lowercase letters or digits", tag)
        require_network_privileges()
        self.nodes = nodes
        self.tag = tag or secrets.token_hex(3)
        longest = self.veth(nodes - 1)
        if len(longest) > _IFNAMSIZ:
            raise FaultConfigError("tag", f"a tag short enough that {longest!r} fits in {_IFNAMSIZ} characters",
                                   self.tag)
        self.subnet: ipaddress.IPv4Network | None = None
        self._shaping: dict[int, Shaping] = {}
        self._partitioned: set[int] = set()
        # Checked outside the try: the cleanup below must never remove someone else's topology.
        if self.bridge in _links() or any(n.startswith(f"{PREFIX}{self.tag}-") for n in _netns_names()):
            raise NetworkError(f"a topology tagged {self.tag!r} already exists; pick another tag or run "
                               "baft cleanup (it removes what killed runs left)")
        try:
            self._setup()
        except BaseException as e:
            try:
                self.close()
            except Exception as cleanup:  # keep the original error; say what could not be undone
                e.add_note(f"cleanup after the failed setup also failed: {cleanup}")
            raise

    # names and addresses

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.tag}-br"

    def namespace(self, i: int) -> str:
        """Node i's network namespace (``ip netns exec <it> ...``)."""
        return f"{PREFIX}{self.tag}-n{self._node(i)}"

    def veth(self, i: int) -> str:
        """Node i's veth end in the root namespace (a bridge port)."""
        return f"{PREFIX}{self.tag}-h{i}"

    def interface(self, i: int) -> str:
        """Node i's interface inside its namespace: the GLOO_SOCKET_IFNAME for its workers."""
        self._node(i)
        return IFNAME

    def address(self, i: int) -> str:
        """Node i's IPv4 address (the MASTER_ADDR / store address other nodes dial)."""
        return str(self._subnet()[self._node(i) + 1])

    @property
    def host_address(self) -> str:
        """The bridge's address: how processes in the root namespace and the nodes reach each other."""
        return str(self._subnet()[254])

    def exec_prefix(self, i: int) -> list[str]:
        """Argv prefix that runs a command inside node i's namespace."""
        return [_binary("ip"), "netns", "exec", self.namespace(i)]

    def _node(self, i: int) -> int:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.nodes:
            raise FaultConfigError("node", f"a node in 0..{self.nodes - 1}", i)
        return i

    def _subnet(self) -> ipaddress.IPv4Network:
        if self.subnet is None:
            raise NetworkError(f"topology {self.tag} has no subnet (setup failed or not done)")
        return self.subnet

    # setup and teardown

    def _pick_subnet(self) -> ipaddress.IPv4Network:
        """A /24 of :data:`SUBNETS` no root-namespace address or route overlaps, starting from the tag's hash.

        Node namespaces are isolated from each other's topologies; only the bridge
        address lives in the root namespace, so only the root namespace must not clash.
        """
        used: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in json.loads(_run(["ip", "-j", "-4", "addr", "show"]).strip() or "[]"):
            for a in entry.get("addr_info", []):
                used.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
        for r in json.loads(_run(["ip", "-j", "-4", "route", "show", "table", "all"]).strip() or "[]"):
            dst = r.get("dst", "")
            if dst and dst != "default":
                try:
                    used.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False))
                except ValueError:
                    pass
        candidates = list(SUBNETS.subnets(new_prefix=24))
        start = zlib.crc32(self.tag.encode()) % len(candidates)
        for k in range(len(candidates)):
            net = candidates[(start + k) % len(candidates)]
            if not any(net.overlaps(u) for u in used):
                return net
        raise NetworkUnavailable(f"no free /24 in {SUBNETS} for a topology bridge: every one overlaps an address "
                                 "or route of the root namespace")

    def _setup(self) -> None:
        _run(["ip", "link", "add", "name", self.bridge, "type", "bridge"])
        _run(["ip", "link", "set", "dev", self.bridge, "alias", f"owner={os.getpid()}"])
        self.subnet = self._pick_subnet()
        _run(["ip", "addr", "add", f"{self.host_address}/24", "dev", self.bridge])
        _run(["ip", "link", "set", "dev", self.bridge, "up"])
        for i in range(self.nodes):
            ns, host = self.namespace(i), self.veth(i)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "-n", ns, "link", "set", "dev", "lo", "up"])
            _run(["ip", "link", "add", "name", host, "type", "veth", "peer", "name", IFNAME, "netns", ns])
            _run(["ip", "link", "set", "dev", host, "master", self.bridge])
            _run(["ip", "link", "set", "dev", host, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", IFNAME])
            _run(["ip", "-n", ns, "link", "set", "dev", IFNAME, "up"])

    def close(self, *, kill_processes: bool = True) -> None:
        """Remove the namespaces, veths and bridge; anything already gone is fine; safe to call twice.

        Processes still inside a node namespace are SIGKILLed first (``kill_processes``)
        because a namespace with a live process outlives ``ip netns del``. Every object
        is attempted even when one fails; the failures are raised together at the end.
        """
        errors: list[str] = []
        names = _netns_names()
        links = _links()
        for i in range(self.nodes):
            ns, host = self.namespace(i), self.veth(i)
            if ns in names and kill_processes:
                _kill_netns_processes(ns)
            # Deleting the host end removes the pair at once; namespace teardown alone is asynchronous.
            if host in links:
                _remove("veth", host, ["ip", "link", "del", "dev", host], _still_linked(host), errors)
            if ns in names:
                _remove("namespace", ns, ["ip", "netns", "del", ns], _still_netns(ns), errors)
        if self.bridge in links:
            _remove("bridge", self.bridge, ["ip", "link", "del", "dev", self.bridge],
                    lambda: self.bridge in _links(), errors)
        self._shaping.clear()
        self._partitioned.clear()
        if errors:
            raise NetworkError(f"could not remove all of topology {self.tag}: " + "; ".join(errors))

    def __enter__(self) -> NetworkTopology:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"NetworkTopology(nodes={self.nodes}, tag={self.tag!r}, subnet={self.subnet})"

    # link faults

    def throttle(self, i: int, rate_bit: int, burst_bytes: int | None = None, latency_ms: float = 50,
                 classes: bool = True) -> Shaping:
        """Shape all of node i's outgoing traffic to ``rate_bit`` bits/s with a tbf qdisc.

        ``burst_bytes`` defaults to 10 ms worth of the rate (at least 16 KiB, so a
        full-size frame always fits); ``latency_ms`` bounds how long a packet may
        queue before tbf drops it (without ``classes``; with them the queue is
        pfifo_fast's, the interface's txqueuelen packets, served by socket
        priority). Returns what was installed (for the journal).
        Replaces an earlier throttle; under a partition it takes effect on heal().
        """
        self._node(i)
        if isinstance(rate_bit, bool) or not isinstance(rate_bit, int) or rate_bit < 8:
            raise FaultConfigError("rate", "an int of bits/s >= 8", rate_bit)
        burst = burst_bytes if burst_bytes is not None else max(rate_bit // 8 // 100, 16 * 1024)
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1600:
            raise FaultConfigError("burst", "an int of bytes >= 1600 (a full frame)", burst_bytes)
        if not latency_ms > 0:
            raise FaultConfigError("latency_ms", "a positive number of milliseconds", latency_ms)
        self._shaping[i] = Shaping(rate_bit=rate_bit, burst_bytes=burst, latency_ms=float(latency_ms),
                                   classes=bool(classes))
        self._apply_egress(i)
        return self._shaping[i]

    def unthrottle(self, i: int) -> None:
        """Remove node i's throttle (nothing to remove is fine)."""
        self._node(i)
        self._shaping.pop(i, None)
        self._apply_egress(i)

    def partition(self, i: int) -> None:
        """Cut node i off from every other node and the host: drop everything it sends and everything sent to it."""
        self._node(i)
        self._partitioned.add(i)
        self._apply_egress(i)
        _run(["tc", "qdisc", "replace", "dev", self.veth(i), "root", "blackhole"])

    def heal(self, i: int) -> None:
        """Undo :meth:`partition` (restoring a throttle set before or during it)."""
        self._node(i)
        self._partitioned.discard(i)
        _clear_root(self.veth(i))
        self._apply_egress(i)

    def delay(self, i: int, ms: float) -> None:
        """Delay node i's outgoing packets by ``ms`` with netem (replaces a throttle until undone).
        Unverified on the development kernel, which has no netem; callers check :func:`require_netem`."""
        self._node(i)
        _run(["tc", "-n", self.namespace(i), "qdisc", "replace", "dev", IFNAME, "root", "netem", "delay", f"{ms:g}ms"])

    def undelay(self, i: int) -> None:
        """Undo :meth:`delay`, restoring the throttle or partition node i had."""
        self._node(i)
        _clear_root(IFNAME, self.namespace(i))
        self._apply_egress(i)

    def egress_qdisc(self, i: int) -> str:
        """The root qdisc kind on node i's interface ("tbf", "blackhole", or the default "noqueue")."""
        return _root_qdisc(IFNAME, self.namespace(i))

    def _has_priority_queue(self, i: int) -> bool:
        """Whether node i's tbf has the pfifo_fast child a throttle with classes put under it."""
        out = _run(["tc", "-n", self.namespace(i), "-j", "qdisc", "show", "dev", IFNAME]).strip()
        return any(q.get("handle") == "10:" for q in (json.loads(out) if out else []))

    def _apply_egress(self, i: int) -> None:
        ns = self.namespace(i)
        if i in self._partitioned:
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", IFNAME, "root", "blackhole"])
        elif (s := self._shaping.get(i)) is not None:
            if not s.classes and self._has_priority_queue(i):
                # Replacing tbf by tbf keeps its child, so an earlier throttle's priority queue would stay; and
                # deleting the child alone leaves tbf a noop one that drops every packet. So tbf anew.
                _run(["tc", "-n", ns, "qdisc", "del", "dev", IFNAME, "root"])
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", IFNAME, "root", "handle", "1:", "tbf", "rate",
                  f"{s.rate_bit}bit", "burst", str(s.burst_bytes), "latency", f"{s.latency_ms:g}ms"])
            if s.classes:
                _run(["tc", "-n", ns, "qdisc", "replace", "dev", IFNAME, "parent", "1:1", "handle", "10:", "pfifo_fast"])
        else:
            _clear_root(IFNAME, ns)


def _stale(prefix: str, force: bool) -> tuple[list[str], list[str], list[str]]:
    """Host veths, namespaces and bridges (``baft-<tag>-*``) of topologies whose owner is gone."""
    links = _links()
    live: set[str] = set()
    for name, link in links.items():
        m, owner = _NAME_RE.match(name), re.fullmatch(r"owner=(\d+)", link.get("ifalias", ""))
        if m and m[2] == "br" and owner and _pid_alive(int(owner[1])) and not force:
            live.add(m[1])

    def stale(name: str) -> bool:
        m = _NAME_RE.match(name)
        return name.startswith(prefix) and m is not None and m[1] not in live

    return (sorted(n for n in links if stale(n) and not n.endswith("-br")),
            sorted(n for n in _netns_names() if stale(n)),
            sorted(n for n in links if stale(n) and n.endswith("-br")))


def stale_names(prefix: str = PREFIX, *, force: bool = False) -> list[str]:
    """What :func:`cleanup_stale` would remove, removing nothing."""
    require_network_privileges()
    veths, namespaces, bridges = _stale(prefix, force)
    return veths + namespaces + bridges


def cleanup_stale(prefix: str = PREFIX, *, force: bool = False) -> list[str]:
    """Remove namespaces and root links (``baft-<tag>-*``) left by crashed runs; return what was removed.

    A topology is live while its bridge's ``owner=<pid>`` process runs; live ones are
    kept unless ``force``. ``prefix`` narrows the sweep (e.g. ``"baft-<tag>-"``).
    """
    require_network_privileges()
    veths, namespaces, bridges = _stale(prefix, force)
    removed: list[str] = []
    errors: list[str] = []
    # Host veths first (synchronous), then namespaces, then the bridges they hung off.
    for name in veths:
        _remove("link", name, ["ip", "link", "del", "dev", name], _still_linked(name), errors)
        removed.append(name)
    for ns in namespaces:
        _kill_netns_processes(ns)
        _remove("namespace", ns, ["ip", "netns", "del", ns], _still_netns(ns), errors)
        removed.append(ns)
    for name in bridges:
        _remove("bridge", name, ["ip", "link", "del", "dev", name], _still_linked(name), errors)
        removed.append(name)
    if errors:
        raise NetworkError("cleanup_stale could not remove: " + "; ".join(errors))
    return removed


def __getattr__(name: str) -> Any:
    if name == "Topology":  # renamed: baft.mesh.topology has a Topology of its own (a rank's place)
        from baft.errors import deprecated

        deprecated("injectors.network.Topology", "injectors.network.NetworkTopology")
        return NetworkTopology
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
