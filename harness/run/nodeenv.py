"""What every process of one node of a local run gets: its environment, and free ports.

The agents, the workers they start and the node's store all run with :func:`worker_env`, so
they see the same node name, network interface and one intra-op thread each.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from harness.run.processes import OWNER_VARIABLE, TOKEN_VARIABLE, owner_value

if TYPE_CHECKING:
    from injectors.network import Topology


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(node: int, topology: Topology | None = None, token: str | None = None) -> dict[str, str]:
    """The environment of node ``node``'s processes; ``token`` marks them as one launch's (see
    :mod:`harness.run.processes`)."""
    env = dict(os.environ)
    env.update(
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME=topology.interface(node) if topology else env.get("GLOO_SOCKET_IFNAME", "lo"),
        BAFT_NODE=f"node{node}",
        BAFT_NODE_INDEX=str(node),
        PYTHONUNBUFFERED="1",
    )
    if token is not None:
        env[TOKEN_VARIABLE] = token
        env[OWNER_VARIABLE] = owner_value()
    # The workload must import this checkout even when run from another cwd.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
