"""``baft run --target k8s`` following a real job: torchrun workers write their journal, the harness reads
the steps from it and drives Chaos Mesh objects on the stand-in API server through the real kubernetes client.

Nothing is injected for real here (the stand-in has no Chaos Mesh behind it), so the faults are windows
that do not stop the job; what is tested is the timing against a live journal, the rollback, the collected
journal and the bitwise verdict against the job's reference."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from analysis.journal import Journal
from harness.cli import main as cli_main
from tests.crds import needs_schema
from tests.k8s_standin import StandIn

from .conftest import ROOT

pytest.importorskip("kubernetes", reason="needs the kubernetes client (pip install 'baft-harness[k8s]')")
pytestmark = [pytest.mark.e2e, pytest.mark.k8s, needs_schema]

WORKLOAD = {"model": "gpt-tiny", "stages": 2, "data_parallel": 1, "microbatches": 4, "schedule": "1f1b",
            "steps": 40, "seed": 0, "nodes": 1}


def test_faults_follow_a_real_jobs_journal(tmp_path: Path, ref_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = {"name": "job", "workload": WORKLOAD, "checkpoint": {"strategy": "baft", "every": 1}, "faults": [],
           "expect": {"bitwise": True}}
    chaos = {**job, "name": "chaos", "faults": [{"straggler": {"rank": 1, "factor": 2.0, "from_step": 12, "to_step": 22}},
                                                {"straggler": {"rank": 0, "factor": 1.5, "from_step": 25,
                                                               "duration": 0.5}}]}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    (tmp_path / "chaos.yaml").write_text(yaml.safe_dump(chaos))
    pods = [{"name": f"gpt-{i}", "labels": {"app": "gpt", "apps.kubernetes.io/pod-index": str(i)}} for i in range(2)]
    with StandIn(inject_after_gets=1, recover_after_gets=1, pod_list=pods) as standin:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "s",
            "clusters": [{"name": "s", "cluster": {"server": standin.host}}], "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "s", "context": {"cluster": "s", "user": "u"}}]}))
        proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(tmp_path / "job.yaml"), "--out",
                                 str(tmp_path / "job"), "--cache", str(ref_cache), "--no-report"],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 120  # the job's own reference run comes first (or from the cache)
            while not (tmp_path / "job" / "reference" / "journal").is_dir() and time.monotonic() < deadline:
                time.sleep(0.2)
            rc = cli_main(["run", str(tmp_path / "chaos.yaml"), "--target", "k8s", "--kubeconfig", str(kubeconfig),
                           "--namespace", "train", "--selector", "app=gpt",
                           "--rank-label", "apps.kubernetes.io/pod-index",
                           "--job-dir", str(tmp_path / "job" / "faulted"),
                           "--reference", str(tmp_path / "job" / "reference"), "--out", str(tmp_path / "out")])
        finally:
            job_out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, job_out
        out, err = capsys.readouterr()
        assert rc == 0, out + err
        assert standin.objects == {} and len(standin.deleted) == 2
        assert {b["kind"] for b in standin.created} == {"StressChaos"}
    run = Journal.load(tmp_path / "out" / "faulted")
    fired = {e["id"]: e for e in run.launcher if e["event"] == "fault"}
    rollbacks = {e["id"]: e for e in run.launcher if e["event"] == "fault_rollback"}
    # Fired no earlier than the step the job had reached, and while the job was still running.
    assert 12 <= fired[0]["step"] <= fired[0]["injected_step"] < 40
    assert rollbacks[0]["step"] >= 22 and rollbacks[0]["reason"] == "window ended"
    assert fired[1]["step"] >= 25 and rollbacks[1]["reason"] == "window ended"
    # The job's own journal came along, and the verdict compared it bitwise with its reference.
    assert sorted(run.ranks) == [0, 1]
    import json

    verdict = json.loads((tmp_path / "out" / "verdict.json").read_text())
    assert verdict["passed"] and verdict["bitwise_equal"] and verdict["states_compared"] > 40
    assert verdict["target"] == "k8s" and len(verdict["cluster"]["firings"]) == 2
    assert "faults[0] straggler: due step" in out and (tmp_path / "out" / "report.html").is_file()
    assert "## On the cluster" in (tmp_path / "out" / "report.md").read_text()
