"""``baft bench``: the cost of each checkpointing strategy against none, measured paired, in two tiers.

One torchrun job trains the reference workload while *arms* take turns in
blocks of ``block`` iterations, in a freshly shuffled order every cycle:

* the **snapshot tier**, a consistent copy of the state off the training path
  every iteration and nothing persisted: baft's in-bubble snapshot
  (``baft:snapshot``), CheckFreq's copy at the boundary (``checkfreq:snapshot``)
  and DCP's staging step through its ``DefaultStager`` (``async-dcp:staging``);
  a block's cost is its median iteration (the first dropped);
* the **persistent tier**, every strategy persisting every ``k`` iterations for
  each ``k`` of ``persist_every`` (arm ``NAME@k``, the same ``k`` for all); the
  block is a multiple of every ``k`` and starts just before a persist, the
  background work left at its end is drained *timed*, and a block's cost is
  its total time over its iterations (a median would hide the persists).

Each block is paired with the ``none`` block of the same cycle. After the
cycles the job times restores from each tier. The orchestrating process turns
the raw timings into paired ratios (``analysis.benchstats``), prints both
tables and writes ``bench.json`` with every arm's settings beside its ratio.

Worker: ``python -m harness.bench.rank SPEC.json`` (started by the launcher; :mod:`harness.bench.rank`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import baft.strategies.registry as registry
from baft import CheckpointConfig

from harness.errors import ConfigValueError
from harness.worker.spec import LaunchFacts, WorkloadConfig


def snapshot_arms() -> dict[str, str]:
    """The snapshot-tier arm of each strategy that has a snapshot step of its own (its registry entry's
    ``snapshot_arm``): ``{"baft": "baft:snapshot", ...}``."""
    return {e.name: e.snapshot_arm_name for e in registry.entries() if e.snapshot_arm_name is not None}
NEVER = 10**12
FLOOR_ARM = "floor:replicate"


def floor_with_sync(every: int) -> str:
    """The arm that persists as ``sync@every`` while the floor replicator moves every iteration's bytes: the
    simplest programs doing ``baft@every``'s persisting and replicating, together."""
    return f"floor:sync@{every}+replicate"


def floor_of_work(every: int) -> str:
    """The honest floor of ``baft@every``: baft itself, replication off, while a plain replicator sends each sealed
    slot (rotating as the slots do) into a ring of mappings on the next node, placed in the job's scheduling group
    at the idle class: the least the stores could do, at the best placement a background helper has here."""
    return f"floor:work@{every}"


def is_floor(arm: str) -> bool:
    """Whether the floor replicator runs beside the arm ``arm``."""
    return arm.startswith("floor:")


def is_floor_of_work(arm: str) -> bool:
    """Whether ``arm`` is a :func:`floor_of_work` arm (its replicator sends the sealed slots, not a fixed file)."""
    return arm.startswith("floor:work@")
"""With 2+ nodes: training with no checkpoint beside a plain program that replicates the state's bytes every
iteration (:mod:`harness.bench.floorlink`): the floor under ``baft@k``'s replication cost."""
"""``every`` of a checkpointer that never persists."""


@dataclass(frozen=True, slots=True)
class Arm:
    """One contender of the benchmark: a strategy at one setting, in one tier."""

    name: str
    tier: Literal["baseline", "snapshot", "persistent"]
    strategy: str
    every: int


#: The workload fields the bench sets itself or has no use for (it trains the built-in pipeline for as many
#: steps as its blocks take): no flag, and a value other than the default is refused.
BENCH_WORKLOAD_FIELDS = ("steps", "script", "command", "nproc", "adapters", "deterministic", "reproducible", "args",
                         "omit", "mutant")
#: The checkpoint fields the bench sets per arm (strategy, interval, directories, the node's store).
BENCH_CHECKPOINT_FIELDS = ("strategy", "every", "mtbf_hours", "every_min", "every_max", "dir", "baft.shm_dir",
                           "baft.store", "baft.node")


def _bench_workload() -> WorkloadConfig:
    # a dataset large enough for any batch the bench's flags give (its size does not change the timings)
    return WorkloadConfig(microbatches=8, dataset_size=8192)


