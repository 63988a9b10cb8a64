"""What a measured run says about the costs a projection needs: its profile.

A projection (:mod:`analysis.projection`) reduces a strategy to a few costs: the
stall per checkpoint, how long a checkpoint takes to become durable on each tier,
the retrieval of each tier, the iteration and its bubbles, the time to start a job.
A ``baft run`` directory (its faulted run's journal, its reference's journal and
the faulted run's ``worker-spec.json``) or a ``bench.json`` of ``baft bench``
measured all of them. :func:`read_profile` reads them into a :class:`Profile`.

Only component costs go in, never what a fault cost: the recovery phases and the
lost steps are what :mod:`analysis.projcheck` predicts from a profile and
compares with the verdict. The one exception is ``restart_seconds`` (a
launcher's cost, the projection's ``restart_seconds``), taken from the run's
recoveries when it had any, and used by a target projected from the run only.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .advisor import measured_cost
from .errors import AnalysisError
from .journal import Journal


@dataclass(kw_only=True, slots=True)
class Profile:
    """The measured costs of one run (None: the run does not tell)."""

    source: str
    """The run directory or bench.json it was read from."""
    strategy: str
    """The faulted run's checkpointing strategy (``baft`` for a bench.json)."""
    ranks: int
    stages: int
    nodes: int
    iteration_seconds: float
    """Mean seconds from one step's end to the next's, without checkpointing (the reference run; the bench's
    ``none`` arm)."""
    first_step_seconds: float | None = None
    """The reference's first step (a job's first step after any start: warm-up included)."""
    start_seconds: float | None = None
    """From the first worker process created to every rank's process group formed, in the faulted run's first
    incarnation (what a restart repeats)."""
    bubble_share: float | None = None
    """The share of an iteration a stage is idle (baft's profiler; median over the ranks)."""
    state_bytes_per_rank: float | None = None
    """Bytes of one rank's checkpointed state (baft: its snapshot; otherwise its persistent share)."""
    copy_gbytes_per_s: float | None = None
    """baft's copy rate into host memory, per rank."""
    stall_seconds: float | None = None
    """Seconds one checkpoint stalls the training thread (:func:`analysis.advisor.measured_cost`)."""
    snapshot_every: int | None = None
    """Steps between baft's in-memory versions."""
    persist_every: int | None = None
    """Steps between persistent checkpoints (the median gap of those written)."""
    persist_seconds: float | None = None
    """Median seconds one rank took to write its share of a persistent checkpoint."""
    persist_bytes_per_rank: float | None = None
    replicas: int = 0
    """Peer copies of each node's versions (baft's stores)."""
    replicate_every: int | None = None
    """Steps between the versions a store sent to its peers (the median gap)."""
    replicate_lag_seconds: float | None = None
    """Median seconds from a version's seal to its copy on the peer (waiting for the link included)."""
    replica_gbytes_per_s: float | None = None
    """The stores' transfer rate of one replica."""
    replication_stopped: dict[str, int] = field(default_factory=dict)
    """Node -> the step its store stopped replicating (the replication stride's verdict)."""
    restore_seconds: dict[str, float] = field(default_factory=dict)
    """Median restore time by tier (``shm``, ``peer``, ``persistent``), where the source measured it."""
    restart_seconds: float | None = None
    """Median of the recoveries' restart, startup and rendezvous phases (None without a recovery)."""
    detect_seconds: float | None = None
    """Median detection of the stalls (hang, partition) the watchdog found."""

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _gaps(steps: list[int]) -> list[int]:
    s = sorted(set(steps))
    return [b - a for a, b in zip(s, s[1:]) if b > a]


def step_gaps(journal: Journal, skip_first: int = 1) -> list[float]:
    """Seconds between consecutive steps of each rank within one incarnation (the first ``skip_first`` steps of
    every incarnation left out: a start's warm-up is not an iteration's cost)."""
    out = []
    for rank in journal.ranks:
        by_inc: dict[int, list[dict[str, Any]]] = {}
        for e in journal.events("step", rank):
            by_inc.setdefault(e["incarnation"], []).append(e)
        for evs in by_inc.values():
            for a, b in list(zip(evs, evs[1:]))[skip_first:]:
                if b["step"] == a["step"] + 1:
                    out.append(b["t"] - a["t"])
    return out


