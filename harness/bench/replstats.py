"""What the node stores did during ``baft bench``: replicas, staleness, and their CPU against the floor.

Read from the stores' journals (:func:`analysis.journal.store_events`) after the job; the floor is measured
beside it (:mod:`harness.bench.floor`). ``bench.json`` holds the result as ``replication``.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any


def replication_stats(out: Path, block: int | None = None) -> dict[str, Any]:
    """What the node stores did: versions replicated and skipped (the link could not keep up)."""
    from analysis.journal import store_events

    evs = store_events(out)
    sent = [e for e in evs if e["event"] == "replicated"]
    stops = [e for e in evs if e["event"] == "store_stop"]
    starts = {e.get("node"): e for e in evs if e["event"] == "store_start"}
    if not evs:
        return {}
    return {
        "replica_bytes_median": statistics.median(e["bytes"] for e in sent) if sent else None,
        "paced_share": sum(1 for e in sent if e.get("paced")) / len(sent) if sent else None,
        "connections": sum(1 for e in evs if e["event"] == "peer_connected"),
        "store_priority": sorted({f"{e.get('cpu_class', '?')}/{e.get('io_class', '?')}"
                                  + (f", {e['cpu_group']}" if e.get("cpu_group") else "") for e in starts.values()}),
        **serving_cpu(sent, stops, starts),
        **group_changes(evs),
        "replicated": len(sent),
        "skipped": sum(1 for e in evs if e["event"] == "replication_skipped"),
        "failed": sum(1 for e in evs if e["event"] == "replication_failed"),
        "mbytes_per_s": (sum(e["bytes"] for e in sent) / sum(e["seconds"] for e in sent) / 1e6) if sent else None,
        "deferred_ms_median": statistics.median(e["deferred_seconds"] for e in sent) * 1e3 if sent else None,
        # every store's own CPU time (user + system, all its threads, starting included) over the bytes sent
        "store_cpu_seconds": sum(e["cpu_seconds"] for e in stops) if stops else None,
        "store_cpu_seconds_per_gb": (sum(e["cpu_seconds"] for e in stops) / (sum(e["bytes"] for e in sent) / 1e9))
        if stops and sent else None,
        "store_max_rss_mbytes": max(e["max_rss_mbytes"] for e in stops) if stops else None,
        # the link could not deliver a replica before the persistent tier had a newer version
        "degraded": sum(1 for e in evs if e["event"] == "replication_degraded"),
        "resumed": sum(1 for e in evs if e["event"] == "replication_resumed"),
        "degraded_reason": next((e["reason"] for e in evs if e["event"] == "replication_degraded"), None),
        **staleness(sent, [e for e in evs if e["event"] == "replication_stride"], block),
    }


def group_changes(evs: list[dict[str, Any]]) -> dict[str, Any]:
    """How the adaptive stores' scheduling group moved (``store_group``): times lowered and raised, and the share
    of the replicas each store sent while its group was at nice 19 (None: no store adapted its group)."""
    changes = [e for e in evs if e["event"] == "store_group" and e.get("nice") is not None]
    if not changes:
        return {}
    lowered_sent = total = 0
    for node in {e.get("node") for e in evs}:
        low = False
        for e in sorted((e for e in evs if e.get("node") == node and e["event"] in ("store_group", "replicated")),
                        key=lambda e: e["t"]):
            if e["event"] == "store_group":
                low = e.get("nice") == 19 if e.get("nice") is not None else low
            else:
                total += 1
                lowered_sent += low
    return {"group_lowered": sum(1 for e in changes if e["nice"] == 19),
            "group_raised": sum(1 for e in changes if e["nice"] != 19),
            "group_lowered_share": lowered_sent / total if total else None}


def serving_cpu(sent: list[dict[str, Any]], stops: list[dict[str, Any]],
                starts: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    """The stores' CPU per replicated GB while they replicate: for each store, its CPU time from its first
    ``replicated`` event to its last (sending and receiving both: the peer's replicas land meanwhile, idle
    spans between the replicating blocks included) over the bytes it sent after the first; and from its
    start (the interpreter and imports done) to its stop, over all it sent."""
    window_cpu = window_bytes = 0.0
    for node in {e.get("node") for e in sent}:
        mine = [e for e in sent if e.get("node") == node and "cpu_seconds" in e]
        if len(mine) >= 2:
            window_cpu += mine[-1]["cpu_seconds"] - mine[0]["cpu_seconds"]
            window_bytes += sum(e["bytes"] for e in mine[1:])
    serving = [e["cpu_seconds"] - starts[e.get("node")].get("cpu_seconds", 0.0) for e in stops if e.get("node") in starts]
    total = sum(e["bytes"] for e in sent)
    return {"replicating_cpu_seconds_per_gb": window_cpu / (window_bytes / 1e9) if window_bytes else None,
            "serving_cpu_seconds_per_gb": sum(serving) / (total / 1e9) if serving and total else None}


def floor_stats(rep: dict[str, Any], count: int) -> dict[str, Any]:
    """The floor at the replica's size (the median of three runs of :mod:`harness.bench.floor`) and the
    stores' CPU per replicated GB as a multiple of it."""
    from harness.bench.floor import measure

    runs = [measure(int(rep["replica_bytes_median"]), count) for _ in range(3)]
    floor = statistics.median(r["cpu_seconds_per_gb"] for r in runs)
    out: dict[str, Any] = {"floor_cpu_seconds_per_gb": floor,
                           "floor_gbytes_per_s": statistics.median(r["gbytes_per_s"] for r in runs)}
    for key in ("replicating", "serving"):
        value = rep.get(f"{key}_cpu_seconds_per_gb")
        out[f"{key}_times_floor"] = value / floor if value is not None and floor > 0 else None
    out["times_floor"] = out["replicating_times_floor"]
    return out


