"""Where each node's snapshots are replicated, and how likely a loss of k nodes at once leaves a copy of
every node's state in some surviving node's memory.

Two placements of ``r`` replicas per node among ``N`` nodes (each node keeps its own copy too, so a
state lives on ``m = r + 1`` nodes):

- **ring**: node i sends to nodes i+1 .. i+r (mod N). Losing m consecutive nodes loses the state of
  one of them.
- **group** (Gemini's): the nodes form groups of m and every node sends to the other members of its
  group. When m does not divide N, the last group takes the remainder (m + N mod m nodes) and places
  inside it as a ring. A state is lost only when a whole group (or, in that last group, m consecutive
  members) is lost; there are fewer such sets than in a ring, so k simultaneous losses are survived
  more often.

Either placement can be told the failure domains (``domain_nodes``: consecutive node ranks per domain, the
``aligned`` layout below): it then runs over the nodes interleaved by domain (:func:`spread_order`: the
first node of every domain, then the second of every domain, ...), so the next nodes in its order, and
so a node's replicas, lie in other domains while there are domains left, and each node still receives
as many replicas as it sends.

:func:`targets` is what a store replicates to; :func:`recovery_probability` the exact chance that a
loss of k nodes chosen uniformly at random keeps every state in memory, and :func:`simulate` the same
by drawing losses (the tests check one against the other). Torch-free: the node store imports it.

Correlated losses: a **failure domain** (a rack, a switch, a power feed) takes all its nodes at once.
Where the domains lie in the node numbering decides what survives, and :func:`domain_recovery_probability`
gives the share of domains whose loss keeps every state in memory for three layouts: ``aligned``
(consecutive node ranks share a domain: what a topology-aware scheduler hands out, and the worst case
for ring and group placement, whose replicas go to the next ranks), ``interleaved`` (node i in domain
i mod the number of domains: the next ranks are in other domains) and ``random``.
"""
from __future__ import annotations

import itertools
import random
from functools import lru_cache
from math import comb

PLACEMENTS = ("ring", "group")
DOMAIN_LAYOUTS = ("aligned", "interleaved", "random")


def groups(nodes: int, replicas: int) -> list[list[int]]:
    """The group placement's groups (each replicates inside itself)."""
    m = replicas + 1
    if m <= 1 or m >= nodes:
        return [list(range(nodes))]
    full = nodes // m if nodes % m == 0 else nodes // m - 1
    out = [list(range(g * m, (g + 1) * m)) for g in range(full)]
    if full * m < nodes:
        out.append(list(range(full * m, nodes)))
    return out