def _bench_checkpoint() -> CheckpointConfig:
    return CheckpointConfig(keep=2)


@dataclass(kw_only=True, slots=True)
class BenchConfig:
    """What ``baft bench`` measures: the training job, what every arm's checkpointer shares, and the arms, cycles
    and blocks of the paired comparison."""

    FLAGLESS: ClassVar[tuple[str, ...]] = (tuple(f"workload.{n}" for n in BENCH_WORKLOAD_FIELDS)
                                           + tuple(f"checkpoint.{n}" for n in BENCH_CHECKPOINT_FIELDS))
    #: The flags before the bench took the workload and checkpoint sections (one release, with a warning).
    RENAMED_FLAGS: ClassVar[dict[str, str]] = {
        **{n: f"workload.{n}" for n in ("model", "stages", "dp_shard", "tp", "nodes", "microbatches",
                                         "microbatch_size", "schedule", "seed")},
        "persist_nice": "checkpoint.persist_nice", "persist_writer": "checkpoint.baft.writer",
        "dcp_async": "checkpoint.async_dcp.mode", "dcp_stager": "checkpoint.async_dcp.stager",
        "replicate_every": "checkpoint.baft.replicate_every",
        "replication_yield": "checkpoint.baft.replication.yield_to_training",
        "replication_max_slowdown": "checkpoint.baft.replication.max_slowdown",
        "store_priority": "checkpoint.baft.replication.priority", "writer_priority": "checkpoint.baft.writer_priority",
        "persist_window_ms": "checkpoint.baft.persist_window_ms", "baft_copier": "checkpoint.baft.planner.copier",
    }

    workload: WorkloadConfig = field(default_factory=_bench_workload)
    """The training job the arms take turns on: the built-in pipeline, as a scenario's ``workload:`` section
    (the bench trains it for as many steps as its blocks take)."""
    checkpoint: CheckpointConfig = field(default_factory=_bench_checkpoint)
    """What every arm's checkpointer shares, as a scenario's ``checkpoint:`` section: baft's slots, writers,
    replication (with 2+ nodes, through the node stores), profiler and planner; async-dcp's writer and stager. The
    bench sets each arm's strategy, interval and directories."""
    strategies: list[str] = field(default_factory=lambda: list(registry.names()))
    """Strategies to compare (every registered one: ``baft.strategies.registry``); ``none`` is always added (it
    is the baseline). Each persists in the persistent tier; those with a snapshot step of their own (baft,
    checkfreq, async-dcp) also bring it to the snapshot tier."""
    cycles: int = 20
    """Cycles; each runs every arm for one block (the n of the paired statistics)."""
    block: int = 10
    """Iterations per block: a multiple of every persist interval (a block holds whole persist cycles)."""
    warmup: int = 1
    """Untimed cycles first (allocations, first touch of shared memory, profiling)."""
    persist_every: list[int] = field(default_factory=lambda: [1, 10])
    """Persistent tier: every strategy persists every k iterations, for each k given (the same k for all).
    With 2+ nodes the baft arm of the first k replicates through the node stores (bench.json says which)."""
    link_rate: str | None = None
    """With 2+ nodes: run each node in its own network namespace and throttle every node's
    link to this rate (tc units, e.g. ``50mbit``); the rate achieved is measured. Needs root."""
    link_classes: bool = True
    """With ``link_rate``: the throttled link serves packets by socket priority (strict, like a NIC's traffic
    classes), so the stores' replicas, marked as filler, go only when no training packet waits."""
    floor_arm: bool = True
    """With 2+ nodes and ``baft``: the arm ``floor:replicate``, training with no checkpoint while a plain program
    (in the stores' CPU class) moves each rank's state bytes to the next node every iteration, as a store does
    with nothing else: the training-side floor of replication on this machine, paired like every arm. Not with
    ``link_rate``: a throttled link cannot carry a replica every iteration (the stores' stride and pacing decide
    what they send there), and a replica still in flight at the end of its block would load the next arm's.
    With ``sync`` among the strategies also ``floor:sync@k+replicate`` for each k: a blocking save every k
    iterations while the same program moves the bytes — the simplest programs doing baft@k's persisting and
    replicating at once, the floor that baft@k on two nodes is measured against."""
    floor_count: int = 800
    """With 2+ nodes: copies of a replica the floor (a plain sendfile loop on loopback, both sides' CPU) moves
    in each of its three measurements, after the job (0: no floor)."""
    restore_repeats: int = 3
    """Timed restores per tier."""

    @property
    def world_size(self) -> int:
        return self.workload.world_size

    @property
    def nodes(self) -> int:
        return self.workload.nodes

    def __post_init__(self) -> None:
        self._check_sections()
        for name in ("cycles", "block", "restore_repeats"):
            if getattr(self, name) < 1:
                raise ConfigValueError(name, "an integer >= 1", getattr(self, name))
        if not self.persist_every or any(k < 1 for k in self.persist_every) or len(set(self.persist_every)) < len(self.persist_every):
            raise ConfigValueError("persist_every", "distinct integers >= 1", self.persist_every)
        if self.block < 2:
            raise ConfigValueError("block", "an integer >= 2 (the first iteration of a block is dropped)", self.block)
        if self.block % self.period:
            raise ConfigValueError("block", f"a multiple of {self.period} (every persist interval: whole persist cycles "
                                   "in a block)", self.block)
        if self.floor_count < 0:
            raise ConfigValueError("floor_count", "an integer >= 0 (0: no floor)", self.floor_count)
        if self.warmup < 0:
            raise ConfigValueError("warmup", "an integer >= 0", self.warmup)
        known = registry.names()
        for s in self.strategies:
            if s not in known:
                raise ConfigValueError("strategies", "names among " + ", ".join(known), s)
        if self.link_rate is not None:
            from injectors.network import parse_rate

            if self.nodes < 2:
                raise ConfigValueError("link_rate", "2+ nodes (a link needs two ends)", self.link_rate)
            try:
                parse_rate(self.link_rate)
            except ValueError:
                raise ConfigValueError("link_rate", "a tc rate such as 50mbit or 1gbit", self.link_rate) from None
        if "none" not in self.strategies:
            self.strategies.insert(0, "none")

    def _check_sections(self) -> None:
        """The workload is the built-in pipeline and the fields the bench sets are left at their defaults."""
        if not isinstance(self.workload, WorkloadConfig) or not isinstance(self.checkpoint, CheckpointConfig):
            raise ConfigValueError("workload" if not isinstance(self.workload, WorkloadConfig) else "checkpoint",
                                   "a WorkloadConfig and a CheckpointConfig", self.workload)
        for section, names, default in (("workload", BENCH_WORKLOAD_FIELDS, WorkloadConfig()),
                                        ("checkpoint", BENCH_CHECKPOINT_FIELDS, CheckpointConfig())):
            for name in names:
                value, expected = getattr(self, section), default
                for part in name.split("."):
                    value, expected = getattr(value, part), getattr(expected, part)
                if value != expected:
                    raise ConfigValueError(f"{section}.{name}", f"{expected!r}, its default (the bench sets it, or "
                                           "trains the built-in pipeline without it)", value)

    @property
    def period(self) -> int:
        """The least common multiple of the persist intervals."""
        return math.lcm(*self.persist_every)

    def arms(self) -> list[Arm]:
        """Every arm, the baseline first."""
        out = [Arm("none", "baseline", "none", NEVER)]
        snapshots = snapshot_arms()
        out += [Arm(snapshots[s], "snapshot", s, NEVER) for s in self.strategies if s in snapshots]
        out += [Arm(f"{s}@{k}", "persistent", s, k) for s in self.strategies if s != "none" for k in self.persist_every]
        if self.floor_arm and self.nodes > 1 and "baft" in self.strategies and self.link_rate is None:
            out.append(Arm(FLOOR_ARM, "persistent", "none", NEVER))
            # baft's own work, replication off, and a plain program moving each sealed slot (issue 55)
            out.append(Arm(floor_of_work(self.persist_every[0]), "persistent", "baft", self.persist_every[0]))
            if "sync" in self.strategies:  # the floor of baft@k's two works at once: a blocking save and the bytes
                out += [Arm(floor_with_sync(k), "persistent", "sync", k) for k in self.persist_every]
        return out

    def order(self) -> list[tuple[int, str]]:
        """(cycle, arm) per block; cycle -1 for the untimed warm-up."""
        rng = random.Random(self.workload.seed)
        names = [a.name for a in self.arms()]
        out = [(-1, a) for _ in range(self.warmup) for a in names]
        for c in range(self.cycles):
            shuffled = list(names)
            rng.shuffle(shuffled)
            out += [(c, a) for a in shuffled]
        return out

    @property
    def iterations(self) -> int:
        return len(self.order()) * self.block


