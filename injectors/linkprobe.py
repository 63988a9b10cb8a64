"""Real TCP transfers between node namespaces: is a node reachable, and at what rate.

The proof that a link fault took effect: a throttle is measured with an actual
transfer through the namespaces, veths, qdiscs and bridge, and the measured rate
is journaled next to the configured one; a partition shows as an unreachable node.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

from .errors import FaultConfigError
from .network import NetworkError, NetworkTopology


class Unreachable(NetworkError):
    """A TCP connect from one node to another failed or timed out (e.g. across a partition)."""


_RECEIVER = r"""
import json, socket, sys, time
addr, timeout = sys.argv[1], float(sys.argv[2])
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.bind((addr, 0))
srv.listen(1)
srv.settimeout(timeout)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
conn.settimeout(timeout)
start, n = time.perf_counter(), 0
while True:
    b = conn.recv(1 << 20)
    if not b:
        break
    n += len(b)
print(json.dumps({"bytes": n, "seconds": time.perf_counter() - start}), flush=True)
"""

_SENDER = r"""
import socket, sys
addr, port, n, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
try:
    s = socket.create_connection((addr, port), timeout=timeout)
except OSError as e:
    print(f"connect to {addr}:{port} failed: {e!r}", file=sys.stderr)
    sys.exit(3)
buf = memoryview(bytes(1 << 20))
while n > 0:
    k = min(n, len(buf))
    s.sendall(buf[:k])
    n -= k
s.close()
"""


def _read_line(proc: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, bytes]:
    """Read the first line of an unbuffered stdout by the deadline; return it and whatever followed."""
    assert proc.stdout is not None
    got = b""
    while b"\n" not in got:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
            raise NetworkError("receiver did not start listening in time")
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise NetworkError(f"receiver exited before listening: {err.strip()}")
        got += chunk
    line, _, rest = got.partition(b"\n")
    return line, rest


def _transfer(topo: NetworkTopology, src: int, dst: int, nbytes: int, timeout: float) -> tuple[int, float]:
    """Send ``nbytes`` over TCP from node src's namespace to node dst's; (bytes received, seconds at the receiver)."""
    if src == dst:
        raise FaultConfigError("dst", "a node other than src", dst)
    deadline = time.monotonic() + timeout
    addr = topo.address(dst)
    py = [sys.executable, "-S", "-c"]
    receiver = subprocess.Popen([*topo.exec_prefix(dst), *py, _RECEIVER, addr, f"{timeout}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    try:
        port, rest = _read_line(receiver, deadline)
        left = max(deadline - time.monotonic(), 0.1)
        try:
            sender = subprocess.run([*topo.exec_prefix(src), *py, _SENDER, addr, port.decode(), str(nbytes), f"{left}"],
                                    capture_output=True, text=True, timeout=left + 1.0)
        except subprocess.TimeoutExpired:
            raise NetworkError(f"sending {nbytes} bytes from node {src} to node {dst} took over {timeout} s") from None
        if sender.returncode == 3:
            raise Unreachable(f"node {src} cannot reach node {dst}: {sender.stderr.strip()}")
        if sender.returncode != 0:
            raise NetworkError(f"sender in node {src} failed (exit {sender.returncode}): {sender.stderr.strip()}")
        try:
            out, err = receiver.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            raise NetworkError(f"receiver in node {dst} did not finish within {timeout} s") from None
        if receiver.returncode != 0:
            raise NetworkError(f"receiver in node {dst} failed: {err.decode(errors='replace').strip()}")
        result = json.loads((rest + out).decode())
        return int(result["bytes"]), float(result["seconds"])
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
        for pipe in (receiver.stdout, receiver.stderr):
            if pipe is not None:
                pipe.close()


def measure_rate(topo: NetworkTopology, src: int, dst: int, nbytes: int = 2_000_000, timeout: float = 10.0) -> float:
    """Measure the TCP goodput from node src to node dst in bits/s, timed at the receiver.

    A real transfer through the namespaces, veths, qdiscs and bridge: the proof that
    a throttle took effect, and the number to journal next to the configured rate.
    Raises :class:`Unreachable` when src cannot connect, :class:`NetworkError` otherwise.
    """
    if nbytes < 1:
        raise FaultConfigError("nbytes", "at least 1 byte", nbytes)
    got, seconds = _transfer(topo, src, dst, nbytes, timeout)
    if got != nbytes:
        raise NetworkError(f"node {dst} received {got} of {nbytes} bytes from node {src}")
    return got * 8 / max(seconds, 1e-9)


def reachable(topo: NetworkTopology, src: int, dst: int, timeout: float = 2.0) -> bool:
    """Whether node src can open a TCP connection to node dst within ``timeout`` seconds."""
    try:
        _transfer(topo, src, dst, 1, timeout)
    except Unreachable:
        return False
    return True


def measure_throttle(topo: NetworkTopology, src: int, dst: int, rate_bit: int) -> float:
    """Measure a throttled link with a transfer sized to take ~1 s at ``rate_bit`` (0.2-4 MB)."""
    return measure_rate(topo, src, dst, nbytes=max(200_000, min(4_000_000, rate_bit // 8)), timeout=10.0)
