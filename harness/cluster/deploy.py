"""Kubernetes manifests that run a scenario's workload in a cluster with baft, and the harness next to it.

``baft deploy SCENARIO --namespace N --image IMG --claim PVC [--run NAME] [--harness --reference-run REF]``
prints them as YAML for ``kubectl apply -f -``. The layout, one pod per scenario node:

* an **Indexed Job** ``{name}-{run}`` with ``nodes`` pods (completion index = node index,
  label ``batch.kubernetes.io/job-completion-index``), each running one ``torchrun`` agent
  (``--nproc-per-node`` = ranks per node, c10d rendezvous hosted by pod 0 through a headless
  Service, see :mod:`harness.cluster.pod`) in container ``pytorch``. ``restartPolicy: OnFailure``: a crashed container is
  restarted in place, a deleted pod is recreated by the Job controller.
* with strategy ``baft``, the node's **store** as a native sidecar (an init container with
  ``restartPolicy: Always``, Kubernetes >= 1.29): it outlives the trainer container, so a
  trainer crash keeps the snapshot in the pod's memory (``/dev/shm``, an ``emptyDir`` of
  medium Memory shared by both containers), and the pod completes when the trainer does.
* a **shared volume** (the claim, ReadWriteMany) at ``/shared``: the run directory
  ``/shared/{run}`` (journals) and the persistent checkpoints, also mounted at
  ``/checkpoints`` (a mount point, which IOChaos needs for storage faults).
* a **ConfigMap** with the worker spec (what the local launcher writes for every run) and the
  scenario file; with stores, a **Secret** ``{job}-store`` holding the run's store secret (fresh for
  every deploy), in the environment of the trainer and the store: the stores answer only who proves
  it, and each binds its pod's IP (never a wildcard).
* with ``--harness``: the harness's **ServiceAccount**, a **Role** allowing exactly what
  :mod:`harness.cluster.run` does (create, get and delete the Chaos Mesh kinds the faults map to;
  list pods) and its **RoleBinding**; a **ClusterRole** and **ClusterRoleBinding** letting it get
  exactly the CustomResourceDefinitions of those kinds (a CRD is cluster-scoped; the harness
  validates every object against the schema the cluster serves); and a **Job** running
  ``baft run /etc/baft/scenario.yaml --target k8s ...`` in the cluster, following
  ``/shared/{run}`` and judging it against ``/shared/{reference_run}``.

Unverified: no cluster has run these (see docs/clusters.md). Tests check every object against the
kubernetes client's models (an unknown or misspelt field fails), the spec against the
harness's own schema, and the Role and ClusterRole against the requests the harness makes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from baft.store.wire import SECRET_VARIABLE, new_secret
from baft.strategies.registry import TRAITS

from harness.errors import ConfigValueError
from harness.scenario import Scenario
from harness.worker.spec import ProbeConfig, WorkerSpec, WorkloadConfig
from injectors.chaosmesh.crds import GROUP, PLURALS, crd_name

#: Pod label of an Indexed Job's pod: its completion index, here the scenario node.
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
SPEC_DIR = "/etc/baft"
SHARED = "/shared"
CHECKPOINTS = "/checkpoints"
SHM = "/dev/shm"
#: What the harness does on the cluster (:mod:`harness.cluster.run`): the verbs per resource.
CHAOS_VERBS = ["create", "get", "delete"]
POD_VERBS = ["list"]
CRD_VERBS = ["get"]
#: The Chaos Mesh kinds a fault maps to (not Schedule or Workflow: those are printed, kubectl applies them).
HARNESS_KINDS = ("PodChaos", "NetworkChaos", "StressChaos", "IOChaos", "TimeChaos")

#: The node store sidecar's CPU request: the least Kubernetes gives (the lowest weight of the pod's groups).
STORE_CPU = "1m"


#: A Kubernetes resource quantity (``2``, ``500m``, ``4Gi``, ``1.5G``, ``1e3``).
#: A container image reference: [registry[:port]/]name[:tag][@digest]; it begins with a letter or digit (a
#: leading "-" would read as a flag where the reference is passed on a command line).
IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")
QUANTITY = re.compile(r"[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?")


def _dns_label(value: str, field: str, limit: int = 63) -> None:
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value or "") or len(value) > limit:
        raise ConfigValueError(field, f"a DNS-1123 label of at most {limit} characters", value)


@dataclass(kw_only=True, slots=True)
class DeployConfig:
    """Where and how the workload runs in the cluster."""

    namespace: str
    """Namespace of the job, its volume claim and the harness."""
    image: str
    """Container image with baft-harness installed (``pip install 'baft-harness[k8s]'``) and, for a
    ``script`` or ``command`` workload, the script: under ``workdir`` at the path it has here relative to
    the directory ``baft deploy`` runs in."""
    claim: str
    """PersistentVolumeClaim (ReadWriteMany) shared by every pod and the harness: journals, checkpoints."""
    name: str = "baft-train"
    """First part of the job's name and its pods' ``app`` label."""
    run: str = "faulted"
    """The run: ``/shared/{run}`` on the volume, label ``baft.dev/run``. Deploy once with a reference run
    (no harness) and once with the faulted run (``--harness``)."""
    harness: bool = False
    """Also the harness: its ServiceAccount, Role, RoleBinding, ClusterRole (reading the Chaos Mesh CRDs),
    ClusterRoleBinding and a Job that drives the faults."""
    reference_run: str | None = None
    """With ``harness``: the run the harness judges against (``/shared/{reference_run}``)."""
    service_account: str = "baft-harness"
    """Name of the harness's ServiceAccount (and Role, RoleBinding; the cluster-wide ClusterRole and
    ClusterRoleBinding are ``{service_account}-{namespace}-crds``)."""
    rendezvous_port: int = 29400
    """Port of the c10d rendezvous that pod 0's torchrun agent hosts (through the headless Service)."""
    store_port: int = 29500
    """Port each pod's baft store listens on for its peers' replicas."""
    cpu: str = "2"
    """CPU request and limit of the trainer container (size ``ClusterTarget.cpus_per_pod`` to match)."""
    memory: str = "4Gi"
    """Memory request and limit of the trainer container."""
    workdir: str = "/workspace"
    """The image's copy of the directory ``baft deploy`` runs in (a checkout of the training code, the
    image's ``WORKDIR`` when it is built with ``COPY . /workspace``): a script ``train/run.py`` here is
    ``/workspace/train/run.py`` in the pods."""
    shm: str = "2Gi"
    """Size limit of the pod's ``/dev/shm`` (a memory ``emptyDir``): snapshots and replicas live there. Pages
    the trainer writes count against its memory limit; the store sidecar (which writes the peers' replicas)
    has no limit of its own, so budget the node's memory for both."""

    def __post_init__(self) -> None:
        _dns_label(self.namespace, "namespace")
        _dns_label(self.claim, "claim", 253)
        _dns_label(self.service_account, "service_account", 40)  # the harness Job is {service_account}-{run}
        _dns_label(self.run, "run", 20)
        _dns_label(self.name, "name", 20)
        if self.reference_run is not None:
            _dns_label(self.reference_run, "reference_run", 20)
        if self.harness and self.reference_run == self.run:
            raise ConfigValueError("reference_run", f"a run other than the faulted one ({self.run})",
                                   self.reference_run)
        for field in ("cpu", "memory", "shm"):
            if not isinstance(getattr(self, field), str) or not QUANTITY.fullmatch(getattr(self, field)):
                raise ConfigValueError(field, "a Kubernetes quantity such as 2, 500m, 4Gi", getattr(self, field))
        if not self.workdir.startswith("/") or any(c.isspace() for c in self.workdir):
            raise ConfigValueError("workdir", "an absolute path in the image, without spaces", self.workdir)
        if not isinstance(self.image, str) or not IMAGE.fullmatch(self.image):
            raise ConfigValueError("image", "a container image reference ([registry/]name[:tag][@digest], "
                                   "beginning with a letter or digit)", self.image)
        for field in ("rendezvous_port", "store_port"):
            port = getattr(self, field)
            if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
                raise ConfigValueError(field, "a port in 1024..65535", port)
        if self.rendezvous_port == self.store_port:
            raise ConfigValueError("store_port", "a port other than rendezvous_port", self.store_port)

    @property
    def job(self) -> str:
        return f"{self.name}-{self.run}"

    @property
    def secret_name(self) -> str:
        """The Secret holding the run's store secret."""
        return f"{self.job}-store"

    @property
    def labels(self) -> dict[str, str]:
        return {"app": self.name, "baft.dev/run": self.run, "app.kubernetes.io/managed-by": "baft-harness"}

    def meta(self, name: str, **extra: str) -> dict[str, Any]:
        return {"name": name, "namespace": self.namespace, "labels": {**self.labels, **extra}}


