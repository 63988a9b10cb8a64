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

from baft.store.wire import request

from analysis.journal import Journal, JournalWriter, launcher_journal
from analysis.verdict import judge
from harness.cluster.deploy import (
    CHECKPOINTS,
    SHARED,
    SHM,
    SPEC_DIR,
    DeployConfig,
    deployment,
)
from harness.run.nodeenv import free_port
from harness.run.runner import ensure_reference
from harness.scenario import load
from injectors.process import descendants

from .conftest import ROOT, shm_semaphores, unlink_unmapped_semaphores

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # four ranks with restarts, beside the other xdist worker

SCENARIO = {"name": "deployed", "workload": {"model": "gpt-tiny", "stages": 2, "data_parallel": 2, "microbatches": 4,
                                             "schedule": "1f1b", "steps": 12, "seed": 0, "nodes": 2},
            "checkpoint": {"strategy": "baft", "every": 50, "baft": {"replication": {"replicas": 1}}}, "faults": [],
            "expect": {"bitwise": True}}


class Pods:
    """The manifest's text with the cluster's names and paths replaced by local ones."""

    def __init__(self, docs: list[dict[str, Any]], cfg: DeployConfig, nodes: int, root: Path) -> None:
        self.shm = Path("/dev/shm") / f"baft-deploy-{uuid.uuid4().hex[:8]}"
        self.subst = {f"{cfg.job}-{i}.{cfg.job}.{cfg.namespace}.svc:{cfg.store_port}": f"127.0.0.1:{free_port()}"
                      for i in range(nodes)}
        self.subst[f"{cfg.job}-0.{cfg.job}:{cfg.rendezvous_port}"] = f"127.0.0.1:{free_port()}"
        self.subst.update({f"{SHARED}/": f"{root}/shared/", CHECKPOINTS: f"{root}/shared/{cfg.run}/checkpoints",
                           f"{SHM}/": f"{self.shm}/", SPEC_DIR: f"{root}/etc"})
        self.secret, self.config_map, _, self.job = docs  # a run with stores has its Secret first
        (root / "etc").mkdir()
        for name, text in self.config_map["data"].items():
            (root / "etc" / name).write_text(self.local(text))

    def local(self, text: str) -> str:
        for a, b in self.subst.items():
            text = text.replace(a, b)
        return text

    def value(self, source: dict[str, Any], index: int) -> str:
        """What the kubelet puts in an env var from ``valueFrom``: the pod's index label, its IP, a Secret's key."""
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            assert ref["name"] == self.secret["metadata"]["name"]
            return self.secret["stringData"][ref["key"]]
        path = source["fieldRef"]["fieldPath"]
        return "127.0.0.1" if path == "status.podIP" else str(index)

    def container(self, spec: dict[str, Any], index: int) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop("BAFT_STORE_SECRET", None)
        declared = {}
        for e in spec.get("env", []):
            declared[e["name"]] = self.value(e["valueFrom"], index) if "valueFrom" in e else self.local(e["value"])
        env.update(declared)
        env["GLOO_SOCKET_IFNAME"] = "lo"  # a pod's eth0 is this host's loopback
        cmd = [self.local(a) for a in spec["command"]]
        for name, value in declared.items():  # $(VAR) of the container's own env, as Kubernetes expands it
            cmd = [a.replace(f"$({name})", value) for a in cmd]
        if cmd[0] == "python":
            cmd[0] = sys.executable
        return cmd, env