@dataclass(kw_only=True, slots=True)
class BenchSpec(LaunchFacts):
    """What every rank of the benchmark job is told (its ``worker-spec.json``)."""

    bench: BenchConfig
    """What to measure."""
    shm_dir: str
    """The shared-memory directory of the snapshot slots (the node stores' with 2+ nodes)."""


def summarize(cfg: BenchConfig, raw: dict[str, Any]) -> dict[str, Any]:
    """bench.json: paired ratios per arm in each tier with its settings, baft's bubble use, restore times."""
    from analysis.benchstats import paired_ratios

    arms = cfg.arms()
    tiers: dict[str, dict[str, Any]] = {}
    for tier, stat in (("snapshot", "median"), ("persistent", "mean")):
        names = {a.name for a in arms if a.tier == tier}
        if names:
            tiers[tier] = {"statistic": stat, "arms": paired_ratios(raw["iterations"], stat=stat, only=names)}
    settings: dict[str, dict[str, Any]] = {}
    ck, own = cfg.checkpoint, cfg.checkpoint.baft
    for a in arms:
        s: dict[str, Any] = {"tier": a.tier, "strategy": a.strategy,
                             "persist_every": a.every if a.tier == "persistent" else None}
        entry = registry.get(a.strategy)
        if entry.snapshot_arm is not None and (a.tier == "snapshot" or entry.background_persist):
            s[entry.snapshot_arm] = entry.snapshot_note  # the copy its background persists from, too
        if entry.traits.node_stores:
            s["replicates"] = cfg.nodes > 1 and a.tier == "persistent" and a.every == cfg.persist_every[0]
        if entry.background_persist and a.tier == "persistent":
            s["persist_nice"] = ck.persist_nice
        section = getattr(ck, entry.section) if entry.section is not None else None
        describe = getattr(section, "bench_settings", None)
        if describe is not None:  # what its own section sets (baft: the copier, the writers)
            s.update(describe(a.tier == "persistent"))
        if is_floor_of_work(a.name):
            s["replicates"] = ("the honest floor: baft's own work with replication off, while a plain program sends "
                               "each sealed slot (sendfile, the slots' rotation) into a ring of mappings on the next "
                               f"node (recv_into), in the job's scheduling group, {own.replication.priority} class")
        elif is_floor(a.name):
            s["replicates"] = (f"the floor: {'no checkpoint' if a.name == FLOOR_ARM else 'a blocking save every ' + str(a.every)}"
                               "; a plain program moves the state's bytes to the next node every iteration (sendfile, "
                               f"recv_into a mapping), {own.replication.priority} class")
        s.update((raw.get("settings") or {}).get(a.name) or {})
        settings[a.name] = s
    for t in tiers.values():
        for name, r in t["arms"].items():
            r["settings"] = settings[name]
    snaps = [e for r in raw["ranks"] for e in r["baft"] if e["event"] == "snapshot"]
    bubbles = [e for r in raw["ranks"] for e in r["baft"] if e["event"] == "bubbles"]
    baft: dict[str, Any] = {}
    if snaps:
        copy_s = sum(e["copy_seconds"] + e["stall_seconds"] for e in snaps)
        baft = {
            "snapshots": len(snaps),
            "snapshot_bytes_per_rank": statistics.median(e["bytes"] for e in snaps),
            "snapshot_gbytes_per_s": (sum(e["bytes"] for e in snaps) / copy_s / 1e9) if copy_s else None,
            "in_window_fraction": statistics.median(b["in_window_fraction"] for b in bubbles) if bubbles else None,
            "bubble_utilisation": statistics.median(b["utilisation"] for b in bubbles) if bubbles else None,
            "idle_ms_per_iteration": statistics.median(b["idle_seconds"] for b in bubbles) * 1e3 if bubbles else None,
            "stall_ms_median": statistics.median(e["stall_seconds"] for e in snaps) * 1e3,
            "replans": sum(1 for r in raw["ranks"] for e in r["baft"] if e["event"] == "replan"),
        }
    restores: dict[str, Any] = {}
    for tier in sorted({t for r in raw["ranks"] for t in r["restores"]}):
        per_rank = [r["restores"].get(tier, []) for r in raw["ranks"]]
        vals = [max(xs) for xs in zip(*per_rank)] if all(per_rank) else []
        restores[tier] = {"seconds_median": statistics.median(vals) if vals else None, "n": len(vals)}
    if restores.get("shm", {}).get("seconds_median"):
        for tier in ("peer", "persistent-dcp", "persistent-sync"):
            if restores.get(tier, {}).get("seconds_median"):
                restores[tier]["slower_than_shm"] = restores[tier]["seconds_median"] / restores["shm"]["seconds_median"]
    out = {"config": dataclasses.asdict(cfg), "tiers": tiers, "baft": baft, "restore": restores}
    gap, older = floor_gap(cfg, raw["iterations"]), floor_gap(cfg, raw["iterations"], of_work=False)
    if gap:
        out["floor_gap"] = gap
    if older:
        out["floor_gap_sync"] = older  # the older floor, for comparison
    return out


