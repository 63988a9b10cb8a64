"""``baft deploy``: the in-cluster manifests, checked against the kubernetes client's models, the harness's own
schema and argument parser, and the harness's Role against the requests it really makes (stand-in server)."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from baft import CheckpointConfig

from harness.cli import _parser, _run_options
from harness.cli import main as cli_main
from harness.cluster.deploy import HARNESS_KINDS, INDEX_LABEL, DeployConfig, deployment, pod_workload, worker_spec
from harness.errors import ConfigValueError
from harness.scenario import load
from harness.schema import build
from harness.worker.spec import WorkerSpec
from harness.worker.workload import WorkloadConfig
from injectors import FAULTS
from injectors.chaosmesh.manifests import ClusterTarget, manifests
from injectors.chaosmesh.schema import GROUP
from tests.crds import needs_schema
from tests.k8s_standin import CORE, CRD_PREFIX, PREFIX, StandIn, connected
from tests.unit.test_chaosmesh import EXAMPLES, MAPPABLE

kubernetes = pytest.importorskip("kubernetes", reason="needs the kubernetes client (pip install 'baft-harness[k8s]')")
pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = (sorted((ROOT / "scenarios" / "ci").glob("*.yaml")) + sorted((ROOT / "examples").glob("*.yaml"))
             + sorted((ROOT / "examples").glob("*/kill.yaml")))  # the unmodified scripts (workload.command)
MODELS = {"ServiceAccount": "V1ServiceAccount", "Role": "V1Role", "RoleBinding": "V1RoleBinding",
          "ClusterRole": "V1ClusterRole", "ClusterRoleBinding": "V1ClusterRoleBinding",
          "ConfigMap": "V1ConfigMap", "Service": "V1Service", "Job": "V1Job", "Secret": "V1Secret"}


@pytest.fixture(autouse=True)
def _in_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # baft deploy runs in the directory the image holds at workdir


def objects(path: Path, **kw: Any) -> list[dict[str, Any]]:
    cfg = DeployConfig(**{"namespace": "ml", "image": "registry.example/baft:1", "claim": "shared", "harness": True,
                          "reference_run": "reference", **kw})
    return deployment(load(path, host=False), cfg)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_object_is_a_valid_kubernetes_object_with_no_unknown_field(path: Path) -> None:
    api = kubernetes.client.ApiClient()
    for obj in objects(path):
        model = api._ApiClient__deserialize(obj, MODELS[obj["kind"]])  # required fields and types are checked
        # A misspelt or unknown field is dropped by the model: the round trip must give back every field.
        assert api.sanitize_for_serialization(model) == json.loads(json.dumps(obj)), obj["kind"]


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_pods_run_the_scenarios_workload_on_its_layout(path: Path) -> None:
    scenario = load(path, host=False)
    w = scenario.workload
    docs = {o["kind"] + ("/harness" if "harness" in o["metadata"]["name"] else ""): o for o in objects(path)}
    spec = json.loads(docs["ConfigMap"]["data"]["worker-spec.json"])
    assert build(WorkloadConfig, spec["workload"], "spec", "workload") == pod_workload(scenario, DeployConfig(
        namespace="ml", image="i", claim="c"))  # the workload, its script's path as the pods see it
    build(CheckpointConfig, spec["checkpoint"], "spec", "checkpoint")
    assert spec["faults"] == []  # Chaos Mesh injects them, from outside
    job = docs["Job"]["spec"]
    assert job["completionMode"] == "Indexed" and job["completions"] == job["parallelism"] == w.nodes
    pod = job["template"]["spec"]
    [trainer] = pod["containers"]
    cmd = trainer["command"]
    assert cmd[cmd.index("--nnodes") + 1] == str(w.nodes)
    assert int(cmd[cmd.index("--nproc-per-node") + 1]) * w.nodes == w.world_size
    assert cmd[cmd.index("--max-restarts") + 1] == str(scenario.run.max_restarts)
    if w.script:  # the image holds this checkout at workdir
        assert "/workspace/" + Path(w.script).relative_to(ROOT).as_posix() in cmd
    if w.command:
        at = cmd.index("harness.worker.boot")
        assert cmd[at - 1] == "-m" and cmd[at + 1] == "/workspace/" + Path(w.command[0]).relative_to(ROOT).as_posix()
        assert cmd[cmd.index("--workdir") + 1] == "/shared/faulted/work" and "--preload" not in cmd
        assert spec["reference"] == "/shared/reference"  # where the restarted script's state is matched
        assert not any("{run_dir}" in a for a in cmd)
    if scenario.checkpoint.strategy == "baft":
        [store] = pod["initContainers"]
        assert store["restartPolicy"] == "Always"  # a native sidecar: it outlives a trainer crash
        # the lowest CPU weight in the pod's group, no limit: it runs on what the trainer leaves (issue 55)
        assert store["resources"] == {"requests": {"cpu": "1m"}}
        assert len(spec["stores"]) == w.nodes
        shm = {m["name"] for m in trainer["volumeMounts"]} & {m["name"] for m in store["volumeMounts"]}
        assert "shm" in shm and {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in pod["volumes"]
        # the store binds the pod's IP and both containers take the run's secret from the Secret
        listen = store["command"][store["command"].index("--listen") + 1]
        assert listen == "$(POD_IP)" and {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} \
            in store["env"]
        secret = docs["Secret"]
        ref = {"name": "BAFT_STORE_SECRET", "valueFrom": {"secretKeyRef": {"name": secret["metadata"]["name"],
                                                                           "key": "secret"}}}
        assert ref in store["env"] and ref in trainer["env"] and len(secret["stringData"]["secret"]) == 64
        assert secret["stringData"]["secret"] not in json.dumps([o for o in docs.values() if o is not secret])
        assert store["command"][store["command"].index("--world-size") + 1] == str(w.world_size)
    else:
        assert "initContainers" not in pod and "stores" not in spec and "Secret" not in docs
    # The storage faults' IOChaos needs the checkpoint directory to be a mount point.
    assert spec["checkpoint"]["dir"] in {m["mountPath"] for m in trainer["volumeMounts"]} \
        or "://" in spec["checkpoint"]["dir"]


def test_the_harness_job_runs_a_command_baft_accepts_against_the_training_pods() -> None:
    docs = objects(ROOT / "scenarios" / "ci" / "baft-node-loss.yaml")
    harness = next(o for o in docs if o["kind"] == "Job" and o["metadata"]["name"].startswith("baft-harness"))
    pod = harness["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "baft-harness"
    command = pod["containers"][0]["command"]
    assert command[0] == "baft"
    options, cluster = _run_options(_parser("run").parse_args(command[1:]))  # the options it checks together
    assert (options.target, cluster.namespace, cluster.rank_label) == ("k8s", "ml", INDEX_LABEL)
    assert str(cluster.follow.job_dir) == "/shared/faulted" and str(cluster.reference) == "/shared/reference"
    training = next(o for o in docs if o["kind"] == "Job" and o is not harness)
    labels = training["spec"]["template"]["metadata"]["labels"]
    assert cluster.labels().items() <= labels.items()
    assert "scenario.yaml" in next(o for o in docs if o["kind"] == "ConfigMap")["data"]


@pytest.mark.parametrize("kw, field", [
    ({"namespace": "Bad_NS"}, "namespace"), ({"run": "faulted", "reference_run": "faulted"}, "reference_run"),
    ({"image": "has space"}, "image"), ({"store_port": 29400}, "store_port"), ({"run": "x" * 30}, "run"),
    # hypothesis found "--": accepted, then read by the CLI as the end of the options (its flags did not round-trip)
    ({"image": "--"}, "image"), ({"image": "-registry/x"}, "image"),
])
def test_bad_deploy_config_names_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigValueError) as info:
        objects(ROOT / "scenarios" / "smoke" / "kill-rank.yaml", **kw)
    assert info.value.field == field


def test_cli_prints_documents_and_refuses_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(ROOT / "scenarios" / "smoke" / "kill-rank.yaml")
    assert cli_main(["deploy", path, "--namespace", "ml", "--image", "i:1", "--claim", "shared"]) == 0
    assert [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)] == ["ConfigMap", "Service", "Job"]
    baft_path = str(ROOT / "scenarios" / "ci" / "baft-node-loss.yaml")
    assert cli_main(["deploy", baft_path, "--namespace", "ml", "--image", "i:1", "--claim", "shared"]) == 0
    assert [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)] == ["Secret", "ConfigMap", "Service", "Job"]
    assert cli_main(["deploy", path, "--namespace", "ml", "--image", "i:1", "--claim", "shared", "--harness"]) == 2
    assert "--reference-run: expected the run to judge against" in capsys.readouterr().err


# --- RBAC: exactly what the harness does ------------------------------------------------------------

@pytest.fixture
def standin() -> Iterator[StandIn]:
    pods = [{"name": "p0", "labels": {"app": "gpt", INDEX_LABEL: "0"}}]
    with StandIn(pod_list=pods) as server:
        yield server


def _verb(method: str, path: str) -> tuple[str, str, str, str | None]:
    """(apiGroup, resource, verb, name) of one request, as the API server's authorizer sees it; the name only
    for a cluster-scoped resource (what a ClusterRole's resourceNames restrict)."""
    if path.startswith(CRD_PREFIX):
        return "apiextensions.k8s.io", "customresourcedefinitions", {"GET": "get"}[method], path[len(CRD_PREFIX):]
    if path.startswith(CORE):
        group, rest = "", path[len(CORE):].split("/")[1:]
    else:
        assert path.startswith(PREFIX), path
        group, rest = GROUP, path[len(PREFIX):].split("/")[1:]
    resource, named = rest[0], len(rest) > 1
    verb = {"POST": "create", "DELETE": "delete", "GET": "get" if named else "list"}[method]
    return group, resource, verb, None


def _grants(role: dict[str, Any]) -> set[tuple[str, str, str, str | None]]:
    return {(g, r, v, n) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"] for n in rule.get("resourceNames", [None])}


@needs_schema
def test_the_role_allows_every_request_the_harness_makes_and_nothing_more(standin: StandIn) -> None:
    docs = objects(ROOT / "scenarios" / "smoke" / "kill-rank.yaml")
    role, crds = (next(o for o in docs if o["kind"] == kind) for kind in ("Role", "ClusterRole"))
    allowed = _grants(role) | _grants(crds)
    assert all(n is None for *_, n in _grants(role)) and all(n for *_, n in _grants(crds))
    target = ClusterTarget(namespace="ml", selector={"app": "gpt"}, rank_label=INDEX_LABEL)
    kinds = set()
    with connected(standin) as client:
        client.matching_pods("ml", {"app": "gpt", INDEX_LABEL: "0"})
        for i, kind in enumerate(MAPPABLE):  # one object of every kind a fault maps to, through its whole life
            fields = EXAMPLES[kind][0]
            for obj in manifests(kind, FAULTS[kind][0](**fields), i, target, "rbac"):
                kinds.add(obj["kind"])
                with client.injected(obj, timeout=2, poll=0.01, recover_timeout=2):
                    pass
    used = {_verb(m, p) for m, p in standin.requests}
    assert used <= allowed, used - allowed
    assert allowed == used, f"granted but never used: {allowed - used}"  # least privilege
    assert kinds == set(HARNESS_KINDS)


def test_the_cluster_role_is_bound_to_the_harness_cluster_wide() -> None:
    docs = {o["kind"]: o for o in objects(ROOT / "scenarios" / "smoke" / "kill-rank.yaml")}
    role, binding = docs["ClusterRole"], docs["ClusterRoleBinding"]
    assert "namespace" not in role["metadata"] and "namespace" not in binding["metadata"]  # cluster-scoped
    assert role["metadata"]["name"] == binding["roleRef"]["name"] == "baft-harness-ml-crds"
    assert binding["roleRef"]["kind"] == "ClusterRole"
    assert binding["subjects"] == docs["RoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "baft-harness", "namespace": "ml"}]


def test_worker_spec_points_every_node_at_its_store_by_dns() -> None:
    scenario = load(ROOT / "scenarios" / "ci" / "baft-node-loss.yaml", host=False)
    spec = worker_spec(scenario, DeployConfig(namespace="ml", image="i", claim="c"))
    assert spec.stores == [f"baft-train-faulted-{i}.baft-train-faulted.ml.svc:29500" for i in range(2)]
    # no faults in the pods (Chaos Mesh injects them), but an evicted pod's workload saves in its grace
    assert spec.faults == [] and spec.preemptible
    assert WorkerSpec.from_plain(json.loads(spec.dumps()), "spec.json").preemptible


def test_pod_zero_hosts_the_rendezvous_and_no_other_pod_does(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cluster.pod import main, torchrun_command

    args = ["--nnodes", "2", "-m", "harness.worker.workload", "spec.json"]
    assert torchrun_command(args, 0)[3:6] == ["--rdzv-conf", "is_host=1,keep_alive_interval=1,keep_alive_max_attempt=3", "--nnodes"]
    assert torchrun_command(args, 3)[4].startswith("is_host=0,")
    # the agent's own --preload pairs stay in front of torchrun's options
    warm = torchrun_command(["--preload", "harness.worker.workload", *args], 0)
    assert warm[2:8] == ["harness.run.agent", "--preload", "harness.worker.workload", "--rdzv-conf",
                         "is_host=1,keep_alive_interval=1,keep_alive_max_attempt=3", "--nnodes"]
    with pytest.raises(SystemExit, match="no --rdzv-conf"):
        torchrun_command(["--rdzv-conf", "x=1", *args], 0)
    monkeypatch.setenv("BAFT_NODE_INDEX", "$(BAFT_NODE_INDEX)")  # the downward API did not fill it in
    assert main(args) == 2 and "BAFT_NODE_INDEX must be the pod's index" in capsys.readouterr().err


@pytest.mark.parametrize("field, value", [("memory", "4GB"), ("shm", "lots"), ("cpu", "2 cores")])
def test_resource_quantities_are_checked(field: str, value: str) -> None:
    with pytest.raises(ConfigValueError) as info:
        objects(ROOT / "scenarios" / "smoke" / "kill-rank.yaml", **{field: value})
    assert info.value.field == field


def test_an_unmodified_script_runs_in_the_runs_own_directory_and_the_harness_job_reads_the_scenario_without_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = ROOT / "examples" / "ddp_torchsave" / "kill.yaml"
    docs = objects(path)
    cm = next(o for o in docs if o["kind"] == "ConfigMap")
    # the harness Job's copy of the scenario, without the script beside it (that is in the trainers' image)
    (tmp_path / "scenario.yaml").write_text(cm["data"]["scenario.yaml"])
    with pytest.raises(Exception, match="workload.command"):
        load(tmp_path / "scenario.yaml", host=False)
    s = load(tmp_path / "scenario.yaml", host=False, files=False)
    assert s.workload.steps == load(path, host=False).workload.steps and len(s.faults) == 1
    # the reference run (no harness) fingerprints every step and matches nothing
    ref = json.loads(next(o for o in objects(path, harness=False, run="reference", reference_run=None)
                          if o["kind"] == "ConfigMap")["data"]["worker-spec.json"])
    assert "reference" not in ref and ref["probe"] == {"every": 1}


def test_a_script_outside_the_deployed_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # the image would not hold examples/ at any path
    path = str(ROOT / "examples" / "ddp_torchsave" / "kill.yaml")
    assert cli_main(["deploy", path, "--namespace", "ml", "--image", "i:1", "--claim", "shared"]) == 2
    err = capsys.readouterr().err
    assert "workload.command[0]" in err and "a script under the directory baft deploy runs in" in err, err


def test_the_pod_enters_the_scripts_working_directory_before_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from harness.cluster import pod

    seen: list[tuple[list[str], str]] = []
    monkeypatch.setattr(pod.os, "execv", lambda exe, cmd: seen.append((cmd, os.getcwd())))
    monkeypatch.setenv("BAFT_NODE_INDEX", "1")
    work = tmp_path / "shared" / "faulted" / "work"
    pod.main(["--workdir", str(work), "--nnodes", "2", "-m", "harness.worker.boot", "/workspace/train.py"])
    [(cmd, cwd)] = seen
    assert cwd == str(work) and work.is_dir() and "--workdir" not in cmd and cmd[-3:] == ["-m", "harness.worker.boot",
                                                                                          "/workspace/train.py"]
    with pytest.raises(SystemExit, match="absolute"):
        pod.main(["--workdir", "relative/dir", "--nnodes", "2"])
