"""Pack a stage's checkpoint copy into its idle windows.

The state of a stage (its parameters, buffers and optimizer tensors) is laid
out as one flat byte range and cut into chunks of at most ``chunk_bytes``, never
across a tensor boundary. With D data-parallel replicas of the stage, each
replica copies about 1/D of it: whole tensors, balanced by bytes. The planner assigns this
replica's chunks in order to the measured windows, filling each window up to
``fill`` of its duration at the measured copy bandwidth. What does not fit is
the plan's overflow, and the plan says what happens to it — explicitly:

``stall``     copy the rest before the next optimizer step: a bounded stall of
              ``stall_seconds``, reported every iteration;
``every_k``   snapshot only every ``k`` iterations, with ``k`` chosen so the
              stall, spread over k iterations, stays within ``stall_budget`` of
              an iteration.

A snapshot is never silently inconsistent: the engine copies a version only
between two optimizer steps, and one it cannot finish is discarded.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from baft.errors import BaftConfigError

Overflow = Literal["stall", "every_k"]
Copier = Literal["inline", "thread"]


@dataclass(kw_only=True, slots=True)
class PlannerConfig:
    """How the copy is cut and packed."""

    chunk_bytes: int = 1 << 20
    """Largest chunk; small enough that a copy overrunning a window's end costs little."""
    fill: float = 0.8
    """Fraction of each window the plan may fill (headroom for jitter)."""
    overflow: Overflow = "stall"
    """What to do with what does not fit: ``stall`` or ``every_k``."""
    stall_budget: float = 0.01
    """With ``every_k``: the stall allowed per iteration, as a fraction of the iteration time."""
    max_every: int = 64
    """With ``every_k``: the largest k (a snapshot at least this often, whatever it stalls)."""
    copier: Copier = "inline"
    """``inline``: the training thread does the planned work when it enters each wait, within
    the window's budget; ``thread``: a copier thread works while the training thread waits."""

    def __post_init__(self) -> None:
        if self.chunk_bytes < 1024:
            raise BaftConfigError("chunk_bytes", "an integer >= 1024", self.chunk_bytes)
        if not 0 < self.fill <= 1:
            raise BaftConfigError("fill", "a number in (0, 1]", self.fill)
        if self.overflow not in ("stall", "every_k"):
            raise BaftConfigError("overflow", "stall or every_k", self.overflow)
        if self.max_every < 1 or self.max_every & (self.max_every - 1):
            raise BaftConfigError("max_every", "a power of two >= 1", self.max_every)
        if not 0 < self.stall_budget < 1:
            raise BaftConfigError("stall_budget", "a number in (0, 1)", self.stall_budget)
        if self.copier not in ("inline", "thread"):
            raise BaftConfigError("copier", "inline or thread", self.copier)


@dataclass(frozen=True, slots=True)
class Chunk:
    """Bytes ``[offset, offset + nbytes)`` of the flat state; ``tensor`` indexes the layout."""

    index: int
    tensor: int
    offset: int
    tensor_offset: int
    nbytes: int


def make_chunks(spans: list[tuple[int, int]], chunk_bytes: int) -> list[Chunk]:
    """Cut tensors laid out at ``(offset, nbytes)`` spans into chunks, never across a tensor."""
    chunks: list[Chunk] = []
    for t, (offset, size) in enumerate(spans):
        pos = 0
        while pos < size:
            n = min(chunk_bytes, size - pos)
            chunks.append(Chunk(index=len(chunks), tensor=t, offset=offset + pos, tensor_offset=pos, nbytes=n))
            pos += n
    return chunks


def owned(chunks: list[Chunk], replica: int, replicas: int) -> list[Chunk]:
    """The chunks replica ``replica`` of ``replicas`` copies.

    Whole tensors are dealt to replicas, largest first to the least loaded, so
    each replica holds complete tensors (its persistent copy is then a plain
    set of tensors) and the bytes are balanced to within one tensor.
    """
    if replicas == 1:
        return list(chunks)
    sizes: dict[int, int] = {}
    for c in chunks:
        sizes[c.tensor] = sizes.get(c.tensor, 0) + c.nbytes
    load = [0] * replicas
    owner: dict[int, int] = {}
    for t in sorted(sizes, key=lambda t: (-sizes[t], t)):
        r = min(range(replicas), key=lambda i: (load[i], i))
        owner[t] = r
        load[r] += sizes[t]
    return [c for c in chunks if owner[c.tensor] == replica]


@dataclass(slots=True)
class Plan:
    """Chunks per window, the overflow and the policy for it."""

    windows: list[float]
    bandwidth: float
    assignment: list[list[int]] = field(default_factory=list)
    """Per window, the indices of the chunks planned into it."""
    overflow: list[int] = field(default_factory=list)
    overflow_bytes: int = 0
    total_bytes: int = 0
    policy: Overflow = "stall"
    every: int = 1
    """Snapshot every this many iterations (1 unless ``every_k`` needs more)."""
    reason: str = ""

    @property
    def stall_seconds(self) -> float:
        return self.overflow_bytes / self.bandwidth if self.bandwidth > 0 else math.inf

    @property
    def fits(self) -> bool:
        return not self.overflow

    def describe(self) -> dict[str, object]:
        return {
            "windows": len(self.windows),
            "idle_ms": round(sum(self.windows) * 1e3, 3),
            "bandwidth_gbps": round(self.bandwidth / 1e9, 3),
            "bytes": self.total_bytes,
            "overflow_bytes": self.overflow_bytes,
            "stall_ms": round(self.stall_seconds * 1e3, 3) if self.overflow else 0.0,
            "policy": self.policy,
            "every": self.every,
            "reason": self.reason,
        }


def plan(
    chunks: list[Chunk],
    windows: list[float],
    bandwidth: float,
    config: PlannerConfig,
    *,
    iteration_seconds: float = 0.0,
    reason: str = "",
) -> Plan:
    """Assign ``chunks`` in order to ``windows`` (seconds) at ``bandwidth`` (bytes/s)."""
    p = Plan(windows=list(windows), bandwidth=bandwidth, policy=config.overflow, reason=reason)
    p.assignment = [[] for _ in windows]
    p.total_bytes = sum(c.nbytes for c in chunks)
    w = 0
    used = 0.0
    for c in chunks:
        cost = c.nbytes / bandwidth if bandwidth > 0 else math.inf
        while w < len(windows) and used + cost > windows[w] * config.fill:
            w, used = w + 1, 0.0
        if w < len(windows):
            p.assignment[w].append(c.index)
            used += cost
        else:
            p.overflow.append(c.index)
            p.overflow_bytes += c.nbytes
    if p.overflow and config.overflow == "every_k" and iteration_seconds > 0:
        # No iteration measured yet (the first snapshot): no basis for a budget, k stays 1.
        budget = config.stall_budget * iteration_seconds
        need = math.ceil(p.stall_seconds / budget) if math.isfinite(p.stall_seconds) else config.max_every
        p.every = min(config.max_every, power_of_two(need))
    return p


def power_of_two(n: float) -> int:
    """The smallest power of two >= n (>= 1). Every rank re-plans on its own, at its own
    moment; with k a power of two, the versions of the rank with the larger k are also
    versions of every other rank, so a restore always finds a version all ranks hold."""
    k = 1
    while k < n:
        k *= 2
    return k