def floor_gap(cfg: BenchConfig, iterations: list[dict[str, Any]], of_work: bool = True) -> dict[str, Any]:
    """The replicating ``baft@k`` paired with the floor of its work, ``floor:work@k`` (``of_work``; else with
    ``floor:sync@k+replicate``, the older floor: a blocking save and a plain program moving a fixed file),
    instead of with ``none``: per cycle the block's mean iteration over the floor arm's, the median over cycles
    with its IQR and bootstrap 95% interval ({}: no such pair in this run). What baft adds over the least this
    machine pays for the same work, like with like in one run."""
    from analysis.benchstats import paired_ratios

    names = {a.name for a in cfg.arms()}
    k = cfg.persist_every[0]  # the arm placed on the stores (the one that replicates)
    arm, floor = f"baft@{k}", floor_of_work(k) if of_work else floor_with_sync(k)
    if cfg.nodes < 2 or arm not in names or floor not in names:
        return {}
    got = paired_ratios(iterations, baseline=floor, stat="mean", only={arm}).get(arm)
    if got is None:
        return {}
    return {arm: {"floor_arm": floor, "ratio": got["ratio_vs_none"], "iqr": got["iqr"], "ci95": got["ci95"],
                  "n": got["n"]}}


TIER_TITLES = {
    "snapshot": "snapshot tier: a consistent copy every iteration, nothing persisted (block median)",
    "persistent": "persistent tier: every strategy persists every k iterations (block mean, drain included)",
}


