"""The faults of a scenario as Chaos Mesh objects, for a training job on a live Kubernetes cluster.

Each local fault config (see :data:`injectors.FAULTS`) maps to one Chaos Mesh object
(group ``chaos-mesh.org``, version ``v1alpha1``) aimed at the job's pods:

=============  ===========================================================================
fault          Chaos Mesh object
=============  ===========================================================================
kill           PodChaos ``pod-kill`` of the rank's pod, ``gracePeriod`` 0 (SIGKILL) or
               ``term_grace_seconds`` (SIGTERM, then SIGKILL)
crash          PodChaos ``container-kill`` of the training container
hang           PodChaos ``pod-failure`` for ``hang_duration``
node_loss      PodChaos ``pod-kill`` of every pod of the node (``mode: all``)
preempt        PodChaos ``pod-kill`` of the node's pods (or the ranks' pods), ``gracePeriod`` ``grace_s``
               rounded up to whole seconds: the kubelet sends SIGTERM, then SIGKILL after it
throttle       NetworkChaos ``bandwidth`` between the two nodes' pods, both directions
partition      NetworkChaos ``partition``: the cut-off node's pods from the other node's
delay          NetworkChaos ``delay`` between the two nodes' pods, both directions
straggler      StressChaos CPU stressors in the rank's pod
slow_storage   IOChaos ``latency`` on checkpoint writes, every pod
corrupt        IOChaos ``mistake`` (one random byte per write) on rank 0's checkpoint writes
disk_full      IOChaos ``fault`` errno 28 (ENOSPC) on checkpoint writes, every pod
clock_skew     TimeChaos ``timeOffset`` on the rank's pod or the node's pods, training container
jitter         none: :class:`Unmappable`
node_join      none: :class:`Unmappable` (the job's controller scales the job back up)
=============  ===========================================================================

**Pods.** A rank's pod is the job's ``selector`` plus ``{rank_label: rank // ranks_per_pod}``;
a node's pods are the selector plus ``{node_label: node}``. Every object uses ``mode: all``
over such a selector: it is deterministic (``one`` would pick a random pod if labels ever
matched several), so the harness can check that exactly the expected number of pods
was injected (``status.experiment.containerRecords``).

**When.** The harness applies each object when the local trigger would fire and deletes
it as the local rollback would. A *window* fault's object carries ``duration`` (a Go
duration) only when the window has one in seconds (``duration``); a window bounded by
steps (``from_step``/``to_step``) or open-ended gets none, and the harness deletes the
object at ``to_step`` or at the end of the run. A point fault with a step, ``at_time``
or ``mtbf`` trigger is applied once per occurrence (``occurrence`` keeps the names
apart); a periodic ``every_seconds`` trigger can instead become one
:func:`schedule_manifest`. The time-triggered faults of a run can instead become one Workflow
that the cluster times itself (:mod:`injectors.chaosmesh.workflow`).

Validation against the CRDs and the webhook's rules is in :mod:`injectors.chaosmesh.schema`, the
CRDs' source in :mod:`injectors.chaosmesh.crds` (both re-exported here). Nothing here talks to a cluster.
"""
from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import yaml

from injectors.chaosmesh.crds import Crds, CrdUnavailable
from injectors.chaosmesh.formats import (
    chaos_rate_bytes,
    format_chaos_rate,
    is_dns_label,
    is_label_key,
    is_label_value,
    parse_go_duration,
)
from injectors.chaosmesh.schema import API_VERSION, SCHEDULE_EMBEDS, ManifestInvalid, validate
from injectors.clock import ClockSkewConfig
from injectors.compute import StragglerConfig
from injectors.data import JitterConfig
from injectors.errors import FaultConfigError, InjectorError
from injectors.join import NodeJoinConfig
from injectors.link import DelayConfig, PartitionConfig, ThrottleConfig
from injectors.network import format_rate, parse_rate
from injectors.preempt import PreemptConfig
from injectors.process import CrashConfig, HangConfig, KillConfig, NodeLossConfig
from injectors.storage import CorruptConfig, DiskFullConfig, SlowStorageConfig
from injectors.trigger import PointFault, WindowFault

