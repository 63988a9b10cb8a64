"""At scale, on paper: the share of training time each checkpointing strategy loses on a cluster we cannot build.

A target is a cluster and a model (nodes, GPUs per node, stages, state per
stage, failure rate per node, the persistent store's aggregate bandwidth,
fixed or growing with the nodes, each node's network, the iteration time and
the pipeline's bubble share). Each strategy is reduced to a few quantities:

* ``stall``: seconds the training thread waits per checkpoint (sync writes the
  whole state to the store; CheckFreq and async DCP copy it to host memory;
  in-memory copies to host and sends it to peers in the background; baft
  copies inside the bubbles and stalls only for what does not fit);
* ``interval``: seconds of work between checkpoints, Daly's optimum for the
  stall, but never shorter than what the background work of one checkpoint
  takes (a persist, a replication) nor than an iteration;
* ``lag``: how long after it is taken a checkpoint becomes durable;
* where a failure recovers from: peer memory with the probability that the
  lost nodes leave a copy (``memory_probability``, from the placement), else
  the persistent tier, with the retrieval time of that tier.

Failures come in two kinds: losses of ``simultaneous`` nodes at random (the
node MTBF), and, optionally, correlated losses of a whole failure domain (a
rack: ``domain_nodes`` nodes with their own MTBF), whose chance of leaving a
copy in memory depends on where the domains lie in the node numbering.

The expected wasted share is the stall share plus the failure rate times what
each failure costs (detection, restart, retrieval, the work redone: half an
interval plus the lag). :func:`simulate` plays the same rules out with seeded
random failures over a long run, so the two can be checked against each other.
Assumptions, stated with every projection (:data:`ASSUMPTIONS`).
"""
from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from .advisor import daly
from .errors import ConfigFieldError

MODELS = ("none", "blocking", "background", "memory", "bubbles")
"""How a strategy is modelled: ``none`` (nothing kept); ``blocking`` (the training thread writes the persistent
tier); ``background`` (a copy to host memory on the training thread, persisted in the background); ``memory`` (that
copy also sent to peers' memory, persisted from the host copy); ``bubbles`` (as ``memory``, the copy inside the
pipeline bubbles, stalling only for what they cannot hold)."""
HYPOTHETICAL = {"in-memory": "memory"}
"""Strategies projected that baft does not run (a plain in-memory checkpoint), by model."""
STRATEGIES: dict[str, str] = {"none": "none", "sync": "blocking", "checkfreq": "background", "async-dcp": "background",
                              **HYPOTHETICAL, "baft": "bubbles"}
"""The strategies projected when none are given, by model. ``baft project`` gives baft's registry's instead
(``harness.bench.project.strategies``: each entry's ``projection``; a test keeps the two alike)."""

ASSUMPTIONS = (
    "failures of nodes are independent and exponential (a job-level rate of nodes / MTBF); each failure takes "
    "`simultaneous` nodes at once",
    "every rank writes or reads its share at once: the persistent store's aggregate bandwidth is the bottleneck of a "
    "persist and of a restore from it; a node's network carries its replicas and a peer restore",
    "background work (a persist, a replication) does not slow training; only the stall does (on this 2-core machine "
    "it did: see docs/bench.md, the measured overheads)",
    "CheckFreq and async DCP are modelled alike: a copy to host memory on the training thread, a background persist",
    "a strategy with peer memory also persists, from its host copy (no second stall) as often as a persist allows, "
    "for losses that take every copy",
    "`simultaneous` nodes fail together: the node failure rate stays nodes / MTBF, in events of that many nodes",
    "with `domain_mtbf_hours`, each failure domain of `domain_nodes` nodes also fails whole, independently and "
    "exponentially; detection and restart take as long as for one node",
    "the interval is Daly's optimum for the stall, at least one iteration and at least the background work of one "
    "checkpoint",
)