def table(result: dict[str, Any]) -> str:
    lines: list[str] = []
    for tier, t in result["tiers"].items():
        w = max([20, *map(len, t["arms"])])  # the arm column fits the longest name (floor:sync@k+replicate)
        lines += [TIER_TITLES[tier],
                  f"  {'arm':<{w}} {'ratio vs none':>13} {'IQR':>17} {'95% CI':>17} {'n':>3} {'iter ms':>8}"]
        for name, s in sorted(t["arms"].items(), key=lambda kv: kv[1]["ratio_vs_none"]):
            lines.append(
                f"  {name:<{w}} {s['ratio_vs_none']:>13.4f} {s['iqr'][0]:>8.4f}-{s['iqr'][1]:<8.4f} "
                f"{s['ci95'][0]:>8.4f}-{s['ci95'][1]:<8.4f} {s['n']:>3} {s['median_iteration_ms']:>8.1f}"
            )
    for name, g in (result.get("floor_gap") or {}).items():
        lines.append(f"{name} against the floor of its work ({g['floor_arm']}: baft with replication off and a plain "
                     f"replicator of its slots, paired per cycle): {g['ratio']:.4f} "
                     f"(95% CI {g['ci95'][0]:.4f}-{g['ci95'][1]:.4f}, n={g['n']})")
    for name, g in (result.get("floor_gap_sync") or {}).items():
        lines.append(f"{name} against the older floor ({g['floor_arm']}, paired per cycle): {g['ratio']:.4f} "
                     f"(95% CI {g['ci95'][0]:.4f}-{g['ci95'][1]:.4f}, n={g['n']})")
    dcp = next((s["settings"] for t in result["tiers"].values() for s in t["arms"].values()
                if s["settings"].get("async")), None)
    if dcp:
        lines.append(f"async-dcp: {dcp['async']} writer, {dcp['stager']}, pinned memory "
                     f"{'yes' if dcp['pinned_memory'] else 'no (no CUDA)'}, shared memory {'yes' if dcp['shared_memory'] else 'no'}")
    b = result.get("baft") or {}
    if b:
        lines.append(
            f"baft: {b['snapshot_bytes_per_rank'] / 1e6:.2f} MB/rank per snapshot, "
            f"{(b['in_window_fraction'] or 0) * 100:.1f}% of bytes copied inside bubbles, "
            f"{b['snapshot_gbytes_per_s'] or 0:.2f} GB/s, idle {b['idle_ms_per_iteration'] or 0:.1f} ms/iteration, "
            f"stall median {b['stall_ms_median']:.3f} ms, {b['replans']} plans"
        )
    link = result.get("link")
    if link:
        lines.append(f"link: throttled to {link['rate_bit'] / 1e6:.0f} Mbit/s, measured {link['measured_bit'] / 1e6:.1f} Mbit/s"
                     + ("; packets served by socket priority (replicas last)" if link.get("classes") else "; one FIFO"))
    rep = result.get("replication")
    if rep:
        lines.append(f"replication: {rep['replicated']} replicas sent, {rep['skipped']} versions skipped (link too slow), "
                     f"{rep['failed']} failed; {rep['mbytes_per_s'] or 0:.1f} MB/s per transfer, "
                     f"deferred for training traffic {rep['deferred_ms_median'] or 0:.1f} ms (median)")
        if rep.get("degraded"):
            lines.append(f"replication stopped {rep['degraded']} time(s), resumed {rep['resumed']}: "
                         f"{rep['degraded_reason']}")
        if rep.get("store_cpu_seconds_per_gb") is not None:
            lines.append(f"stores ({', '.join(rep.get('store_priority') or [])}): {rep['store_cpu_seconds']:.1f} CPU-s in "
                         f"all ({rep['store_cpu_seconds_per_gb']:.2f} per replicated GB, starting included), at most "
                         f"{rep['store_max_rss_mbytes']:.0f} MB resident each; {rep['connections']} connection(s) to "
                         f"peers, {rep['paced_share'] or 0:.0%} of replicas paced")
        if rep.get("group_lowered") is not None:
            lines.append(f"stores' group (adaptive): lowered to nice 19 {rep['group_lowered']} time(s), raised back "
                         f"{rep['group_raised']}; {rep['group_lowered_share'] or 0:.0%} of replicas sent while lowered")
        if rep.get("replicating_cpu_seconds_per_gb") is not None:
            floor = rep.get("floor_cpu_seconds_per_gb")
            lines.append(f"replication CPU: {rep['replicating_cpu_seconds_per_gb']:.3f} CPU-s per replicated GB while "
                         f"replicating, {rep['serving_cpu_seconds_per_gb'] or 0:.3f} from start to stop"
                         + (f"; the floor (a plain sendfile loop, both sides, same run) {floor:.3f}: "
                            f"{rep['replicating_times_floor']:.2f}x / {rep['serving_times_floor']:.2f}x the floor"
                            if floor else ""))
        if rep.get("floor_replicator_cpu_seconds_per_gb"):
            lines.append(f"  the floor replicator (floor:replicate: the same bytes at the same cadence beside the same "
                         f"training) spent {rep['floor_replicator_cpu_seconds_per_gb']:.3f} CPU-s per GB: the stores "
                         f"{rep['times_floor_replicator']:.2f}x that")
        if rep.get("behind_versions_median") is not None:
            lines.append(f"staleness: a replica lands {rep['behind_versions_median']:g} versions behind (median; at most "
                         f"{rep['behind_versions_max']}), one every {rep['gap_versions_median'] or 0:g} versions (stride up to "
                         f"{rep['stride_max']}): the newest peer copy is at most {rep['staleness_versions_max'] or 0} versions old"
                         + (f"; from seal to landing {rep['age_versions_median']:.2f} versions (median; at most "
                            f"{rep['age_versions_max']:.2f})" if rep.get("age_versions_median") is not None else ""))
    for tier, r in result["restore"].items():
        if r["seconds_median"] is not None:
            extra = f" ({r['slower_than_shm']:.1f}x shm)" if "slower_than_shm" in r else ""
            if tier == "persistent-dcp" and result["restore"].get("peer", {}).get("seconds_median"):
                extra += f" ({r['seconds_median'] / result['restore']['peer']['seconds_median']:.1f}x peer)"
            lines.append(f"restore from {tier:<15} {r['seconds_median'] * 1e3:8.1f} ms{extra}")
    return "\n".join(lines)