def image_path(local: str, cfg: DeployConfig, key: str) -> str:
    """Where the script at ``local`` (a path on this machine) is in the pods: under ``cfg.workdir`` at
    its path relative to the directory ``baft deploy`` runs in."""
    here = Path.cwd().resolve()
    try:
        rel = Path(local).resolve().relative_to(here)
    except ValueError:
        raise ConfigValueError(key, f"a script under the directory baft deploy runs in ({here}), which the image "
                               f"holds at workdir ({cfg.workdir})", local) from None
    return str(PurePosixPath(cfg.workdir) / rel.as_posix())


def work_dir(cfg: DeployConfig) -> str:
    """A ``command`` workload's working directory in the pods: on the shared volume, kept across restarts
    and pod replacements (its relative checkpoint paths land there), one per run."""
    return f"{SHARED}/{cfg.run}/work"


def pod_workload(scenario: Scenario, cfg: DeployConfig) -> WorkloadConfig:
    """The scenario's workload with its script's path as the pods see it."""
    w = scenario.workload
    if w.script is not None:
        return replace(w, script=image_path(w.script, cfg, "workload.script"))
    if w.command is not None:
        return replace(w, command=[image_path(str(w.command[0]), cfg, "workload.command[0]"), *w.command[1:]])
    return w


