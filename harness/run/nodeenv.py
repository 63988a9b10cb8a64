"""What every process of one node of a local run gets: its environment, and free ports.

The agents, the workers they start and the node's store all run with :func:`worker_env`, so
they see the same node name, network interface and one intra-op thread each.
"""
from __future__ import annotations

import os
import random
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from harness.run.processes import NODE_VARIABLE, OWNER_VARIABLE, TOKEN_VARIABLE, owner_value

if TYPE_CHECKING:
    from injectors.network import NetworkTopology


#: Where :func:`free_port` picks from when the kernel's ephemeral range is the default one.
PORTS = range(20000, 32768)


def _ephemeral() -> range:
    """The ports the kernel hands out to ``bind(0)`` and to outgoing connections."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return range(low, high + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


def free_port() -> int:
    """A port that is free now and that the kernel will not give to anyone else meanwhile.

    A port taken with ``bind(0)`` is from the ephemeral range: once the socket is closed, the kernel
    may hand it to the next ``bind(0)`` or outgoing connection (gloo opens dozens), and a torchrun
    agent that binds it seconds later, after importing torch, fails with EADDRINUSE (seen in CI with
    three test workers). So the port is drawn at random outside that range and checked by binding it;
    only another caller of this function can then take it, one chance in thousands."""
    ephemeral = _ephemeral()
    candidates = [p for p in PORTS if p not in ephemeral] or list(range(10000, ephemeral.start))
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.choice(candidates)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use: draw again
            return port
    with socket.socket() as s:  # everything drawn was taken: let the kernel choose
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(node: int, topology: NetworkTopology | None = None, token: str | None = None) -> dict[str, str]:
    """The environment of node ``node``'s processes; ``token`` marks them as one launch's (see
    :mod:`harness.run.processes`)."""
    env = dict(os.environ)
    env.update(
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME=topology.interface(node) if topology else env.get("GLOO_SOCKET_IFNAME", "lo"),
        BAFT_NODE=f"node{node}",
        **{NODE_VARIABLE: str(node)},
        PYTHONUNBUFFERED="1",
    )
    if token is not None:
        env[TOKEN_VARIABLE] = token
        env[OWNER_VARIABLE] = owner_value()
    # The workload must import this checkout even when run from another cwd.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