@dataclass(kw_only=True, slots=True)
class Target:
    """The cluster and model a projection is for."""

    nodes: int = 128
    """Nodes of the cluster."""
    gpus_per_node: int = 8
    """GPUs (ranks) per node."""
    stages: int = 8
    """Pipeline stages."""
    state_gb_per_stage: float = 175.0
    """Model and optimizer state of one pipeline stage, in GB (all its data-parallel and TP ranks together;
    a 100B-parameter model with Adam in mixed precision holds about 1.4 TB: 175 GB a stage of 8)."""
    mtbf_hours: float = 5000.0
    """Mean time between failures of one node, in hours."""
    storage_gbps: float = 20.0
    """The persistent store's bandwidth in Gbit/s: for the whole cluster, or per node with ``storage_scales``."""
    storage_scales: bool = False
    """The store's bandwidth grows with the cluster (``storage_gbps`` per node) instead of being fixed."""
    network_gbps: float = 100.0
    """Each node's network bandwidth for replicas, in Gbit/s."""
    copy_gbps: float = 25.0
    """Device-to-host copy bandwidth per GPU, in GB/s (PCIe 4.0 x16 is about 25)."""
    iteration_seconds: float = 10.0
    """Seconds per training iteration."""
    microbatches: int = 32
    """Microbatches per iteration (the bubble share of 1F1B is (stages - 1) / (microbatches + stages - 1))."""
    bubble_share: float | None = None
    """The share of an iteration a stage is idle, as measured (``--from`` a run sets it); unset: 1F1B's share
    from the stages and microbatches."""
    detect_seconds: float = 30.0
    """Seconds until a failure is detected."""
    restart_seconds: float = 120.0
    """Seconds to replace the lost nodes and restart the job (before retrieval)."""
    replicas: int = 1
    """Peer nodes holding a copy of each node's in-memory checkpoint."""
    placement: str = "ring"
    """Where the replicas go: ``ring`` or ``group`` (as baft's stores place them)."""
    simultaneous: int = 1
    """Nodes lost in one failure (at the same moment)."""
    domain_nodes: int = 8
    """Nodes of one failure domain (a rack, a switch, a power feed) that fail together."""
    domain_mtbf_hours: float | None = None
    """Mean time between failures of one whole failure domain, in hours; unset: no correlated losses."""
    domain_layout: Literal["aligned", "interleaved", "random"] = "aligned"
    """Where the domains lie in the node numbering: aligned (consecutive node ranks share one, as a
    topology-aware scheduler hands them out), interleaved (node i in domain i mod the number of domains)
    or random."""
    domain_aware: bool = False
    """The stores are told the domains as aligned ones (baft's ``checkpoint.baft.replication.domain_nodes``) and send each
    replica to another domain; false: they place by node index alone."""
    memory_probability: float = field(default=1.0, init=False)
    """The probability that a failure of ``simultaneous`` nodes leaves a copy of every state in peer memory
    (set by the caller from the placement: analysis does not know the placement rules)."""
    domain_memory_probability: float = field(default=0.0, init=False)
    """The same for the loss of a whole failure domain (set by the caller)."""

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node", "stages", "microbatches", "replicas", "simultaneous", "domain_nodes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigFieldError(name, "an integer >= 1", v)
        for name in ("state_gb_per_stage", "mtbf_hours", "storage_gbps", "network_gbps", "copy_gbps",
                     "iteration_seconds"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ConfigFieldError(name, "a number > 0", v)
        for name in ("detect_seconds", "restart_seconds"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigFieldError(name, "a number >= 0", v)
        if self.bubble_share is not None and (isinstance(self.bubble_share, bool) or
                                              not isinstance(self.bubble_share, (int, float)) or
                                              not 0 <= self.bubble_share < 1):
            raise ConfigFieldError("bubble_share", "a number in [0, 1)", self.bubble_share)
        if self.domain_mtbf_hours is not None and (isinstance(self.domain_mtbf_hours, bool) or
                                                   not isinstance(self.domain_mtbf_hours, (int, float)) or
                                                   not self.domain_mtbf_hours > 0):
            raise ConfigFieldError("domain_mtbf_hours", "a number > 0 (or unset)", self.domain_mtbf_hours)
        if self.domain_layout not in ("aligned", "interleaved", "random"):
            raise ConfigFieldError("domain_layout", "aligned, interleaved or random", self.domain_layout)
        if not isinstance(self.domain_aware, bool):
            raise ConfigFieldError("domain_aware", "true or false", self.domain_aware)
        if self.placement not in ("ring", "group"):
            raise ConfigFieldError("placement", "ring or group", self.placement)
        if self.simultaneous > self.nodes:
            raise ConfigFieldError("simultaneous", f"at most nodes ({self.nodes})", self.simultaneous)
        if self.replicas >= self.nodes:
            raise ConfigFieldError("replicas", f"fewer than nodes ({self.nodes})", self.replicas)

    @property
    def bubble_fraction(self) -> float:
        """The share of an iteration a stage is idle: as measured, else 1F1B's."""
        if self.bubble_share is not None:
            return self.bubble_share
        return (self.stages - 1) / (self.microbatches + self.stages - 1)

    @property
    def state_bytes(self) -> float:
        return self.state_gb_per_stage * self.stages * 1e9

    @property
    def domains(self) -> int:
        """Failure domains of the cluster (the last one smaller where ``domain_nodes`` does not divide it)."""
        return -(-self.nodes // self.domain_nodes)

    @property
    def node_failure_rate(self) -> float:
        """Failures of ``simultaneous`` nodes per second of the whole job."""
        return self.nodes / (self.mtbf_hours * 3600) / self.simultaneous

    @property
    def domain_failure_rate(self) -> float:
        """Losses of a whole failure domain per second of the whole job."""
        return 0.0 if self.domain_mtbf_hours is None else self.domains / (self.domain_mtbf_hours * 3600)

    @property
    def failure_rate(self) -> float:
        """Failures per second of the whole job, of either kind."""
        return self.node_failure_rate + self.domain_failure_rate

    @property
    def domain_share(self) -> float:
        """The share of failures that take a whole domain."""
        return self.domain_failure_rate / self.failure_rate

    @property
    def persist_seconds(self) -> float:
        """Writing (or reading) the whole state through the persistent store."""
        bandwidth = self.storage_gbps * (self.nodes if self.storage_scales else 1) * 1e9 / 8
        return self.state_bytes / bandwidth

    @property
    def copy_seconds(self) -> float:
        """One GPU's share copied to host memory."""
        return self.state_bytes / (self.nodes * self.gpus_per_node) / (self.copy_gbps * 1e9)

    @property
    def replicate_seconds(self) -> float:
        """One node's share sent to its ``replicas`` peers (or pulled back from one, times ``replicas``)."""
        return self.state_bytes / self.nodes * self.replicas * 8 / (self.network_gbps * 1e9)


@dataclass(kw_only=True, slots=True)
class Tier:
    """One tier of a strategy's checkpoints."""

    stall: float
    """Seconds the training thread waits per checkpoint."""
    interval: float
    """Seconds of work between checkpoints."""
    lag: float
    """Seconds after it was taken that a checkpoint is durable."""
    retrieval: float
    """Seconds to bring it back after a failure."""


@dataclass(kw_only=True, slots=True)
class Plan:
    """A strategy on a target: its tiers (memory first) and how often memory serves a failure of each kind."""

    strategy: str
    memory: Tier | None = None
    persistent: Tier | None = None
    memory_probability: float = 0.0
    """For a failure of ``simultaneous`` nodes: the chance that peer memory holds every state."""
    domain_share: float = 0.0
    """The share of failures that take a whole failure domain."""
    domain_memory_probability: float = 0.0
    """For the loss of a domain: the chance that peer memory holds every state."""

    @property
    def memory_share(self) -> float:
        """The share of all failures peer memory serves."""
        return (1 - self.domain_share) * self.memory_probability + self.domain_share * self.domain_memory_probability

    @property
    def stall_share(self) -> float:
        return sum(t.stall / t.interval for t in (self.memory, self.persistent) if t is not None)


def _interval(stall: float, target: Target, at_least: float) -> float:
    """Daly's interval for ``stall`` in whole iterations, at least ``at_least`` seconds and one iteration."""
    it = target.iteration_seconds
    tau = daly(stall, 1 / target.failure_rate) if stall > 0 else it
    return max(it, math.ceil(max(tau, at_least) / it - 1e-9) * it)


def plan(strategy: str, target: Target, model: str | None = None) -> Plan:
    """What ``strategy`` does on ``target``, modelled as ``model`` (one of :data:`MODELS`; None: the strategy's
    in :data:`STRATEGIES`)."""
    if model is None:
        model = STRATEGIES.get(strategy)
    if model not in MODELS:
        raise ValueError(f"strategy: one of {', '.join(STRATEGIES)} or a model among {', '.join(MODELS)}, "
                         f"got {strategy!r} ({model!r})")
    t = target
    persist, copy, replicate = t.persist_seconds, t.copy_seconds, t.replicate_seconds
    racks = t.domain_share  # every strategy sees the same failures; only memory tiers care about their kind
    if model == "none":
        return Plan(strategy=strategy, domain_share=racks)
    if model == "blocking":
        tier = Tier(stall=persist, interval=_interval(persist, t, 0.0), lag=0.0, retrieval=persist)
        return Plan(strategy=strategy, persistent=tier, domain_share=racks)
    background = Tier(stall=copy, interval=_interval(copy, t, persist), lag=persist, retrieval=persist)
    if model == "background":
        return Plan(strategy=strategy, persistent=background, domain_share=racks)
    # With a copy in host memory already, the persistent tier writes from it: no second stall.
    from_host = Tier(stall=0.0, interval=_interval(0.0, t, persist), lag=persist, retrieval=persist)
    if model == "memory":
        memory = Tier(stall=copy, interval=_interval(copy, t, replicate), lag=replicate, retrieval=replicate)
    else:  # bubbles
        stall = max(0.0, copy - t.bubble_fraction * t.iteration_seconds)  # what the bubbles cannot hold
        memory = Tier(stall=stall, interval=_interval(stall, t, replicate), lag=replicate, retrieval=replicate)
    return Plan(strategy=strategy, memory=memory, persistent=from_host, memory_probability=t.memory_probability,
                domain_share=racks, domain_memory_probability=t.domain_memory_probability)


def expected_waste(p: Plan, target: Target, run_hours: float) -> float:
    """The expected share of wall time not spent on useful work (first order; ``none`` exactly)."""
    lam, down = target.failure_rate, target.detect_seconds + target.restart_seconds
    if p.memory is None and p.persistent is None:  # every failure restarts from scratch
        work = run_hours * 3600
        wall = (math.exp(min(lam * work, 700)) - 1) * (1 / lam + down)
        return 1 - work / wall if wall > 0 else 0.0
    rate = 1 + p.stall_share  # wall seconds per second of work without failures
    redo, stopped = 0.0, down  # per failure: wall seconds of work redone, and of downtime and retrieval
    for tier, share in ((p.memory, p.memory_share), (p.persistent, 1 - p.memory_share)):
        if tier is not None and share > 0:
            redo += share * (rate * tier.interval / 2 + tier.lag)
            stopped += share * tier.retrieval
    # Failures strike while training runs (running = work * rate + failures * redo, failures = lam * running),
    # and each then stops the job for `stopped` seconds.
    if lam * redo >= 1:
        return 1.0
    return 1 - (1 - lam * redo) / (rate * (1 + lam * stopped))


@dataclass(kw_only=True, slots=True)
class Simulated:
    waste: float
    failures: int
    from_memory: int
    hours: float
    domain_failures: int = 0
    """Of the failures, those that took a whole failure domain."""


def simulate(p: Plan, target: Target, run_hours: float, seed: int = 0, max_failures: int = 200_000) -> Simulated:
    """Play ``p`` out: ``run_hours`` of useful work, failures at exponential gaps, each rolling back to the
    newest checkpoint that is durable by then on the tier that survived it, then detection, restart and
    retrieval. A tier checkpoints at every multiple of its interval of work, each durable ``lag`` seconds
    after it was taken; the wall clock runs ``1 + stall share`` seconds per second of work. Each failure is
    a domain's with the plan's ``domain_share`` (drawn only where there are such failures), and peer memory
    holds every state with the probability for its kind."""
    rng = random.Random(seed)
    lam, down = target.failure_rate, target.detect_seconds + target.restart_seconds
    total, rate = run_hours * 3600, 1 + p.stall_share
    tiers = [t for t in (p.memory, p.persistent) if t is not None]
    newest = [0.0 for _ in tiers]  # work of each tier's newest durable checkpoint (the start counts as one)
    wall = work = 0.0
    failures = from_memory = domain_failures = 0
    while failures < max_failures:
        gap = rng.expovariate(lam)
        if (total - work) * rate <= gap:
            wall += (total - work) * rate
            return Simulated(waste=1 - total / wall, failures=failures, from_memory=from_memory, hours=wall / 3600,
                             domain_failures=domain_failures)
        failures += 1
        for i, tier in enumerate(tiers):  # what each tier holds durably at the failure
            reached = work + (gap - tier.lag) / rate
            if reached > work:
                newest[i] = max(newest[i], math.floor(reached / tier.interval + 1e-9) * tier.interval)
        domain = p.domain_share > 0 and rng.random() < p.domain_share
        domain_failures += domain
        chance = p.domain_memory_probability if domain else p.memory_probability
        memory = p.memory is not None and rng.random() < chance
        from_memory += memory
        if not tiers:  # no checkpoint: from scratch
            work, retrieval = 0.0, 0.0
        else:
            i = 0 if memory else len(tiers) - 1
            work, retrieval = newest[i], tiers[i].retrieval
            newest = [min(n, work) for n in newest]  # a tier's copies newer than the restored work are abandoned
        wall += gap + down + retrieval
    raise RuntimeError(f"simulate: {max_failures} failures before the run finished (the strategy cannot progress)")


@dataclass(kw_only=True, slots=True)
class Projection:
    strategy: str
    plan: Plan
    waste: float
    simulated: Simulated | None = None


def project(target: Target, run_hours: float = 720.0, strategies: Mapping[str, str] = STRATEGIES,
            simulate_seed: int | None = 0) -> list[Projection]:
    """Each strategy's expected waste on ``target`` (and a seeded simulation of it unless the seed is None);
    ``strategies``: name -> model (:data:`MODELS`)."""
    out = []
    for s, model in strategies.items():
        p = plan(s, target, model)
        sim = simulate(p, target, run_hours, simulate_seed) if simulate_seed is not None and p.persistent else None
        out.append(Projection(strategy=s, plan=p, waste=expected_waste(p, target, run_hours), simulated=sim))
    return out
