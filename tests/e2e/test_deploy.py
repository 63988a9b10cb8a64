"""The pods of ``baft deploy`` run here: each pod's store sidecar and trainer command, exactly as the manifest
gives them, as local processes — only what a cluster provides is substituted (pod DNS names and ports by
127.0.0.1 and free ports, the volume paths by temporary directories, the downward-API index by its value).
The job must finish and match the scenario's uninterrupted reference bit for bit."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from analysis.journal import Journal
from analysis.verdict import judge
from baft.store import request
from harness.deploy import CHECKPOINTS, SHARED, SHM, SPEC_DIR, DeployConfig, deployment
from harness.launcher import free_port
from harness.scenario import load
from injectors.process import descendants

from .conftest import ROOT, run_cli

pytestmark = [pytest.mark.e2e]

SCENARIO = {"name": "deployed", "workload": {"model": "gpt-tiny", "stages": 2, "data_parallel": 2, "microbatches": 4,
                                             "schedule": "1f1b", "steps": 12, "seed": 0, "nodes": 2},
            "checkpoint": {"strategy": "baft", "every": 50, "replicas": 1}, "faults": [], "expect": {"bitwise": True}}


class Pods:
    """The manifest's text with the cluster's names and paths replaced by local ones."""

    def __init__(self, docs: list[dict[str, Any]], cfg: DeployConfig, nodes: int, root: Path) -> None:
        self.shm = Path("/dev/shm") / f"baft-deploy-{uuid.uuid4().hex[:8]}"
        self.subst = {f"{cfg.job}-{i}.{cfg.job}.{cfg.namespace}.svc:{cfg.store_port}": f"127.0.0.1:{free_port()}"
                      for i in range(nodes)}
        self.subst[f"{cfg.job}-0.{cfg.job}:{cfg.rendezvous_port}"] = f"127.0.0.1:{free_port()}"
        self.subst.update({f"{SHARED}/": f"{root}/shared/", CHECKPOINTS: f"{root}/shared/{cfg.run}/checkpoints",
                           f"{SHM}/": f"{self.shm}/", SPEC_DIR: f"{root}/etc"})
        self.config_map, _, self.job = docs
        (root / "etc").mkdir()
        for name, text in self.config_map["data"].items():
            (root / "etc" / name).write_text(self.local(text))

    def local(self, text: str) -> str:
        for a, b in self.subst.items():
            text = text.replace(a, b)
        return text

    def container(self, spec: dict[str, Any], index: int) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        for e in spec.get("env", []):
            env[e["name"]] = str(index) if "valueFrom" in e else self.local(e["value"])
        env["GLOO_SOCKET_IFNAME"] = "lo"  # a pod's eth0 is this host's loopback
        cmd = [self.local(a).replace("$(BAFT_NODE_INDEX)", str(index)) for a in spec["command"]]
        if cmd[0] == "python":
            cmd[0] = sys.executable
        return cmd, env


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "trainer-container-killed"])
def test_the_deployed_pods_train_and_match_the_reference(crash: bool, tmp_path: Path, ref_cache: Path) -> None:
    """With ``crash``, pod 1's trainer container is SIGKILLed mid-run and started again, as the kubelet
    does for ``restartPolicy: OnFailure`` (what Chaos Mesh's container-kill causes): the store sidecar and
    the pod's memory survive, so the job must resume from the snapshot there and still match bit for bit."""
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SCENARIO))
    scenario = load(tmp_path / "s.yaml", host=False)
    cfg = DeployConfig(namespace="ml", image="unused", claim="shared")
    pods = Pods(deployment(scenario, cfg), cfg, 2, tmp_path)
    pod = pods.job["spec"]["template"]["spec"]
    procs: list[subprocess.Popen] = []
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        stores = []
        for i in range(2):  # the native sidecars start first, as the kubelet starts init containers
            cmd, env = pods.container(pod["initContainers"][0], i)
            with open(logs / f"store{i}.log", "wb") as log:
                stores.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))
        procs += stores
        spec = json.loads((tmp_path / "etc" / "worker-spec.json").read_text())
        for addr in spec["stores"]:
            deadline = time.monotonic() + 30
            while True:
                try:
                    request(addr, {"op": "ping"}, timeout=1)
                    break
                except OSError:
                    assert time.monotonic() < deadline, (logs / "store0.log").read_text()
                    time.sleep(0.1)
        trainers = []
        for i in range(2):
            cmd, env = pods.container(pod["containers"][0], i)
            with open(logs / f"pod{i}.log", "wb") as log:
                trainers.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                 start_new_session=True))
        procs += trainers
        if crash:
            journal = tmp_path / "shared" / cfg.run / "journal" / "rank-3" / "events.jsonl"
            deadline = time.monotonic() + 120
            while not (journal.is_file() and journal.read_text().count('"event":"step"') >= 6):
                assert time.monotonic() < deadline and trainers[1].poll() is None, (logs / "pod1.log").read_text()
                time.sleep(0.05)
            # A container kill ends every process in the container: the agent and the workers under it
            # (torchrun starts those in sessions of their own, so a process-group kill would miss them).
            for pid in [trainers[1].pid] + [p for p, _ in descendants(trainers[1].pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            trainers[1].wait()
            cmd, env = pods.container(pod["containers"][0], 1)
            with open(logs / "pod1-restart.log", "wb") as log:
                trainers[1] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True)
            procs.append(trainers[1])
        for i, p in enumerate(trainers):
            name = f"pod{i}" + ("-restart" if crash and i == 1 else "")
            assert p.wait(timeout=240) == 0, (logs / f"{name}.log").read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=10)
        shutil.rmtree(pods.shm, ignore_errors=True)
    run_dir = tmp_path / "shared" / cfg.run
    # The reference: the same scenario run by the local launcher (no faults either).
    rc, out, _ = run_cli(tmp_path / "s.yaml", tmp_path / "ref", ref_cache)
    assert rc == 0, out
    verdict = judge(Journal.load(tmp_path / "ref" / "reference"), Journal.load(run_dir), scenario.expect,
                    steps=12, faults_declared=0)
    assert verdict["passed"] and verdict["bitwise_equal"] and verdict["states_compared"] >= 4 * 12, verdict["failures"]
    # Both stores journaled to the shared volume, and the snapshots went through them.
    assert sorted(p.name for p in (run_dir / "journal").glob("store-node*.jsonl")) == ["store-node0.jsonl",
                                                                                       "store-node1.jsonl"]
    restores = Journal.load(run_dir).events("checkpoint_restored")
    if crash:  # every rank came back from the memory the sidecars kept: no persistent checkpoint exists (every: 50)
        assert sorted(e["rank"] for e in restores) == [0, 1, 2, 3], restores
        # killed after step 6; the newest snapshot may be torn (the copy was cut), the one before is whole
        assert {e["tier"] for e in restores} == {"shm"} and min(e["step"] for e in restores) >= 4, restores
    else:
        assert not restores
