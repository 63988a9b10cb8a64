"""``baft project``: each strategy's wasted share of training time on a target cluster, on paper.

The model and its simulation are :mod:`analysis.projection`; this adds the
numbers analysis cannot know (the probability that a loss of ``simultaneous``
nodes, or of a whole failure domain, leaves every state in peer memory, from
baft's placement), sweeps the
target along cluster size, storage bandwidth and MTBF for the plots, and writes
``projection.json``.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import baft.strategies.registry as registry
from baft.store.placement import domain_recovery_probability, recovery_probability

from analysis.profile import Profile
from analysis.projection import ASSUMPTIONS, HYPOTHETICAL, MODELS, Projection, Target, project

#: How far the plots sweep each parameter around the target's value.
SCALES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
#: The largest relative gap between the analytical and the simulated waste the tests accept (plus 0.002),
#: where failures are rare within an interval (the model is first order in failure rate x interval).
TOLERANCE = 0.12


def strategies() -> dict[str, str]:
    """The strategies projected, name -> model: each registered one by its entry's ``projection``
    (:mod:`baft.strategies.registry`) and the hypothetical ones of :mod:`analysis.projection`, in the models' order."""
    rows = [(e.name, e.projection) for e in registry.entries()] + list(HYPOTHETICAL.items())
    return dict(sorted(rows, key=lambda row: MODELS.index(row[1])))


def with_placement(target: Target) -> Target:
    """``target`` with the probabilities that its losses (of ``simultaneous`` nodes, of a domain) leave a copy
    of every state in peer memory."""
    t = dataclasses.replace(target)
    t.memory_probability = recovery_probability(t.nodes, t.replicas, t.simultaneous, t.placement)
    if t.domain_mtbf_hours is not None:
        t.domain_memory_probability = domain_recovery_probability(t.nodes, t.replicas, t.domain_nodes, t.placement,
                                                                  t.domain_layout, t.domain_aware)
    return t


def target_from_profile(profile: Profile, given: dict[str, Any]) -> tuple[Target, list[str]]:
    """The target with what ``profile`` measured where ``given`` (the fields set on the command line) says
    nothing: the bubble share, the copy rate into host memory, the detection and restart of its recoveries,
    and the iteration time scaled by the state each GPU holds (the target's GPUs assumed to process a byte of
    state as fast as the run's ranks did). Returns it with a line per value taken, saying where from."""
    base = Target(**given)
    taken: dict[str, Any] = {}
    said: list[str] = []
    if profile.bubble_share is not None:
        taken["bubble_share"] = profile.bubble_share
        said.append(f"bubble share {profile.bubble_share:.1%} (baft's profiler, median over {profile.ranks} ranks)")
    if profile.copy_gbytes_per_s:
        taken["copy_gbps"] = profile.copy_gbytes_per_s
        said.append(f"copy to host memory {profile.copy_gbytes_per_s:.3g} GB/s per rank (baft's snapshots)")
    if profile.detect_seconds is not None:
        taken["detect_seconds"] = profile.detect_seconds
        said.append(f"detection {profile.detect_seconds:.2f} s (the watchdog, median of the stalls)")
    if profile.restart_seconds is not None:
        taken["restart_seconds"] = profile.restart_seconds
        said.append(f"restart {profile.restart_seconds:.2f} s (restart, startup and rendezvous of the recoveries)")
    if profile.state_bytes_per_rank:
        per_gpu = base.state_bytes / (base.nodes * base.gpus_per_node)
        scale = per_gpu / profile.state_bytes_per_rank
        taken["iteration_seconds"] = profile.iteration_seconds * scale
        said.append(f"iteration {profile.iteration_seconds * scale:.3g} s = the run's {profile.iteration_seconds:.3g} s "
                    f"x {scale:.3g} ({per_gpu / 1e9:.3g} GB of state per GPU against the run's "
                    f"{profile.state_bytes_per_rank / 1e6:.3g} MB per rank)")
    else:
        taken["iteration_seconds"] = profile.iteration_seconds
        said.append(f"iteration {profile.iteration_seconds:.3g} s (the run's, unscaled: it holds no state size)")
    kept = {k: v for k, v in taken.items() if k not in given}
    said = [line for line, k in zip(said, taken) if k not in given]
    return Target(**{**given, **kept}), [f"from {profile.source}: {line}" for line in said]


def _row(p: Projection) -> dict[str, Any]:
    tiers = {name: dataclasses.asdict(t) for name, t in (("memory", p.plan.memory), ("persistent", p.plan.persistent))
             if t is not None}
    return {"strategy": p.strategy, "waste": p.waste, "stall_share": p.plan.stall_share,
            "memory_probability": p.plan.memory_probability, "memory_share": p.plan.memory_share, "tiers": tiers,
            "simulated": dataclasses.asdict(p.simulated) if p.simulated else None}