def worker_spec(scenario: Scenario, cfg: DeployConfig) -> WorkerSpec:
    """The worker spec every rank reads (``BAFT_SPEC``), as the local launcher writes it, for the pods.

    No faults: on a cluster Chaos Mesh injects them from outside the job. A faulted run (``harness``) of
    a ``command`` workload matches a restarted script's first state against the reference run's
    fingerprints (``/shared/{reference_run}``), and fingerprints as ``probe:`` says."""
    checkpoint = replace(scenario.checkpoint.with_baft(shm_dir=f"{SHM}/baft"),
                         dir=scenario.checkpoint.dir if "://" in scenario.checkpoint.dir else CHECKPOINTS)
    stores = TRAITS[scenario.checkpoint.strategy].node_stores
    faulted = cfg.harness and cfg.reference_run is not None and scenario.workload.command is not None
    return WorkerSpec(workload=pod_workload(scenario, cfg), checkpoint=checkpoint, run_dir=f"{SHARED}/{cfg.run}",
                      stores=[f"{cfg.job}-{i}.{cfg.job}.{cfg.namespace}.svc:{cfg.store_port}"
                              for i in range(scenario.workload.nodes)] if stores else None,
                      node_memory=f"{SHM}/baft" if stores else None,
                      reference=f"{SHARED}/{cfg.reference_run}" if faulted else None,
                      probe=scenario.probe if faulted else ProbeConfig(),
                      flush_on_sigterm=True)  # pods are evicted and preempted: the built-in workload saves in the grace


def _env(**values: str) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in values.items()]