def floor_replicator_stats(rep: dict[str, Any], reports: list[Any]) -> dict[str, Any]:
    """The floor replicator's CPU per GB it sent (``reports``: each rank's (bytes sent, CPU seconds from its first
    replica on), or None), both sides' processes together as for the stores, and the stores' CPU per replicated GB
    (while replicating) as a multiple of it: a floor at the stores' own cadence and beside the same training."""
    done = [r for r in reports if r]
    sent = sum(b for b, _ in done)
    if not sent:
        return {}
    per_gb = sum(c for _, c in done) / (sent / 1e9)
    value = rep.get("replicating_cpu_seconds_per_gb")
    return {"floor_replicator_cpu_seconds_per_gb": per_gb,
            "times_floor_replicator": value / per_gb if value is not None and per_gb > 0 else None}


def staleness(sent: list[dict[str, Any]], strides: list[dict[str, Any]], block: int | None = None) -> dict[str, Any]:
    """How far behind training the peers' copies are, in versions: ``behind`` (when a replica landed, how
    many newer versions its rank had sealed), ``gap`` (versions between one rank's consecutive replicas)
    and the worst staleness (``gap + behind``: how old the newest replica got just before the next
    landed, what a node loss then would lose beyond the persistent tier's floor), and ``age`` (versions from a
    replica's seal to the peer's answer, as the sending store journaled it). With ``block``: gaps of a
    block or more span the other arms' blocks (which do not replicate) and are left out."""
    if not sent or "behind" not in sent[0]:
        return {}
    behind = [e["behind"] for e in sent]
    gaps: list[Any] = []
    worst: list[Any] = []
    last: dict[Any, Any] = {}
    for e in sorted(sent, key=lambda e: e["t"]):
        key = (e["rank"], e["peer"])
        if key in last and (block is None or e["version"] - last[key] < block):
            gaps.append(e["version"] - last[key])
            worst.append(gaps[-1] + e["behind"])
        last[key] = e["version"]
    return {"behind_versions_median": statistics.median(behind), "behind_versions_max": max(behind),
            "gap_versions_median": statistics.median(gaps) if gaps else None,
            "staleness_versions_max": max(worst) if worst else None,
            "stride_max": max((e["stride"] for e in strides), default=1),
            **({"age_versions_median": statistics.median(ages), "age_versions_max": max(ages)}
               if (ages := [e["age_versions"] for e in sent if e.get("age_versions") is not None]) else {})}