def sweep(target: Target, name: str, run_hours: float) -> dict[str, Any]:
    """Analytical waste of every strategy as ``name`` takes ``SCALES`` times the target's value."""
    base = getattr(target, name)
    values = sorted({max(1, round(base * s)) if isinstance(base, int) else base * s for s in SCALES})
    if name == "nodes":
        values = [v for v in values if v > max(target.replicas, target.simultaneous)]
    projected = strategies()
    rows: dict[str, list[float]] = {s: [] for s in projected}
    for v in values:
        varied = dataclasses.replace(target, **{name: v})  # type: ignore[arg-type]  # name: a numeric field
        for p in project(with_placement(varied), run_hours, projected, simulate_seed=None):
            rows[p.strategy].append(p.waste)
    return {"parameter": name, "values": values, "waste": rows}


def run_projection(target: Target, out: Path, run_hours: float = 720.0, seed: int = 0,
                   measured: list[str] | None = None) -> dict[str, Any]:
    """Project ``target``, write ``out/projection.json`` and the plots; returns what the JSON holds.
    ``measured``: which of the target's values came from a measured run, and from where."""
    from analysis.plots import projection_plots

    t = with_placement(target)
    result = {
        "target": {**dataclasses.asdict(t), "bubble_fraction": t.bubble_fraction},
        "derived": {"failures_per_hour": t.failure_rate * 3600, "domain_failures_per_hour": t.domain_failure_rate * 3600,
                    "persist_seconds": t.persist_seconds,
                    "copy_seconds": t.copy_seconds, "replicate_seconds": t.replicate_seconds},
        "run_hours": run_hours, "seed": seed,
        "strategies": [_row(p) for p in project(t, run_hours, strategies(), simulate_seed=seed)],
        "models": strategies(),
        "sweeps": [sweep(target, name, run_hours) for name in ("nodes", "storage_gbps", "mtbf_hours")],
        "assumptions": list(ASSUMPTIONS),
        "measured": list(measured or []),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "projection.json").write_text(json.dumps(result, indent=2) + "\n")
    result["plots"] = [str(p) for p in projection_plots(result, out)]
    return result


def table(result: dict[str, Any]) -> str:
    t, d = result["target"], result["derived"]
    store = f"{t['storage_gbps']:g} Gbit/s per node" if t["storage_scales"] else f"{t['storage_gbps']:g} Gbit/s in all"
    lines = [
        f"target: {t['nodes']} nodes x {t['gpus_per_node']} GPUs, {t['stages']} stages, "
        f"{t['state_gb_per_stage'] * t['stages']:g} GB of state, node MTBF {t['mtbf_hours']:g} h "
        f"({d['failures_per_hour']:.3f} failures/h in all), store {store}, network {t['network_gbps']:g} Gbit/s per node, "
        f"{t['iteration_seconds']:g} s iterations, bubbles {t['bubble_fraction']:.1%}",
        f"one checkpoint: persist {d['persist_seconds']:.1f} s, copy to host {d['copy_seconds']:.2f} s, "
        f"replicate {d['replicate_seconds']:.2f} s; {t['simultaneous']} node(s) per failure leave a copy in peer "
        f"memory with probability {t['memory_probability']:.4f} ({t['replicas']} replica(s), {t['placement']})",
    ]
    if t["domain_mtbf_hours"] is not None:
        lines.append(
            f"failure domains of {t['domain_nodes']} nodes ({t['domain_layout']}"
            f"{'; the stores place replicas in other domains' if t['domain_aware'] else ''}), MTBF {t['domain_mtbf_hours']:g} h: "
            f"{d['domain_failures_per_hour']:.4f} losses/h ({d['domain_failures_per_hour'] / d['failures_per_hour']:.0%}"
            f" of failures), each leaves a copy in peer memory with probability {t['domain_memory_probability']:.4f}")
    lines += [
        f"  {'strategy':<10} {'wasted':>8} {'simulated':>10} {'stall':>8} {'memory every':>13} {'persist every':>14}",
    ]
    for r in result["strategies"]:
        sim, mem, per = r["simulated"], r["tiers"].get("memory"), r["tiers"].get("persistent")
        simulated = f"{sim['waste']:.2%}" if sim else "-"
        every_mem = f"{mem['interval']:.0f} s" if mem else "-"
        every_per = f"{per['interval']:.0f} s" if per else "-"
        lines.append(f"  {r['strategy']:<10} {r['waste']:>8.2%} {simulated:>10} {r['stall_share']:>8.2%} "
                     f"{every_mem:>13} {every_per:>14}")
    lines.append(f"  (wasted: expected share of {result['run_hours']:g} h of training not spent on useful work; "
                 f"simulated: seed {result['seed']})")
    return "\n".join(lines)