__all__ = ["ClusterTarget", "CrdUnavailable", "Crds", "ManifestInvalid", "Unmappable", "chaos_rate", "manifests",
           "object_name", "schedule_manifest", "tc_rate", "to_yaml", "validate"]

MANAGED_BY = "baft-harness"
ENOSPC = 28
#: IO methods that can fail with ENOSPC on a full file system (reads never do).
WRITE_METHODS = ["create", "mknod", "mkdir", "write", "flush", "fsync", "rename"]


class Unmappable(InjectorError):
    """A fault has no Chaos Mesh equivalent; ``kind`` names it and ``reason`` says why."""

    def __init__(self, kind: str, reason: str) -> None:
        self.kind, self.reason = kind, reason
        super().__init__(f"fault {kind!r} cannot run on a cluster with Chaos Mesh: {reason}")


@dataclass(kw_only=True, slots=True)
class ClusterTarget:
    """Where a training job runs on a cluster, and how to find the pod of a rank or a node."""

    namespace: str
    """Namespace of the training job (and of the Chaos Mesh objects)."""
    selector: dict[str, str]
    """Labels every pod of the training job has, e.g. ``{"training.kubeflow.org/job-name": "gpt"}``."""
    rank_label: str = "training.kubeflow.org/replica-index"
    """Pod label holding the pod's index. PyTorchJob sets ``training.kubeflow.org/replica-index``
    (numbered per replica type: with a Master replica, put ``training.kubeflow.org/replica-type``
    in ``selector``, or run a Worker-only elastic job); JobSet sets ``jobset.sigs.k8s.io/job-index``
    (one pod per child Job; an Indexed Job with several pods has
    ``batch.kubernetes.io/job-completion-index``); a StatefulSet gives ``apps.kubernetes.io/pod-index``."""
    node_label: str = ""
    """Pod label telling which node (host group) of the scenario a pod belongs to; empty: ``rank_label``
    (one pod per node, the usual torchrun-per-pod layout)."""
    ranks_per_pod: int = 1
    """Training processes per pod (torchrun ``--nproc-per-node``): rank r lives in pod r // ranks_per_pod,
    so a rank fault hits all ranks of that pod."""
    container: str = "pytorch"
    """Name of the training container in the pod (PyTorchJob requires ``pytorch``)."""
    name_prefix: str = "baft"
    """First part of every object's name."""
    checkpoint_path: str = "/checkpoints"
    """Mount path, in the training container, of the volume holding the persistent checkpoints
    (storage faults act on it; IOChaos needs it to be a volume's mount point)."""
    cpus_per_pod: int = 1
    """CPUs the training container may use (its CPU limit): sizes a straggler's CPU stress."""
    hang_duration: str = "10m"
    """How long a hang keeps the pod failed (a Go duration; Chaos Mesh's pod-failure needs one). A
    local hang lasts until the watchdog acts: make this longer than the watchdog's timeout."""
    term_grace_seconds: int = 30
    """Seconds between SIGTERM and SIGKILL for a ``kill`` with ``signal: SIGTERM`` (pod deletion grace)."""

    def __post_init__(self) -> None:
        if not is_dns_label(self.namespace):
            raise FaultConfigError("namespace", "a DNS-1123 label (lowercase letters, digits, '-'; <= 63)",
                                   self.namespace)
        if not isinstance(self.selector, dict) or not self.selector:
            raise FaultConfigError("selector", "a non-empty map of pod labels", self.selector)
        bad = {k: v for k, v in self.selector.items() if not is_label_key(k) or not is_label_value(v)}
        if bad:
            raise FaultConfigError("selector", "valid label keys and values", bad)
        if not self.node_label:
            self.node_label = self.rank_label
        for name in ("rank_label", "node_label"):
            key = getattr(self, name)
            if not is_label_key(key):
                raise FaultConfigError(name, "a label key such as training.kubeflow.org/replica-index", key)
            if key in self.selector:
                raise FaultConfigError(name, "a label not already fixed by selector", key)
        if not is_dns_label(self.container):
            raise FaultConfigError("container", "a container name (a DNS-1123 label)", self.container)
        if not is_dns_label(self.name_prefix) or len(self.name_prefix) > 20:
            raise FaultConfigError("name_prefix", "a DNS-1123 label of at most 20 characters", self.name_prefix)
        if not re.fullmatch(r"/[^\s*?\[\]]*", self.checkpoint_path) or self.checkpoint_path.rstrip("/") == "":
            raise FaultConfigError("checkpoint_path", "an absolute path below / without glob characters",
                                   self.checkpoint_path)
        for name in ("ranks_per_pod", "cpus_per_pod"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise FaultConfigError(name, "an integer >= 1", value)
        try:
            ok = parse_go_duration(self.hang_duration) > 0
        except ValueError:
            ok = False
        if not ok:
            raise FaultConfigError("hang_duration", "a positive Go duration such as 10m or 90s", self.hang_duration)
        if isinstance(self.term_grace_seconds, bool) or not isinstance(self.term_grace_seconds, int) \
                or self.term_grace_seconds < 0:
            raise FaultConfigError("term_grace_seconds", "an integer >= 0", self.term_grace_seconds)

    def pods(self, **labels: int) -> dict[str, Any]:
        """A Chaos Mesh selector of the job's pods that also carry ``labels`` (label key -> index)."""
        # Running pods only: Chaos Mesh selects pods in every phase by default, and a pod still terminating
        # after a kill (or its Pending replacement) would get a record that never reaches Injected.
        return {"namespaces": [self.namespace],
                "labelSelectors": {**self.selector, **{k: str(v) for k, v in labels.items()}},
                "podPhaseSelectors": ["Running"]}

    def rank_pod(self, rank: int) -> dict[str, Any]:
        """The selector of the pod running ``rank``."""
        return self.pods(**{self.rank_label: rank // self.ranks_per_pod})

    def ranks_pods(self, ranks: list[int]) -> dict[str, Any]:
        """The selector of the pods running any of ``ranks``."""
        pods = sorted({r // self.ranks_per_pod for r in ranks})
        if len(pods) == 1:
            return self.pods(**{self.rank_label: pods[0]})
        return {**self.pods(), "expressionSelectors": [
            {"key": self.rank_label, "operator": "In", "values": [str(p) for p in pods]}]}

    def node_pods(self, node: int) -> dict[str, Any]:
        """The selector of the pods of scenario node ``node``."""
        return self.pods(**{self.node_label: node})


# --- units ------------------------------------------------------------------------------------------

def chaos_rate(tc: str) -> str:
    """A local throttle rate (tc units: ``50mbit``; ``bit`` = bits/s, ``bps`` = bytes/s, SI prefixes)
    as a NetworkChaos bandwidth ``rate``, which Chaos Mesh parses in bytes/s with powers of 1024
    (``kbps`` = 1024 B/s) and integers only. ``50mbit`` -> ``6250000bps``; ``8mibit`` -> ``1mbps``.
    A rate that is not a whole number of bytes/s is rounded to the nearest byte (at least 1)."""
    bits = parse_rate(tc)
    return format_chaos_rate(max(1, (bits + 4) // 8))


def tc_rate(chaos: str) -> str:
    """A NetworkChaos ``rate`` in tc's spelling (bits/s, SI prefixes): ``1mbps`` -> ``8388608bit``."""
    return format_rate(chaos_rate_bytes(chaos) * 8)


def go_duration(seconds: float) -> str:
    """Seconds as a Go duration, to the millisecond (at least 1 ms): 30 -> ``30s``, 1.5 -> ``1500ms``."""
    if not math.isfinite(seconds) or seconds <= 0:
        raise FaultConfigError("duration", "seconds > 0", seconds)
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def go_millis(ms: float, field: str) -> str:
    """Milliseconds as a Go duration, to the microsecond (at least 1 us): 10 -> ``10ms``, 0.5 -> ``500us``."""
    if not math.isfinite(ms) or ms <= 0:
        raise FaultConfigError(field, "milliseconds > 0", ms)
    us = max(1, round(ms * 1000))
    return f"{us // 1000}ms" if us % 1000 == 0 else f"{us}us"


# --- names --------------------------------------------------------------------------------------------

def object_name(target: ClusterTarget, run_id: str, fault_id: int | None, kind: str,
                occurrence: int | None = None) -> str:
    """``{name_prefix}-{run_id}-{fault_id}-{kind}[-{occurrence}]``, lowercased, as a DNS-1123 label
    (no ``-{fault_id}`` when it is None: an object of the whole run, such as a Workflow).

    Characters a label cannot hold become '-'. When the name would pass 63 characters,
    the run id is cut and an 8-hex digest of the full name is put after it, so names of
    different runs stay distinct; the ``baft.dev/run`` label keeps the whole run id.
    """
    check_run_id(run_id)
    if fault_id is not None and (isinstance(fault_id, bool) or not isinstance(fault_id, int) or fault_id < 0):
        raise FaultConfigError("fault_id", "an integer >= 0", fault_id)
    tail = "".join(f"-{part}" for part in (fault_id, kind, occurrence) if part is not None)
    tail = re.sub(r"[^a-z0-9-]", "-", tail.lower())
    run = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-") or "run"
    name = f"{target.name_prefix}-{run}{tail}"
    if len(name) > 63:
        digest = hashlib.sha1(f"{target.name_prefix}/{run_id}/{tail}".encode()).hexdigest()[:8]
        room = 63 - len(target.name_prefix) - len(tail) - len(digest) - 2
        if room < 1:
            raise FaultConfigError("name_prefix", "a shorter prefix (names must fit in 63 characters)",
                                   target.name_prefix)
        name = f"{target.name_prefix}-{run[:room].rstrip('-') or 'r'}-{digest}{tail}"
    return name


def check_run_id(run_id: str) -> None:
    """Raise :class:`FaultConfigError` unless ``run_id`` can be a label value (it labels every object)."""
    if not isinstance(run_id, str) or not run_id or not is_label_value(run_id):
        raise FaultConfigError("run_id", "a label value: 1-63 letters, digits, '-', '_', '.', alphanumeric ends",
                               run_id)


def _object(kind: str, name: str, target: ClusterTarget, run_id: str, fault_id: int, fault: str,
            spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": kind,
            "metadata": {"name": name, "namespace": target.namespace,
                         "labels": {"app.kubernetes.io/managed-by": MANAGED_BY, "baft.dev/run": run_id,
                                    "baft.dev/fault": str(fault_id), "baft.dev/fault-kind": fault}},
            "spec": spec}


def _window(config: WindowFault, spec: dict[str, Any]) -> dict[str, Any]:
    """Add ``duration`` when the window lasts a number of seconds; step windows end when the harness deletes."""
    if config.duration is not None:
        spec["duration"] = go_duration(config.duration)
    return spec


# --- one builder per fault kind: (config, target) -> (Chaos Mesh kind, spec) ---------------------------

Spec = tuple[str, dict[str, Any]]


def _kill(c: KillConfig, t: ClusterTarget) -> Spec:
    # Deleting a pod sends SIGTERM, then SIGKILL after the grace period: SIGINT and SIGABRT cannot be sent.
    grace = {"SIGKILL": 0, "SIGTERM": t.term_grace_seconds}.get(c.signal)
    if grace is None:
        raise Unmappable("kill", f"Chaos Mesh deletes pods (SIGTERM, then SIGKILL) and cannot send {c.signal}; "
                                 "use signal SIGKILL or SIGTERM, or crash with how: abort")
    return "PodChaos", {"action": "pod-kill", "mode": "all", "selector": t.rank_pod(c.rank), "gracePeriod": grace}


def _crash(c: CrashConfig, t: ClusterTarget) -> Spec:
    # Every local crash (segfault, abort, exit, exception) ends the process; the runtime's kill of the
    # container ends it too, and the kubelet restarts it in place (pod kept, per restartPolicy).
    return "PodChaos", {"action": "container-kill", "mode": "all", "selector": t.rank_pod(c.rank),
                        "containerNames": [t.container]}


def _hang(c: HangConfig, t: ClusterTarget) -> Spec:
    # pod-failure swaps the containers' images for a pause image: the pod stays, the training process is
    # gone until the duration ends. It approximates a stopped rank (peers stall), it is not a SIGSTOP.
    return "PodChaos", {"action": "pod-failure", "mode": "all", "selector": t.rank_pod(c.rank),
                        "duration": t.hang_duration}


def _node_loss(c: NodeLossConfig, t: ClusterTarget) -> Spec:
    if not c.replacement:
        raise Unmappable("node_loss", "replacement: false needs the node to stay gone, but the job's controller "
                                      "recreates every pod Chaos Mesh deletes (cordon or drain the node instead)")
    return "PodChaos", {"action": "pod-kill", "mode": "all", "selector": t.node_pods(c.node), "gracePeriod": 0}


def _preempt(c: PreemptConfig, t: ClusterTarget) -> Spec:
    if not c.restart:
        raise Unmappable("preempt", "restart: false needs the node to stay gone, but the job's controller "
                                    "recreates every pod Chaos Mesh deletes (cordon or drain the node instead)")
    selector = t.node_pods(c.node) if c.node is not None else t.ranks_pods(c.ranks or [])
    return "PodChaos", {"action": "pod-kill", "mode": "all", "selector": selector,
                        "gracePeriod": math.ceil(c.grace_s)}


def _node_join(c: NodeJoinConfig, t: ClusterTarget) -> Spec:
    raise Unmappable("node_join", "a node joins when the job's controller scales it back up (more replicas of the "
                                  "job's pods); Chaos Mesh removes capacity, it does not add any")


def _pair(c: ThrottleConfig | PartitionConfig | DelayConfig) -> tuple[int, int]:
    nodes = c.nodes
    if len(nodes) != 2 or nodes[0] == nodes[1]:
        raise FaultConfigError("link", "two different nodes", c.link)
    return nodes[0], nodes[1]


def _link(spec: dict[str, Any], a: int, b: int, t: ClusterTarget) -> dict[str, Any]:
    return {**spec, "mode": "all", "selector": t.node_pods(a), "direction": "both",
            "target": {"mode": "all", "selector": t.node_pods(b)}}


def _throttle(c: ThrottleConfig, t: ClusterTarget) -> Spec:
    rate = chaos_rate(c.rate)
    per_s = chaos_rate_bytes(rate)
    # As the local tbf: a bucket of 10 ms of the rate (>= 16 KiB) unless burst is given, 50 ms of queue.
    if c.burst is not None and not re.fullmatch(r"[0-9]+", c.burst):
        raise FaultConfigError("burst", "a number of bytes", c.burst)
    buffer = int(c.burst) if c.burst is not None else max(per_s // 100, 16 * 1024)
    limit = buffer + per_s * 50 // 1000
    cap = 2**31 - 1  # both are int32 in the CRD
    a, b = _pair(c)
    return "NetworkChaos", _window(c, _link({"action": "bandwidth", "bandwidth": {
        "rate": rate, "limit": max(1, min(limit, cap)), "buffer": max(1, min(buffer, cap))}}, a, b, t))


def _partition(c: PartitionConfig, t: ClusterTarget) -> Spec:
    a, b = _pair(c)
    victim = c.victim
    if victim not in (a, b):
        raise FaultConfigError("side", f"one of the link's nodes {c.link}", c.side)
    other = b if victim == a else a
    return "NetworkChaos", _window(c, _link({"action": "partition"}, victim, other, t))


def _delay(c: DelayConfig, t: ClusterTarget) -> Spec:
    a, b = _pair(c)
    return "NetworkChaos", _window(c, _link({"action": "delay", "delay": {
        "latency": go_millis(c.ms, "ms"), "jitter": "0ms", "correlation": "0"}}, a, b, t))


def straggler_workers(factor: float, cpus: int) -> int:
    """CPU-stress workers that slow a pod of ``cpus`` CPUs about ``factor`` times: (factor - 1) * cpus.

    The workers run in the container's cgroup; under its CPU limit, W busy workers and a
    training process that could use all ``cpus`` share the quota, leaving it cpus/(cpus+W)
    of the CPU. That is an approximation of a slowdown, not a factor: the kernel's share
    is not exact, a GPU-bound step slows much less (the GPU is not stressed), and the
    local straggler slows compute only, while this slows everything in the pod.
    """
    if not factor > 1:
        raise FaultConfigError("factor", "a number > 1", factor)
    return min(8192, max(1, round((factor - 1) * cpus)))


def _straggler(c: StragglerConfig, t: ClusterTarget) -> Spec:
    return "StressChaos", _window(c, {"mode": "all", "selector": t.rank_pod(c.rank), "containerNames": [t.container],
                                      "stressors": {"cpu": {"workers": straggler_workers(c.factor, t.cpus_per_pod),
                                                            "load": 100}}})


def _io(t: ClusterTarget, selector: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    return {**spec, "mode": "all", "selector": selector, "containerNames": [t.container],
            "volumePath": t.checkpoint_path, "path": t.checkpoint_path.rstrip("/") + "/**/*", "percent": 100}


def _slow_storage(c: SlowStorageConfig, t: ClusterTarget) -> Spec:
    # Local: each checkpoint write starts delay_ms late. IOChaos delays each write call instead, so a
    # checkpoint written in many calls is slowed more: set delay_ms per call on a cluster.
    return "IOChaos", _window(c, _io(t, t.pods(), {"action": "latency", "delay": go_millis(c.delay_ms, "delay_ms"),
                                                   "methods": ["write"]}))


def _corrupt(c: CorruptConfig, t: ClusterTarget) -> Spec:
    if c.how != "flip":
        raise Unmappable("corrupt", f"how: {c.how} — IOChaos can damage bytes as they are written or read, "
                                    "not truncate or delete a file; use how: flip")
    # Rank 0 commits locally; here rank 0's pod gets one random byte wrong in every checkpoint write while
    # the object exists (the harness applies it as the checkpoint of at_step is written and deletes it once
    # committed). Which data file is damaged (file) cannot be chosen.
    return "IOChaos", _io(t, t.rank_pod(0), {"action": "mistake", "methods": ["write"],
                                             "mistake": {"filling": "random", "maxOccurrences": 1, "maxLength": 1}})


def _disk_full(c: DiskFullConfig, t: ClusterTarget) -> Spec:
    # Every pod writes to the shared checkpoint volume, as every rank writes to the local file system.
    return "IOChaos", _window(c, _io(t, t.pods(), {"action": "fault", "errno": ENOSPC, "methods": WRITE_METHODS}))


def _clock_skew(c: ClockSkewConfig, t: ClusterTarget) -> Spec:
    # TimeChaos shifts what clock_gettime returns in the container's processes (PID 1 and its children).
    c.check_fields()  # exactly one of rank and node, a nonzero offset, known clock ids
    selector = t.rank_pod(c.rank) if c.rank is not None else t.node_pods(cast(int, c.node))
    return "TimeChaos", _window(c, {"mode": "all", "selector": selector, "timeOffset": c.offset,
                                    "clockIds": list(c.clock_ids), "containerNames": [t.container]})


def _jitter(c: JitterConfig, t: ClusterTarget) -> Spec:
    raise Unmappable("jitter", "it delays the data loader inside the training process, per batch, from a seeded "
                               "distribution; Chaos Mesh acts on pods, networks and files, not on a loader (IOChaos "
                               "latency on a dataset volume would slow file reads, not batches)")


_BUILDERS: dict[str, tuple[type, Callable[[Any, ClusterTarget], Spec]]] = {
    "kill": (KillConfig, _kill), "crash": (CrashConfig, _crash), "hang": (HangConfig, _hang),
    "node_loss": (NodeLossConfig, _node_loss), "preempt": (PreemptConfig, _preempt),
    "node_join": (NodeJoinConfig, _node_join), "throttle": (ThrottleConfig, _throttle),
    "partition": (PartitionConfig, _partition), "delay": (DelayConfig, _delay),
    "straggler": (StragglerConfig, _straggler), "slow_storage": (SlowStorageConfig, _slow_storage),
    "corrupt": (CorruptConfig, _corrupt), "disk_full": (DiskFullConfig, _disk_full), "jitter": (JitterConfig, _jitter),
    "clock_skew": (ClockSkewConfig, _clock_skew),
}


def manifests(kind: str, config: Any, fault_id: int, target: ClusterTarget, run_id: str,
              occurrence: int | None = None) -> list[dict[str, Any]]:
    """The Chaos Mesh objects that inject fault ``kind`` (its scenario key) with ``config`` on ``target``.

    ``fault_id`` is the fault's index in the scenario and ``run_id`` the run's id; both name and
    label every object (see :func:`object_name`). Give ``occurrence`` when a point fault fires
    more than once, so each firing is a new object. The objects are not validated here (that needs
    the optional jsonschema and the CRDs): pass each to :func:`validate` before applying it. Raises
    :class:`Unmappable` for a fault Chaos Mesh cannot express and :class:`FaultConfigError` for
    values the mapping cannot use.
    """
    if kind not in _BUILDERS:
        raise FaultConfigError("kind", "a fault kind: " + ", ".join(_BUILDERS), kind)
    cls, build = _BUILDERS[kind]
    if not isinstance(config, cls):
        raise FaultConfigError(kind, f"a {cls.__name__}", type(config).__name__)
    chaos_kind, spec = build(config, target)
    name = object_name(target, run_id, fault_id, kind, occurrence)
    return [_object(chaos_kind, name, target, run_id, fault_id, kind, spec)]


def schedule_manifest(kind: str, config: PointFault, fault_id: int, target: ClusterTarget,
                      run_id: str) -> dict[str, Any]:
    """A Chaos Mesh Schedule that repeats a point fault every ``every_seconds``.

    The ``schedule`` is ``@every <N>s``, which Chaos Mesh's cron parser (robfig/cron v3,
    ``ParseStandard``) accepts. It is used for every period, including whole minutes,
    because a five-field cron fires at wall-clock minute boundaries (``*/5 * * * *``
    first fires anywhere 0-5 min after creation, and ``*/7`` is not even periodic across
    the hour), whereas ``@every`` keeps the local trigger's spacing. robfig counts whole
    seconds, so ``every_seconds`` must be a whole number >= 1.

    ``@every`` first fires one period after the Schedule is created, and a Schedule has
    no count: the harness creates it at ``at_time - every_seconds`` (or applies occurrence 0
    with :func:`manifests` and creates it at ``at_time``) and deletes it after ``times``
    firings. ``concurrencyPolicy: Forbid`` skips a firing while the previous one still runs,
    so a fault that lasts (a hang) must end within the period.
    """
    if not isinstance(config, PointFault) or config.at_time is None or config.every_seconds is None:
        raise FaultConfigError("every_seconds", "a point fault with at_time and every_seconds", config)
    every = config.every_seconds
    if not every >= 1 or abs(every - round(every)) > 1e-9:
        raise FaultConfigError("every_seconds", "whole seconds >= 1 (Chaos Mesh schedules count whole seconds)",
                               every)
    (chaos,) = manifests(kind, config, fault_id, target, run_id)
    spec = chaos["spec"]
    if chaos["kind"] != "PodChaos":
        raise Unmappable(kind, "a Schedule repeats faults that end by themselves; this one lasts until deleted, "
                               "so the harness must apply and delete it per occurrence instead")
    if "duration" in spec and parse_go_duration(spec["duration"]) >= every:
        raise FaultConfigError("every_seconds", f"a period longer than the fault lasts ({spec['duration']})", every)
    sched_spec = {"schedule": f"@every {round(every)}s", "type": chaos["kind"], "concurrencyPolicy": "Forbid",
                  "historyLimit": min(config.times, 100), SCHEDULE_EMBEDS[chaos["kind"]]: spec}
    return _object("Schedule", chaos["metadata"]["name"], target, run_id, fault_id, kind, sched_spec)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (a ConfigMap's files) as ``|`` blocks, readable in the printed YAML; no
    anchors and aliases (``&id001``) where objects share a part: each document stands alone."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _str)


def to_yaml(objects: Iterable[dict[str, Any]]) -> str:
    """Objects as one multi-document YAML stream that ``kubectl apply -f -`` accepts (``--dry-run`` output)."""
    return yaml.dump_all(list(objects), Dumper=_Dumper, sort_keys=False, explicit_start=True,
                         default_flow_style=False)