def spread_order(nodes: int, domain_nodes: int) -> list[int]:
    """The nodes interleaved by failure domain (domains of ``domain_nodes`` consecutive ranks, the last
    one possibly smaller): neighbours in this order are in different domains where there are two."""
    if domain_nodes < 1:
        raise ValueError(f"domain_nodes must be >= 1, got {domain_nodes}")
    return sorted(range(nodes), key=lambda i: (i % domain_nodes, i // domain_nodes))


@lru_cache(maxsize=64)
def _spread(nodes: int, domain_nodes: int) -> tuple[tuple[int, ...], dict[int, int]]:
    """:func:`spread_order` and each node's position in it, once per shape (:func:`holders` asks for every
    node's targets)."""
    order = tuple(spread_order(nodes, domain_nodes))
    return order, {n: p for p, n in enumerate(order)}


@lru_cache(maxsize=64)
def _group_of(nodes: int, replicas: int) -> dict[int, tuple[int, ...]]:
    """Each node's group of :func:`groups`, once per shape."""
    return {i: tuple(g) for g in groups(nodes, replicas) for i in g}


def targets(node: int, nodes: int, replicas: int, placement: str = "ring", domain_nodes: int = 0) -> list[int]:
    """The nodes ``node`` replicates its ranks' snapshots to (at most the other nodes there are); with
    ``domain_nodes``, the placement over :func:`spread_order`."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    r = min(replicas, nodes - 1)
    if r <= 0:
        return []
    if domain_nodes:
        order, position = _spread(nodes, domain_nodes)
        return [order[t] for t in targets(position[node], nodes, replicas, placement)]
    if placement == "ring":
        return [(node + i) % nodes for i in range(1, r + 1)]
    group = _group_of(nodes, r)[node]
    at = group.index(node)
    return [group[(at + i) % len(group)] for i in range(1, r + 1)]  # the whole group when it has m members


def holders(nodes: int, replicas: int, placement: str, domain_nodes: int = 0) -> list[frozenset[int]]:
    """For every node, the nodes holding its state: itself and its targets."""
    return [frozenset([i, *targets(i, nodes, replicas, placement, domain_nodes)]) for i in range(nodes)]


def survives(lost: set[int] | frozenset[int], holder_sets: list[frozenset[int]]) -> bool:
    """Whether every node's state is still held by a node not in ``lost``."""
    return all(not h <= lost for h in holder_sets)


@lru_cache(maxsize=None)
def _ring_cyclic_free(n: int, k: int, m: int) -> int:
    """k-subsets of n nodes on a cycle that contain no m cyclically consecutive nodes (a ring placement
    loses a state exactly when m consecutive nodes are lost). A walk along the cycle, by the number
    lost so far, the run lost at its start (while no survivor was met) and the run lost at its end."""
    if k == 0:
        return 1
    if k >= n:
        return 0
    dp: dict[tuple[int, int, bool, int], int] = {(0, 0, True, 0): 1}
    for _ in range(n):
        nxt: dict[tuple[int, int, bool, int], int] = {}
        for (ones, lead, opening, trail), ways in dp.items():
            key = (ones, lead, False, 0)  # this node survives
            nxt[key] = nxt.get(key, 0) + ways
            if ones < k and trail + 1 < m and (not opening or lead + 1 < m):  # this node is lost
                key = (ones + 1, lead + 1 if opening else lead, opening, trail + 1)
                nxt[key] = nxt.get(key, 0) + ways
        dp = nxt
    return sum(w for (ones, lead, opening, trail), w in dp.items()
               if ones == k and not opening and lead + trail < m)


def _lost_ways(nodes: int, k: int, placement: str, replicas: int) -> int:
    """k-subsets of the nodes that keep every state in memory, counted exactly."""
    m = min(replicas, nodes - 1) + 1
    if placement == "ring":
        return _ring_cyclic_free(nodes, k, m)
    gs = groups(nodes, m - 1)
    # Full groups: lost whole or not. The last group of a mixed placement is a ring inside it.
    sizes = [len(g) for g in gs]
    # Count by a product over groups: ways to lose j nodes of a group without losing a state in it.
    per_group = []
    for size in sizes:
        if size == m:
            per_group.append([comb(size, j) if j < size else 0 for j in range(size + 1)])
        else:
            per_group.append([_ring_cyclic_free(size, j, m) for j in range(size + 1)])
    ways = [1]
    for counts in per_group:
        out = [0] * (len(ways) + len(counts) - 1)
        for a, wa in enumerate(ways):
            for b, wb in enumerate(counts):
                out[a + b] += wa * wb
        ways = out
    return ways[k] if k < len(ways) else 0


def recovery_probability(nodes: int, replicas: int, lost: int, placement: str = "ring") -> float:
    """The exact probability that losing ``lost`` of ``nodes`` nodes at once (every set of that size
    equally likely) leaves every node's state in a surviving node's memory."""
    if not 0 <= lost <= nodes:
        raise ValueError(f"lost must be in 0..{nodes}, got {lost}")
    if lost == 0:
        return 1.0
    if lost == nodes:
        return 0.0
    ways = _lost_ways(nodes, lost, placement, replicas)
    return ways / comb(nodes, lost)


def enumerate_probability(nodes: int, replicas: int, lost: int, placement: str = "ring") -> float:
    """The same by listing every loss (small clusters only): the formula's check."""
    hs = holders(nodes, replicas, placement)
    sets = list(itertools.combinations(range(nodes), lost))
    return sum(survives(frozenset(s), hs) for s in sets) / len(sets)


def simulate(nodes: int, replicas: int, lost: int, placement: str = "ring", trials: int = 20000,
             seed: int = 0) -> float:
    """The share of ``trials`` random losses of ``lost`` nodes that keep every state in memory."""
    rng = random.Random(seed)
    hs = holders(nodes, replicas, placement)
    return sum(survives(frozenset(rng.sample(range(nodes), lost)), hs) for _ in range(trials)) / trials


def domains(nodes: int, domain_nodes: int, layout: str = "aligned") -> list[list[int]]:
    """The nodes of each failure domain of (at most) ``domain_nodes`` nodes: consecutive ranks (``aligned``)
    or every ``count``-th rank (``interleaved``); ``random`` has no fixed sets (its sizes are the aligned ones)."""
    if layout not in DOMAIN_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(DOMAIN_LAYOUTS)}, got {layout!r}")
    if nodes < 1 or domain_nodes < 1:
        raise ValueError(f"nodes and domain_nodes must be >= 1, got {nodes} and {domain_nodes}")
    count = -(-nodes // domain_nodes)
    if layout == "interleaved":
        return [list(range(d, nodes, count)) for d in range(count)]
    return [list(range(d * domain_nodes, min(nodes, (d + 1) * domain_nodes))) for d in range(count)]


def domain_recovery_probability(nodes: int, replicas: int, domain_nodes: int, placement: str = "ring",
                                layout: str = "aligned", aware: bool = False) -> float:
    """The share of failure domains (each as likely to fail) whose loss of all its nodes leaves every node's
    state in a surviving node's memory. Only a lost node's state can be lost (every holder set holds its
    node), so each domain checks the holders of its own nodes. ``aware``: the stores are told the domains
    as ``aligned`` ones (``domain_nodes`` consecutive ranks) and spread the replicas over them; under the
    ``random`` layout that tells them nothing (a relabelling: the chance is the one without)."""
    sets = domains(nodes, domain_nodes, layout)
    if layout == "random":
        return sum(recovery_probability(nodes, replicas, len(d), placement) for d in sets) / len(sets)
    hs = holders(nodes, replicas, placement, domain_nodes if aware else 0)
    kept = 0
    for d in sets:
        lost = frozenset(d)
        kept += all(not hs[i] <= lost for i in d)
    return kept / len(sets)


def table(nodes: list[int], replicas: list[int], lost: list[int], trials: int = 20000, seed: int = 1) -> str:
    """A Markdown table: the exact probability for ring and group placement, the simulation's in brackets."""
    lines = ["| nodes | replicas | lost at once | ring: exact (simulated) | group: exact (simulated) |",
             "|---|---|---|---|---|"]
    for n in nodes:
        for r in replicas:
            for k in lost:
                if k >= n:
                    continue
                cells = [f"{recovery_probability(n, r, k, p):.4f} ({simulate(n, r, k, p, trials, seed):.4f})"
                         for p in PLACEMENTS]
                lines.append(f"| {n} | {r} | {k} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m baft.store.placement",
                                description="the chance that k nodes lost at once leave every state in peer memory")
    p.add_argument("--nodes", type=int, nargs="+", default=[8, 16, 64, 1024])
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    p.add_argument("--lost", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--trials", type=int, default=20000)
    a = p.parse_args(argv)
    if min(a.nodes) < 2 or min(a.replicas) < 0 or min(a.lost) < 0 or a.trials < 1:
        p.error("nodes >= 2, replicas >= 0, lost >= 0, trials >= 1")
    print(table(a.nodes, a.replicas, a.lost, a.trials))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