def _start_seconds(run: Journal) -> float | None:
    """From the first worker process created to every rank's process group formed, in the first incarnation."""
    starts = [e for e in run.events("start") if e["incarnation"] == 0]
    created = [e["created"] for e in starts if e.get("created") is not None]
    return (max(e["t"] for e in starts) - min(created)) if created and len(created) == len(starts) else None


def _per_rank_median(events: list[dict[str, Any]], key: str) -> float | None:
    by_rank: dict[Any, list[float]] = {}
    for e in events:
        if e.get(key) is not None:
            by_rank.setdefault(e.get("rank"), []).append(float(e[key]))
    return _median([statistics.median(v) for v in by_rank.values()])


def profile_of_run(run_dir: Path) -> Profile:
    """The profile of a ``baft run`` directory (``faulted/`` and ``reference/`` beside ``verdict.json``)."""
    run_dir = Path(run_dir)
    spec_path = run_dir / "faulted" / "worker-spec.json"
    if not spec_path.is_file():
        raise AnalysisError(f"{run_dir}: no faulted/worker-spec.json (not a run directory of `baft run`?)")
    spec = json.loads(spec_path.read_text())
    run, ref = Journal.load(run_dir / "faulted"), Journal.load(run_dir / "reference")
    workload, ckpt = spec["workload"], spec["checkpoint"]
    gaps = step_gaps(ref)
    if not gaps:
        raise AnalysisError(f"{run_dir}/reference: fewer than three steps journaled: no iteration time")
    first = [e["seconds"] for e in ref.events("step") if e["step"] == 0 and e.get("seconds") is not None]

    snaps = [e for e in run.events("snapshot") if e.get("bytes")]
    bubbles = {}
    for rank in run.ranks:
        evs = [e for e in run.events("bubbles", rank) if e.get("iteration_seconds")]
        if evs:
            bubbles[rank] = statistics.mean(e["idle_seconds"] / e["iteration_seconds"] for e in evs)
    copied = sum(e["bytes"] for e in snaps)
    copy_time = sum(e.get("copy_seconds", 0.0) + e.get("stall_seconds", 0.0) for e in snaps)
    saved = [e for e in run.events("checkpoint_saved") if e.get("tier") == "persistent"]
    cost, _ = measured_cost(run)

    replicated = [e for e in run.stores if e.get("event") == "replicated"]
    replica_steps: dict[Any, list[int]] = {}
    for e in replicated:
        replica_steps.setdefault(e["rank"], []).append(e["version"])
    stopped: dict[str, int] = {}
    verdict_path = run_dir / "verdict.json"
    verdict = json.loads(verdict_path.read_text()) if verdict_path.is_file() else {}
    for change in verdict.get("replication_changes", []):
        if change.get("stopped") and change["node"] not in stopped:
            stopped[change["node"]] = change["step"]
    recoveries = verdict.get("recoveries", [])
    restarts = [sum(r["phases"][p] for p in ("restart", "startup", "rendezvous")) for r in recoveries
                if r.get("phases") and all(r["phases"].get(p) is not None for p in ("restart", "startup", "rendezvous"))]
    detections = [r["phases"]["detection"] for r in recoveries if r.get("phases") and r["phases"].get("detection")]
    restores: dict[str, list[float]] = {}
    for e in run.events("checkpoint_restored"):
        restores.setdefault("persistent" if e["tier"] == "persistent" else e["tier"], []).append(e["seconds"])

    return Profile(
        source=str(run_dir), strategy=ckpt["strategy"], ranks=len(run.ranks), stages=workload["stages"],
        nodes=workload.get("nodes") or 1,
        iteration_seconds=statistics.mean(gaps), first_step_seconds=_median(first), start_seconds=_start_seconds(run),
        bubble_share=_median(list(bubbles.values())),
        state_bytes_per_rank=_per_rank_median(snaps, "bytes") or _per_rank_median(saved, "bytes"),
        copy_gbytes_per_s=(copied / copy_time / 1e9) if snaps and copy_time > 0 else None,
        stall_seconds=cost,
        snapshot_every=_median_int([g for r in run.ranks for g in _gaps([e["step"] for e in run.events("snapshot", r)])]),
        persist_every=_median_int(_gaps([e["step"] for e in saved])) or (ckpt["every"] if saved else None),
        persist_seconds=_per_rank_median(saved, "seconds"), persist_bytes_per_rank=_per_rank_median(saved, "bytes"),
        replicas=_replicas(ckpt) if ckpt["strategy"] == "baft" and (workload.get("nodes") or 1) > 1 else 0,
        replicate_every=_median_int([g for v in replica_steps.values() for g in _gaps(v)]),
        replicate_lag_seconds=_median([e.get("deferred_seconds", 0.0) + e["seconds"] for e in replicated]),
        replica_gbytes_per_s=(sum(e["bytes"] for e in replicated) / sum(e["seconds"] for e in replicated) / 1e9)
        if replicated and sum(e["seconds"] for e in replicated) > 0 else None,
        replication_stopped=stopped,
        restore_seconds={k: statistics.median(v) for k, v in restores.items()},
        restart_seconds=_median(restarts), detect_seconds=_median(detections),
    )


