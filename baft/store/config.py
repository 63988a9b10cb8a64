"""The node store's configuration: how it replicates (the scenario's ``checkpoint:`` section maps onto
:class:`ReplicationConfig`) and what one node's store is told (:class:`StoreConfig`, its command line).
Torch-free (the store process imports it)."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from baft.errors import BaftConfigError
from baft.priority import IDLE, STORE_CHOICES, STORE_PRIORITIES
from baft.store.placement import PLACEMENTS
from baft.store.wire import SECRET_VARIABLE


@dataclass(kw_only=True, slots=True)
class ReplicationConfig:
    """How a node's store replicates its ranks' snapshots to peer nodes. The scenario's
    ``checkpoint:`` section holds it (``CheckpointConfig.replication``); the harness hands it to
    every store as one JSON argument (``--replication``)."""

    replicas: int = 1
    """Peer nodes that keep a copy of each snapshot (at most the other nodes there are)."""
    placement: str = "ring"
    """Which peers (:mod:`baft.store.placement`): ``ring``, the next ``replicas`` nodes by index; ``group``,
    the other members of the node's group of ``replicas + 1`` (the last group takes the remainder
    and places inside it as a ring)."""
    domain_nodes: int = 0
    """Nodes per failure domain (a rack, a switch): consecutive node indices share one. The placement then
    runs over the nodes interleaved by domain, so a node's replicas go to other domains while there are
    domains left and a domain's loss leaves its nodes' copies elsewhere (:mod:`baft.store.placement`). 0: no
    domains (the placement by index)."""
    rate: float = 0.0
    """Rate limit of the replica data each store sends, in bytes/s (0: none). When the link
    cannot carry a replica per iteration, older versions are skipped and the skips journaled."""
    yield_to_training: bool = True
    """Send replica data only while no rank of the node has pipeline traffic in flight (a whole replica,
    or each paced piece on a slow link, waits at most 20 ms, so replication always progresses)."""
    max_slowdown: float = 0.0
    """The share by which replication may slow the ranks' versions (0.25: 25%; 0, the default: no
    limit): measured by the store (it times versions while it sends and, holding off a few versions
    every 20 s, while it does not); beyond it replication stops once a persistent checkpoint exists,
    is journaled (``replication_degraded``) and probed again later. A budget trades the freshness
    of the peer copies for speed."""

    priority: str = IDLE
    """The store's CPU and I/O class: ``idle``, the default (``SCHED_IDLE`` and the idle I/O class, nice 19 where the idle
    CPU class is refused; it then runs on what the ranks leave idle, such as their pipeline bubbles — but where
    the kernel groups processes by session, autogroups, the class counts only inside the store's own group),
    ``lowest`` (those, and the store's session group at nice 19: idle across groups too, and behind when the
    machine has nothing idle), ``adaptive`` (``idle``, and the group at nice 19 only while the
    replicas land within half a version of their seal: raised again when one is 0.75 versions late or still
    unsent at the next seal, :mod:`baft.store.governor`, each change journaled as ``store_group``: training
    a few points faster on a small machine, a replica now and then a version late) or ``normal`` (the class it
    was started in). What was applied is journaled (``store_start``)."""

    def __post_init__(self) -> None:
        if self.priority not in STORE_PRIORITIES:
            raise BaftConfigError("priority", STORE_CHOICES, self.priority)
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 0:
            raise BaftConfigError("replicas", "an integer >= 0", self.replicas)
        if isinstance(self.rate, bool) or not isinstance(self.rate, (int, float)) or self.rate < 0:
            raise BaftConfigError("rate", "a number >= 0 (bytes/s; 0 means no limit)", self.rate)
        self.rate = float(self.rate)
        if self.placement not in PLACEMENTS:
            raise BaftConfigError("placement", "one of " + ", ".join(PLACEMENTS), self.placement)
        if isinstance(self.domain_nodes, bool) or not isinstance(self.domain_nodes, int) or self.domain_nodes < 0:
            raise BaftConfigError("domain_nodes", "an integer >= 0 (nodes per failure domain; 0: none)",
                                  self.domain_nodes)
        if isinstance(self.max_slowdown, bool) or not isinstance(self.max_slowdown, (int, float)) or self.max_slowdown < 0:
            raise BaftConfigError("max_slowdown", "a number >= 0 (a share: 0.25 is 25%; 0 means no limit)",
                                  self.max_slowdown)
        self.max_slowdown = float(self.max_slowdown)
        if not isinstance(self.yield_to_training, bool):
            raise BaftConfigError("yield_to_training", "true or false", self.yield_to_training)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ReplicationConfig:
        """The config from :meth:`to_json`'s text; a key left out takes its default."""
        try:
            data = json.loads(text)
        except ValueError:
            raise BaftConfigError("replication", "a JSON object", text) from None
        keys = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(data, dict) or any(k not in keys for k in data):
            raise BaftConfigError("replication", "a JSON object with keys among " + ", ".join(keys), text)
        return cls(**data)


@dataclass(kw_only=True, slots=True)
class StoreConfig:
    """One node's store: its memory, its peers, its journal and how it replicates."""

    root: Path
    """The node's shared-memory directory (the workers' slot files, the replicas it receives)."""
    node: int
    """This node's index."""
    addresses: list[str]
    """host:port of every node's store, by node index (this one's included)."""
    journal: Path | None = None
    """JSONL file for the store's events (None: none)."""
    listen: str | None = None
    """Address to bind (None: this node's host in ``addresses``; in a pod, the pod's IP, since its DNS
    name may not resolve before the pod is ready). Never a wildcard (0.0.0.0, ::): the store listens
    on the one address its peers dial."""
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    """How it replicates (the JSON keys below)."""
    secret: str = field(default="", repr=False)
    """The run's secret (from ``BAFT_STORE_SECRET``): every connection proves it, both ways."""
    world_size: int = 0
    """Ranks of the job (0: not bounded): a request naming a rank outside it is refused."""
    max_payload: int = 0
    """The largest replica accepted, in bytes (0: what the root's filesystem has free)."""

    def __post_init__(self) -> None:
        if not self.addresses or not all(isinstance(a, str) and ":" in a for a in self.addresses):
            raise BaftConfigError("addresses", "host:port of every node's store", self.addresses)
        if not 0 <= self.node < len(self.addresses):
            raise BaftConfigError("node", f"a node index in 0..{len(self.addresses) - 1}", self.node)
        if self.listen is not None and self.listen.strip("[]") in ("", "0.0.0.0", "::"):
            raise BaftConfigError("listen", "this node's own address (a wildcard listens on every interface)",
                                  self.listen)
        if not isinstance(self.secret, str) or len(self.secret) < 16:
            raise BaftConfigError("secret", f"the run's store secret, at least 16 characters ({SECRET_VARIABLE})",
                                  "<not set>" if not self.secret else "<too short>")
        for name in ("world_size", "max_payload"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BaftConfigError(name, "an integer >= 0", value)
