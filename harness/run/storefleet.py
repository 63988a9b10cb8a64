"""The per-node ``baft`` store processes of a run: started before the agents, replaced when lost.

A store dies with its node (the node-loss fault kills it and wipes the node's
shared memory). A replacement node comes up with a fresh store and empty
memory, so the fleet restarts any store that exits while the run goes on,
and journals it.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from baft.store.config import ReplicationConfig
from baft.store.wire import SECRET_VARIABLE, request

from analysis.journal import JournalWriter
from harness.run.nodeenv import free_port, worker_env
from injectors.process import lost_marker

if TYPE_CHECKING:
    from harness.run.cpugroups import CpuGroups
    from injectors.network import NetworkTopology


@dataclass(kw_only=True, slots=True)
class StoreSpec:
    """Where the stores keep memory and how they replicate."""

    base: Path
    """Shared-memory directory of the run; node i uses ``base/node<i>``."""
    replication: ReplicationConfig
    """How every store replicates (the scenario's ``CheckpointConfig.replication``)."""


class StoreFleet:
    """One store per node, monitored."""

    def __init__(self, spec: StoreSpec, nodes: int, run_dir: Path, journal: JournalWriter,
                 topology: NetworkTopology | None = None, *, token: str | None = None, secret: str, world_size: int = 0,
                 groups: CpuGroups | None = None) -> None:
        self.spec, self.nodes, self.run_dir, self.journal, self.topology = spec, nodes, run_dir, journal, topology
        self.token = token
        """The launch's process token, in every store's environment."""
        self.secret = secret
        """The run's store secret (``BAFT_STORE_SECRET`` of every store and worker; never on a command line)."""
        self.world_size = world_size
        self.groups = groups
        """The launch's CPU groups: each store joins its node's ``store`` group (None: none made)."""
        hosts = [topology.address(i) if topology else "127.0.0.1" for i in range(nodes)]
        self.addresses = [f"{hosts[i]}:{free_port()}" for i in range(nodes)]
        self.procs: list[subprocess.Popen | None] = [None] * nodes
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._lock = threading.Lock()  # the monitor's replacements against lose()

    def node_dir(self, node: int) -> Path:
        return self.spec.base / f"node{node}"

    def command(self, node: int) -> list[str]:
        """The store process of ``node`` (its arguments are ``baft.store.config.StoreConfig``'s)."""
        return [sys.executable, "-m", "baft.store", "--root", str(self.node_dir(node)), "--node", str(node),
                "--addresses", ",".join(self.addresses), "--replication", self.spec.replication.to_json(),
                "--journal", str(self.run_dir / "journal" / f"store-node{node}.jsonl"),
                "--world-size", str(self.world_size)]

    def _start(self, node: int) -> None:
        cmd = self.command(node)
        if self.topology is not None:
            cmd = self.topology.exec_prefix(node) + cmd  # the store lives on its node's network
        log = open(self.run_dir / "logs" / f"store-node{node}.log", "ab")
        env = {**worker_env(node, self.topology, self.token), SECRET_VARIABLE: self.secret,
               **(self.groups.env(node, "store") if self.groups is not None else {})}
        proc = self.procs[node] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                   start_new_session=True)
        log.close()
        self.journal.write("store_start", node=f"node{node}", pid=proc.pid, address=self.addresses[node])

    def start(self) -> None:
        for node in range(self.nodes):
            self._start(node)
        self._wait_ready()
        self._monitor = threading.Thread(target=self._watch, name="store-monitor", daemon=True)
        self._monitor.start()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for addr in self.addresses:
            while True:
                try:
                    request(addr, {"op": "ping"}, timeout=1, secret=self.secret)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            with self._lock:
                for node, p in enumerate(self.procs):
                    if p is not None and p.poll() is not None and not self._stop.is_set():
                        self.journal.write("store_exit", node=f"node{node}", returncode=p.returncode)
                        self._replace(node)

    def _replace(self, node: int) -> None:
        if lost_marker(self.run_dir / "faults", node).exists():
            self.procs[node] = None  # lost for good: no replacement node, no store
        else:
            self._start(node)  # the replacement node's store, with whatever memory is left

    def lose(self, node: int, reason: str, replace: bool = True) -> None:
        """Node ``node`` is gone with its memory: kill its store, wipe the memory, and (unless the node is lost
        for good, or not ``replace``: the run is ending) start the replacement node's store on empty memory."""
        with self._lock:
            p = self.procs[node]
            if p is not None and p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
            shutil.rmtree(self.node_dir(node), ignore_errors=True)
            self.journal.write("store_lost", node=f"node{node}", reason=reason)
            if replace and not self._stop.is_set():
                self._replace(node)
            else:
                self.procs[node] = None

    def rejoin(self, node: int) -> None:
        """Node ``node``, lost for good, comes back (its lost marker is gone): a fresh store on empty memory,
        answering at the node's address before this returns."""
        with self._lock:
            if self.procs[node] is None and not self._stop.is_set():
                shutil.rmtree(self.node_dir(node), ignore_errors=True)
                self._start(node)
        self._wait_ready()

    def stop_monitor(self) -> None:
        """Replace no store from now on (the run is ending: a store that exits stays gone)."""
        self._stop.set()
        if self._monitor is not None:
            self._monitor.join(timeout=2)

    def stop(self) -> None:
        self.stop_monitor()
        for p in self.procs:
            if p is not None and p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                    p.wait(timeout=5)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        shutil.rmtree(self.spec.base, ignore_errors=True)
