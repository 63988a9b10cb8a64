"""What ``baft run --target k8s`` is told: where the job runs and how the harness follows it.

:class:`ClusterConfig` is how :func:`harness.cluster.run.run_on_cluster` follows a job (where its steps are
read, how long Chaos Mesh has); :class:`ClusterOptions` is the whole of the cluster path's command line
(the job's namespace and pods, the kubeconfig, the reference run, dry-run and Workflow output) with a
``ClusterConfig`` inside. Both are stdlib only: ``baft``'s parser builds its flags from them
(:mod:`harness.cliconfig`) without importing the cluster client.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from harness.errors import ConfigValueError


@dataclass(kw_only=True, slots=True)
class ClusterConfig:
    """How the harness follows a job on a cluster and how long it waits for Chaos Mesh."""

    FLAGLESS: ClassVar[tuple[str, ...]] = ("timeout",)
    """``timeout`` is the scenario's ``run.timeout``."""

    job_dir: Path | None = None
    """The training job's run directory as this process sees it (a shared volume): the ranks write
    ``journal/rank-*/events.jsonl`` there, the harness reads steps from it (unless ``wandb_run``)
    and, at the end, copies the journal for the verdict."""
    wandb_run: str | None = None
    """``ENTITY/PROJECT/RUN_ID``: read the steps from the job's W&B run instead of the job's directory
    (:mod:`harness.cluster.wandbprogress`; needs ``WANDB_API_KEY``)."""
    wandb_base_url: str | None = None
    """With ``wandb_run``: the W&B server (default: ``WANDB_BASE_URL`` or wandb's own)."""
    inject_timeout: float = 60.0
    """Seconds Chaos Mesh has to report a fault injected on every target."""
    recover_timeout: float = 120.0
    """Seconds Chaos Mesh has, after a delete, to undo a fault (the object is gone)."""
    start_timeout: float = 600.0
    """Seconds to wait for the job's first ``start`` event in its journal."""
    timeout: float = 3600.0
    """Seconds the whole run may take once the job has started."""
    poll: float = 0.5
    """Seconds between two reads of the journal (and of an object's status)."""

    def __post_init__(self) -> None:
        if self.job_dir is None and self.wandb_run is None:
            raise ConfigValueError("job_dir", "the job's run directory on a volume shared with this process (the "
                                   "ranks' journal/rank-*/events.jsonl, from which the harness reads the steps); or "
                                   "--wandb-run ENTITY/PROJECT/RUN_ID to read them from the job's W&B run; or --dry-run "
                                   "to print the objects: --target k8s needs --job-dir to follow the job", None)
        if self.wandb_run is not None:
            from harness.cluster.wandbprogress import check_run_path

            try:
                check_run_path(self.wandb_run)
            except ValueError:
                raise ConfigValueError("wandb_run", "ENTITY/PROJECT/RUN_ID (the run's id, as in its URL)",
                                       self.wandb_run) from None
        for name in ("inject_timeout", "recover_timeout", "start_timeout", "timeout", "poll"):
            if not getattr(self, name) > 0:
                raise ConfigValueError(name, "seconds > 0", getattr(self, name))


@dataclass(kw_only=True, slots=True)
class ClusterOptions:
    """``baft run --target k8s``: the job on the cluster, and how its faults are printed or driven."""

    FLAT: ClassVar[tuple[str, ...]] = ("follow",)
    """The section whose flags carry no prefix (``--job-dir``, not ``--follow.job-dir``)."""

    namespace: str | None = None
    """The training job's namespace."""
    selector: str | None = None
    """Label selector of the job's pods, ``k=v[,k=v...]``."""
    rank_label: str | None = None
    """The pod label holding the pod index (default: the one of the job's controller)."""
    kubeconfig: str | None = None
    """Kubeconfig file (default: ``$KUBECONFIG``, ``~/.kube/config``, or the pod's service account in-cluster)."""
    context: str | None = None
    """Kubeconfig context (default: its current one)."""
    reference: Path | None = None
    """Run directory of an uninterrupted run of the same job, for the bitwise verdict (needs ``job_dir``)."""
    workflow: bool = False
    """With ``dry_run``: the time-triggered faults as one Chaos Mesh Workflow (the cluster's clock runs them; step
    triggers need the harness following the journal)."""
    dry_run: bool = False
    """Print every object it would create as YAML documents (``kubectl apply -f -``); touch no cluster."""
    crds: Path | None = None
    """With ``dry_run``: directory of the Chaos Mesh CRDs (YAML) to validate against (default ``$BAFT_CHAOS_CRDS``);
    on a cluster the CRDs it serves are read."""
    follow: ClusterConfig | None = field(default=None)
    """How the harness follows the job (not with ``dry_run``): its steps' source and the Chaos Mesh timeouts."""

    def __post_init__(self) -> None:
        for name in ("namespace", "selector"):
            if not getattr(self, name):
                raise ConfigValueError(name, "a value: --target k8s needs --namespace and --selector",
                                       getattr(self, name))
        self.labels()
        if self.dry_run:
            return
        if self.follow is None:
            ClusterConfig()  # says what it needs
        if self.reference is not None and (self.follow is None or self.follow.job_dir is None):
            raise ConfigValueError("reference", "--job-dir with it: the verdict compares the job's journal with the "
                                   "reference's", str(self.reference))
        if self.workflow:
            raise ConfigValueError("workflow", "--dry-run with it: --workflow prints one Chaos Mesh Workflow for the "
                                   "time-triggered faults (apply it with kubectl when the job starts: its clock starts "
                                   "at creation)", True)
        if self.crds is not None:
            raise ConfigValueError("crds", "--dry-run with it: on a cluster the objects are validated against the CRDs "
                                   "the cluster serves", str(self.crds))

    def labels(self) -> dict[str, str]:
        """The label selector as a mapping."""
        pairs = [kv.split("=", 1) for kv in (self.selector or "").split(",") if kv]
        if not pairs or any(len(p) != 2 or not p[0] for p in pairs):
            raise ConfigValueError("selector", "k=v[,k=v]", self.selector)
        return dict((k, v) for k, v in pairs)
