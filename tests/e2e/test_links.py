"""Link faults between nodes in real network namespaces (root only): throttle, partition, delay."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.journal import Journal, read_events

from .conftest import ROOT, run_cli

pytestmark = [
    pytest.mark.e2e, pytest.mark.slow, pytest.mark.netns, pytest.mark.serial,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for network namespaces and tc"),
]
CI = ROOT / "scenarios" / "ci"


def _baft_namespaces() -> set[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in listing.splitlines() if line.startswith("baft-")}


def test_throttled_link_keeps_training_first_and_the_replicas_useful(tmp_path: Path, ref_cache: Path) -> None:
    before = _baft_namespaces()  # another (killed) run's leftovers are not this run's to answer for
    rc, out, v = run_cli(CI / "link-throttle-replication.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    j = Journal.load(tmp_path / "out" / "faulted")
    (measured,) = j.events("link_measured")
    assert 0 < measured["measured_bit"] <= 1.1 * measured["rate_bit"]  # the throttle took effect
    stores = [e for f in sorted((tmp_path / "out" / "faulted" / "journal").glob("store-node*.jsonl")) for e in read_events(f)]
    assert any(e["event"] == "replication_paced" and e["limited_by_link"] for e in stores)
    strides = [e["stride"] for e in stores if e["event"] == "replication_stride"]
    assert strides and max(strides) > 1  # degraded: fewer replicas, journaled
    rec = v["recoveries"][0]
    # restored from peer replicas at a version every rank shares (never from scratch)
    assert "peer" in rec["restored_tier"] and rec["restored_step"] > 0 and v["bitwise_equal"]
    assert _baft_namespaces() <= before  # this run's namespaces are gone


def test_a_link_too_slow_for_useful_replicas_degrades_to_the_persistent_tier_and_says_why(
        tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(CI / "link-slow-degrades.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    stores = [e for f in sorted((tmp_path / "out" / "faulted" / "journal").glob("store-node*.jsonl")) for e in read_events(f)]
    degraded = [e for e in stores if e["event"] == "replication_degraded"]
    assert degraded, [e["event"] for e in stores]
    for e in degraded:  # too costly for training, or replicas older than the persistent tier's checkpoints
        # the persistent tier's age as measured, its writes' lag included: at least half its interval of 4
        assert "persistent tier" in e["reason"] and e["persistent_age_versions"] >= 2
        assert e.get("slowdown", 0) > 0.25 or (e["replica_age_versions"] > e["persistent_age_versions"]
                                               and "lag included" in e["reason"]), e
    for node in {e["node"] for e in degraded}:  # after its stop, a node replicates only probe rounds (the first after 30 s)
        mine = [e for e in stores if e["node"] == node]
        t0 = min(e["t"] for e in mine if e["event"] == "replication_degraded")
        # until the node's store restarts (a lost node's replacement starts afresh and learns it again)
        t1 = min([e["t"] for e in mine if e["event"] == "store_start" and e["t"] > t0] + [mine[-1]["t"]])
        later = [e for e in mine if e["event"] == "replicated" and t0 < e["t"] <= t1]
        assert len(later) <= 1 + int((t1 - t0) // 30), later
    assert any(c["stopped"] and "persistent tier" in c["reason"] for c in v["replication_changes"])  # in the verdict
    rec = v["recoveries"][0]
    assert rec["restored_tier"] == "persistent" and v["bitwise_equal"] and rec["lost_steps"] <= 8


def test_partition_stalls_the_job_the_watchdog_restarts_it(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(CI / "link-partition.yaml", tmp_path / "out", ref_cache)
    assert rc == 0, out
    rec = v["recoveries"][0]
    # silence is counted from the last journal write, a moment before the partition took effect
    assert rec["fault"]["fault"] == "partition" and 4 <= rec["detection_seconds"]  # not before its timeout (how fast: baft bench)
    assert rec["lost_steps"] <= 2 and v["bitwise_equal"]
    j = Journal.load(tmp_path / "out" / "faulted")
    assert [e["event"] for e in j.launcher if e["event"].startswith("fault")] == ["fault", "fault_rollback"]


def test_delay_without_netem_is_refused_up_front(tmp_path: Path) -> None:
    from injectors.network import netem_available

    if netem_available():
        pytest.skip("this kernel has netem; the refusal path cannot be exercised")
    f = tmp_path / "delay.yaml"
    f.write_text((CI / "link-partition.yaml").read_text().replace(
        "partition: {link: [node0, node1], from_step: 10, duration: 8}", "delay: {link: [node0, node1], ms: 20, from_step: 5}"))
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "validate", str(f)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "faults[0].delay" in proc.stderr and "netem" in proc.stderr


def test_bench_on_a_throttled_link_reports_the_link_and_replication(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "bench", "--out", str(tmp_path / "b"), "--workload.nodes", "2", "--strategies", "baft",
         "--cycles", "3", "--block", "3", "--persist-every", "3", "--warmup", "1", "--link-rate", "40mbit"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    b = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert 0.5 * 40e6 < b["link"]["measured_bit"] <= 1.1 * 40e6
    assert b["replication"]["replicated"] > 0 and "baft@3" in b["tiers"]["persistent"]["arms"]
    # no floor arm on a throttled link: a replica every iteration does not fit it, and one in flight would
    # spill into the next arm's block
    assert "floor:replicate" not in b["tiers"]["persistent"]["arms"]
    assert "link: throttled to 40 Mbit/s" in proc.stdout