def training(scenario: Scenario, cfg: DeployConfig) -> list[dict[str, Any]]:
    """ConfigMap, headless Service and Indexed Job running the scenario's workload with baft."""
    spec = worker_spec(scenario, cfg)
    w = spec.workload
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": cfg.meta(cfg.job),
                  "data": {"worker-spec.json": spec.dumps() + "\n",
                           "scenario.yaml": _scenario_text(scenario)}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": cfg.meta(cfg.job),
               "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                        "selector": {"app": cfg.name, "baft.dev/run": cfg.run},
                        "ports": [{"name": "rendezvous", "port": cfg.rendezvous_port},
                                  {"name": "store", "port": cfg.store_port}]}}
    env = _env(BAFT_SPEC=f"{SPEC_DIR}/worker-spec.json", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", GLOO_SOCKET_IFNAME="eth0", PYTHONUNBUFFERED="1")
    env.append({"name": "BAFT_NODE_INDEX", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{INDEX_LABEL}']"}}})
    secret: list[dict[str, Any]] = []
    if spec.stores is not None:  # the run's store secret, from the Secret: the stores answer only who proves it
        secret = [{"name": SECRET_VARIABLE, "valueFrom": {"secretKeyRef": {"name": cfg.secret_name, "key": "secret"}}}]
        env += secret
    if w.command is not None:  # the unmodified script through the boot module, in the run's own directory
        script, *args = w.command
        target = ["-m", "harness.worker.boot", str(script), *(str(a).replace("{run_dir}", work_dir(cfg)) for a in args)]
        where = ["--workdir", work_dir(cfg)]
    else:
        target = [w.script, *map(str, w.args)] if w.script else ["-m", "harness.worker.workload",
                                                                 f"{SPEC_DIR}/worker-spec.json"]
        where = []
    # harness.cluster.pod execs torchrun with --rdzv-conf is_host=1 on pod 0 only (see that module for why).
    # The built-in workload's workers are forked warm (harness.run.agent); a script's start in fresh interpreters.
    preload = [] if w.script or w.command else ["--preload", "harness.worker.workload"]
    torchrun = ["python", "-m", "harness.cluster.pod", *where, *preload, "--nnodes", str(w.nodes),
                "--nproc-per-node", str(w.world_size // w.nodes), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{cfg.job}-0.{cfg.job}:{cfg.rendezvous_port}", "--rdzv-id", cfg.job,
                "--max-restarts", str(scenario.run.max_restarts), "--monitor-interval", "0.2", *target]
    mounts: list[dict[str, Any]] = [
              {"name": "shared", "mountPath": SHARED},
              {"name": "shared", "mountPath": CHECKPOINTS, "subPath": f"{cfg.run}/checkpoints"},
              {"name": "shm", "mountPath": SHM}, {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True}]
    resources = {"requests": {"cpu": cfg.cpu, "memory": cfg.memory}, "limits": {"cpu": cfg.cpu, "memory": cfg.memory}}
    pod: dict[str, Any] = {
        "subdomain": cfg.job, "restartPolicy": "OnFailure",
        "containers": [{"name": "pytorch", "image": cfg.image, "command": torchrun, "env": env,
                        "volumeMounts": mounts, "resources": resources,
                        "ports": [{"name": "rendezvous", "containerPort": cfg.rendezvous_port}]}],
        "volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": cfg.claim}},
                    {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": cfg.shm}},
                    {"name": "spec", "configMap": {"name": cfg.job}}]}
    if spec.stores is not None:  # the node's store as a sidecar
        index = "$(BAFT_NODE_INDEX)"
        # The pod's own IP, never a wildcard: its DNS name may not resolve before the pod is ready.
        store = ["python", "-m", "baft.store", "--root", f"{SHM}/baft/node{index}", "--node", index,
                 "--addresses", ",".join(spec.stores), "--listen", "$(POD_IP)",
                 "--replication", scenario.checkpoint.replication.to_json(),
                 "--journal", f"{SHARED}/{cfg.run}/journal/store-node{index}.jsonl",
                 "--world-size", str(w.world_size)]
        pod_ip = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
        # In the pod's group, at the lowest CPU weight (1m: cpu.shares 2, cpu.weight 1): the store runs on what the
        # trainer leaves, and never has a fair share of its own (issue 55); its journal's store_start says which
        # idle classes the container let it take.
        pod["initContainers"] = [{"name": "store", "image": cfg.image, "restartPolicy": "Always", "command": store,
                                  "env": [e for e in env if e["name"] == "BAFT_NODE_INDEX"] + [pod_ip] + secret,
                                  "volumeMounts": [m for m in mounts if m["mountPath"] in (SHARED, SHM)],
                                  "resources": {"requests": {"cpu": STORE_CPU}},
                                  "ports": [{"name": "store", "containerPort": cfg.store_port}]}]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": cfg.meta(cfg.job),
           "spec": {"completionMode": "Indexed", "completions": w.nodes, "parallelism": w.nodes,
                    # A replacement pod only once the old one is gone: never two pods (one dying) with one
                    # index, hostname and DNS name, which the rendezvous and the stores dial.
                    "podReplacementPolicy": "Failed",
                    # every pod kill and, with OnFailure, every container restart counts; let the scenario's
                    # restarts through on every node
                    "backoffLimit": max(6, (scenario.run.max_restarts + 1) * w.nodes),
                    "template": {"metadata": {"labels": cfg.labels}, "spec": pod}}}
    if not secret:
        return [config_map, service, job]
    token = {"apiVersion": "v1", "kind": "Secret", "metadata": cfg.meta(cfg.secret_name), "type": "Opaque",
             "stringData": {"secret": new_secret()}}  # fresh for every deploy: one run's stores, one secret
    return [token, config_map, service, job]


def _scenario_text(scenario: Scenario) -> str:
    if scenario.source and Path(scenario.source).is_file():
        return Path(scenario.source).read_text(encoding="utf-8")
    raise ConfigValueError("scenario", "a scenario file (the harness Job reads it)", scenario.source)


def rbac(cfg: DeployConfig) -> list[dict[str, Any]]:
    """The harness's ServiceAccount, a Role and a ClusterRole with exactly what it does, and their bindings."""
    meta = cfg.meta(cfg.service_account)
    subjects = [{"kind": "ServiceAccount", "name": cfg.service_account, "namespace": cfg.namespace}]
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
            "rules": [{"apiGroups": [GROUP], "resources": sorted(PLURALS[k] for k in HARNESS_KINDS),
                       "verbs": CHAOS_VERBS},
                      {"apiGroups": [""], "resources": ["pods"], "verbs": POD_VERBS}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": cfg.service_account},
               "subjects": subjects}
    # Cluster-scoped (no namespace), one per harness namespace: a binding names its subjects' namespace.
    cluster = {k: v for k, v in cfg.meta(f"{cfg.service_account}-{cfg.namespace}-crds").items() if k != "namespace"}
    crds = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": cluster,
            "rules": [{"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                       "resourceNames": sorted(crd_name(k) for k in HARNESS_KINDS), "verbs": CRD_VERBS}]}
    crds_binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": cluster,
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": cluster["name"]},
                    "subjects": subjects}
    return [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}, role, binding, crds, crds_binding]


def harness_job(scenario: Scenario, cfg: DeployConfig) -> dict[str, Any]:
    """A Job that runs ``baft run --target k8s`` in the cluster against the training job."""
    if cfg.reference_run is None:
        raise ConfigValueError("reference_run", "the run to judge against (deploy it first, without --harness)", None)
    command = ["baft", "run", f"{SPEC_DIR}/scenario.yaml", "--target", "k8s", "--namespace", cfg.namespace,
               "--selector", f"app={cfg.name},baft.dev/run={cfg.run}", "--rank-label", INDEX_LABEL,
               "--job-dir", f"{SHARED}/{cfg.run}", "--reference", f"{SHARED}/{cfg.reference_run}",
               "--out", f"{SHARED}/{cfg.run}-verdict"]
    pod = {"serviceAccountName": cfg.service_account, "restartPolicy": "Never",
           "containers": [{"name": "harness", "image": cfg.image, "command": command,
                           "env": _env(PYTHONUNBUFFERED="1"),
                           "volumeMounts": [{"name": "shared", "mountPath": SHARED},
                                            {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True}]}],
           "volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": cfg.claim}},
                       {"name": "spec", "configMap": {"name": cfg.job}}]}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": cfg.meta(f"{cfg.service_account}-{cfg.run}", **{"app.kubernetes.io/component": "harness"}),
            "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app.kubernetes.io/component": "harness"}},
                                                     "spec": pod}}}


def deployment(scenario: Scenario, cfg: DeployConfig) -> list[dict[str, Any]]:
    """Everything ``baft deploy`` prints, in the order kubectl should create it."""
    objects = training(scenario, cfg)
    if cfg.harness:
        objects = rbac(cfg) + objects + [harness_job(scenario, cfg)]
    return objects