# No separate clean case: each killed case counts every pod's restarts exactly, so a restart nothing
# caused fails it, and it matches the reference bit for bit like a clean run must.
@pytest.mark.parametrize("killed", [1, 0], ids=["pod1-trainer-killed", "pod0-trainer-killed"])
def test_the_deployed_pods_train_and_match_the_reference(killed: int, tmp_path: Path, ref_cache: Path) -> None:
    """With ``killed``, that pod's trainer container is SIGKILLed mid-run (what Chaos Mesh's container-kill
    does) and every trainer container that exits non-zero is started again, as the kubelet does for
    ``restartPolicy: OnFailure``: the store sidecars and the pods' memory survive, so the job must resume
    from the snapshots there and still match bit for bit. Pod 0's agent hosts the rendezvous store: when
    it dies the other pods' agents lose it and fail too, and the whole job re-forms once they are back."""
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SCENARIO))
    scenario = load(tmp_path / "s.yaml", host=False)
    cfg = DeployConfig(namespace="ml", image="unused", claim="shared")
    pods = Pods(deployment(scenario, cfg), cfg, 2, tmp_path)
    pod = pods.job["spec"]["template"]["spec"]
    procs: list[subprocess.Popen] = []
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(container: dict[str, Any], i: int, name: str) -> subprocess.Popen:
        cmd, env = pods.container(container, i)
        with open(logs / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(proc)
        return proc

    restarts = [0, 0]
    semaphores = shm_semaphores()
    try:
        for i in range(2):  # the native sidecars start first, as the kubelet starts init containers
            start(pod["initContainers"][0], i, f"store{i}")
        spec = json.loads((tmp_path / "etc" / "worker-spec.json").read_text())
        for addr in spec["stores"]:
            deadline = time.monotonic() + 30
            while True:
                try:
                    request(addr, {"op": "ping"}, timeout=1, secret=pods.secret["stringData"]["secret"])
                    break
                except OSError:
                    assert time.monotonic() < deadline, (logs / "store0.log").read_text()
                    time.sleep(0.1)
        names = [f"pod{i}" for i in range(2)]
        trainers = [start(pod["containers"][0], i, names[i]) for i in range(2)]
        journal = tmp_path / "shared" / cfg.run / "journal" / "rank-3" / "events.jsonl"
        pending_kill = True
        deadline = time.monotonic() + 300
        while True:
            if pending_kill and journal.is_file() and journal.read_text().count('"event":"step"') >= 6:
                # A container kill ends every process in the container: the agent and the workers under it
                # (torchrun starts those in sessions of their own, so a process-group kill would miss them).
                victim = trainers[killed]
                for pid in [victim.pid] + [p for p, _ in descendants(victim.pid)]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                victim.wait()
                pending_kill = False
                # journaled as the cluster run journals a firing of its chaos: a restart the verdict can explain
                w = JournalWriter(launcher_journal(tmp_path / "shared" / cfg.run))
                w.write("fault", fault="container_kill", id=0, occurrence=0, fatal=True, pod=killed)
                w.close()
            codes = [t.poll() for t in trainers]
            for i, code in enumerate(codes):
                if code not in (None, 0):  # the kubelet restarts a container that failed (restartPolicy: OnFailure)
                    assert restarts[i] < 4, (logs / f"{names[i]}.log").read_text()[-3000:]
                    restarts[i] += 1
                    names[i] = f"pod{i}-restart{restarts[i]}"
                    trainers[i] = start(pod["containers"][0], i, names[i])
            if codes == [0, 0]:
                break
            assert time.monotonic() < deadline, {n: (logs / f"{n}.log").read_text()[-2000:] for n in names}
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=10)
        shutil.rmtree(pods.shm, ignore_errors=True)
        # A killed container's /dev/shm goes with it; these pods share the host's, where the killed agent's
        # multiprocessing semaphores stay (its resource tracker died with it): remove what no process maps.
        unlink_unmapped_semaphores(shm_semaphores() - semaphores)
    assert pending_kill is False
    if killed == 1:
        assert restarts == [0, 1]  # pod 0 hosts the rendezvous: it waits for pod 1's new agent
    else:
        assert restarts == [1, 1]  # pod 1's agent, its rendezvous store gone, fails and is restarted too
    run_dir = tmp_path / "shared" / cfg.run
    # The reference: the scenario's workload run by the local launcher, as `baft run` gets it (the cache).
    reference = ensure_reference(scenario.workload, ref_cache, timeout=300)
    verdict = judge(Journal.load(reference.run_dir), Journal.load(run_dir), scenario.expect,
                    steps=12, faults_declared=1)
    assert verdict.passed and verdict.bitwise_equal and verdict.states_compared >= 4 * 12, verdict.failures
    assert verdict.completed  # every rank of the reference finished all 12 steps here too
    # Both stores journaled to the shared volume, and the snapshots went through them.
    assert sorted(p.name for p in (run_dir / "journal").glob("store-node*.jsonl")) == ["store-node0.jsonl",
                                                                                       "store-node1.jsonl"]
    restores = Journal.load(run_dir).events("checkpoint_restored")
    # every rank came back from the memory the sidecars kept: no persistent checkpoint exists (every: 50)
    assert sorted(e["rank"] for e in restores) == [0, 1, 2, 3], restores
    # killed after step 6; the newest snapshot may be torn (the copy was cut), the one before is whole
    assert {e["tier"] for e in restores} == {"shm"} and min(e["step"] for e in restores) >= 4, restores
    assert len({e["step"] for e in restores}) == 1, restores  # one consistent version for the whole job
    # Each rank ran once before the kill and once after, and its second process finished the run.
    journal = Journal.load(run_dir)
    for rank in range(4):
        assert [e["incarnation"] for e in journal.events("start", rank)] == [0, 1], rank
        assert [(e["incarnation"], e["step"]) for e in journal.events("finish", rank)] == [(1, 12)], rank