def run_bench(cfg: BenchConfig, out: Path, timeout: float = 3600) -> dict[str, Any]:
    """Launch the benchmark job, then write ``out/bench.json``."""
    import shutil
    import uuid

    from harness.bench.replstats import (
        floor_replicator_stats,
        floor_stats,
        replication_stats,
    )
    from harness.errors import LaunchError
    from harness.run.launcher import LaunchConfig, launch
    from harness.run.storefleet import StoreSpec

    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "journal", ignore_errors=True)
    shm = Path("/dev/shm") / f"baft-bench-{uuid.uuid4().hex[:10]}"
    stores = (StoreSpec(base=shm, replication=cfg.checkpoint.baft.replication)
              if "baft" in cfg.strategies and cfg.nodes > 1 else None)
    link: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        topology = None
        if cfg.link_rate is not None:
            from injectors.linkprobe import measure_throttle
            from injectors.network import NetworkTopology, parse_rate

            topology = stack.enter_context(NetworkTopology(cfg.nodes))
            rate = parse_rate(cfg.link_rate)
            for n in range(cfg.nodes):
                topology.throttle(n, rate, classes=cfg.link_classes)
            link = {"rate_bit": rate, "measured_bit": measure_throttle(topology, 0, 1, rate), "classes": cfg.link_classes}
        try:
            result = launch(out, BenchSpec(bench=cfg, shm_dir=str(shm)),
                            LaunchConfig(nodes=cfg.nodes, world_size=cfg.world_size, max_restarts=0, timeout=timeout,
                                         module="harness.bench.rank", stores=stores, topology=topology))
        finally:
            shutil.rmtree(shm, ignore_errors=True)
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
    raw_path = out / "bench-raw.json"
    if not result.ok or not raw_path.is_file():
        raise LaunchError(f"the benchmark job failed (exit codes {result.returncodes}); logs in {out / 'logs'}")
    raw = json.loads(raw_path.read_text())
    summary = summarize(cfg, raw)
    summary["replication"] = replication_stats(out, cfg.block)
    if summary["replication"].get("replicated") and cfg.floor_count:
        summary["replication"].update(floor_stats(summary["replication"], cfg.floor_count))
    if summary["replication"].get("replicated"):
        summary["replication"].update(floor_replicator_stats(summary["replication"], [r.get("floor") for r in raw["ranks"]]))
    if link:
        summary["link"] = link
    summary["wall_seconds"] = result.seconds
    (out / "bench.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