def _median_int(xs: list[int]) -> int | None:
    return int(statistics.median_low(xs)) if xs else None


def profile_of_bench(path: Path) -> Profile:
    """The profile of a ``baft bench`` result (its ``bench.json``): the ``none`` arm's iteration, baft's
    bubbles, copy rate and snapshot size, the restore times by tier and the replication rate."""
    try:
        data = json.loads(Path(path).read_text())
        config, tiers, b = data["config"], data["tiers"], data["baft"]
        none = next(arm for tier in tiers.values() for name, arm in tier["arms"].items() if name == "none")
        iteration = none["median_iteration_ms"] / 1e3
    except (OSError, ValueError, KeyError, StopIteration, TypeError) as e:
        raise AnalysisError(f"{path}: not a bench.json of `baft bench` ({type(e).__name__}: {e})") from None
    restores = {("persistent" if k.startswith("persistent") else k): v["seconds_median"]
                for k, v in data.get("restore", {}).items() if v.get("seconds_median") is not None}
    repl = data.get("replication") or {}
    w = config.get("workload", config)  # a bench.json from before the workload section kept its keys flat
    ranks = w["stages"] * w.get("data_parallel", 1) * w.get("dp_shard", 1) * w.get("tp", 1)
    return Profile(
        source=str(path), strategy="baft", ranks=ranks, stages=w["stages"], nodes=w.get("nodes", 1),
        iteration_seconds=iteration,
        bubble_share=(b["idle_ms_per_iteration"] / none["median_iteration_ms"]) if b.get("idle_ms_per_iteration") else None,
        state_bytes_per_rank=b.get("snapshot_bytes_per_rank"), copy_gbytes_per_s=b.get("snapshot_gbytes_per_s"),
        stall_seconds=(b["stall_ms_median"] / 1e3) if b.get("stall_ms_median") is not None else None, snapshot_every=1,
        replicas=1 if repl.get("replicated") else 0,
        replica_gbytes_per_s=(repl["mbytes_per_s"] / 1e3) if repl.get("mbytes_per_s") else None,
        restore_seconds=restores,
    )


def read_profile(path: Path) -> Profile:
    """A run directory's profile, or a bench.json's (a file, or a directory holding ``bench.json``)."""
    path = Path(path)
    if path.is_file():
        return profile_of_bench(path)
    if (path / "bench.json").is_file():
        return profile_of_bench(path / "bench.json")
    if path.is_dir():
        return profile_of_run(path)
    raise AnalysisError(f"{path}: neither a run directory nor a bench.json")


def _replicas(ckpt: dict[str, Any]) -> int:
    """The peer copies a run's checkpoint section asked for: ``baft.replication.replicas``, or ``replicas`` in a
    run from before the strategies' sections (the default, 1, when neither says)."""
    nested = (ckpt.get("baft") or {}).get("replication") or {}
    return int(nested.get("replicas", ckpt.get("replicas", 1)))
