"""Fault configs as Chaos Mesh objects, checked against the real CRD schemas and the webhook's rules."""
from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from injectors import FAULTS, FaultConfigError, HostUnsupported, RunShape, WorkerContext
from injectors.chaosmesh.formats import check_cron, is_dns_label
from injectors.chaosmesh.manifests import (
    ClusterTarget,
    ManifestInvalid,
    Unmappable,
    manifests,
    object_name,
    schedule_manifest,
    to_yaml,
    validate,
)
from injectors.chaosmesh.schema import CLOCK_IDS
from injectors.clock import ClockSkewInjector
from tests.crds import CRDS, needs_schema

# jsonschema is optional (the k8s extra) and the CRDs live outside the repository (tests.crds): the validating
# tests are marked; the mapping, unit and name tests below run everywhere.

ROOT = Path(__file__).resolve().parents[2]
TARGET = ClusterTarget(namespace="train", selector={"training.kubeflow.org/job-name": "gpt"})
JOB = {"training.kubeflow.org/job-name": "gpt"}
IDX = "training.kubeflow.org/replica-index"

#: One typical config per registered fault kind, and what it must become.
EXAMPLES: dict[str, tuple[dict[str, Any], str, str | None]] = {
    "kill": ({"rank": 1, "at_step": 3}, "PodChaos", "pod-kill"),
    "crash": ({"rank": 1, "at_step": 3, "how": "segfault"}, "PodChaos", "container-kill"),
    "hang": ({"rank": 2, "at_step": 3}, "PodChaos", "pod-failure"),
    "node_loss": ({"node": 1, "at_step": 3}, "PodChaos", "pod-kill"),
    "preempt": ({"node": 1, "at_step": 3, "grace_s": 20}, "PodChaos", "pod-kill"),
    "throttle": ({"link": ["node0", "node1"], "rate": "50mbit", "from_step": 5}, "NetworkChaos", "bandwidth"),
    "partition": ({"link": ["node0", "node1"], "from_step": 10, "duration": 8}, "NetworkChaos", "partition"),
    "delay": ({"link": [0, 1], "ms": 10, "from_step": 2}, "NetworkChaos", "delay"),
    "straggler": ({"rank": 1, "factor": 3.0, "from_step": 6, "to_step": 14}, "StressChaos", None),
    "slow_storage": ({"delay_ms": 400, "from_step": 4}, "IOChaos", "latency"),
    "corrupt": ({"at_step": 12, "how": "flip"}, "IOChaos", "mistake"),
    "disk_full": ({"from_time": 5, "duration": 20}, "IOChaos", "fault"),
    "jitter": ({"ranks": [0], "from_step": 8}, "", None),
    "node_join": ({"node": 1, "at_step": 14}, "", None),
    "clock_skew": ({"rank": 1, "offset": "-10m", "from_time": 5, "duration": 30}, "TimeChaos", None),
}
MAPPABLE = sorted(k for k in EXAMPLES if k not in ("jitter", "node_join"))


def build(kind: str, **fields: Any) -> list[dict[str, Any]]:
    return manifests(kind, FAULTS[kind][0](**fields), 7, TARGET, "run-1")


def problems(obj: dict[str, Any]) -> str:
    with pytest.raises(ManifestInvalid) as info:
        validate(obj, CRDS)
    return str(info.value)


def breakages(obj: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """Copies of ``obj``, each broken in one way the cluster refuses, with the JSON path the error must name."""
    out = []
    for mutate, path in ((lambda s: s.__setitem__("mode", "sometimes"), "$.spec.mode"),
                         (lambda s: s.__setitem__("selector", "gpt"), "$.spec.selector"),
                         (lambda s: s.__setitem__("sigal", "SIGKILL"), "$.spec"),
                         (lambda s: s.__setitem__("duration", "5 minutes"), "$.spec.duration")):
        broken = copy.deepcopy(obj)
        mutate(broken["spec"])
        out.append((broken, path))
    return out


def test_examples_cover_the_registry() -> None:
    # A new fault kind must be given a mapping (or a reason it has none) here.
    assert set(EXAMPLES) == set(FAULTS)


@needs_schema
@pytest.mark.parametrize("kind", MAPPABLE)
def test_every_mappable_kind_validates_against_the_real_crds(kind: str) -> None:
    fields, chaos_kind, action = EXAMPLES[kind]
    objs = build(kind, **fields)
    assert len(objs) == 1
    obj = objs[0]
    validate(obj, CRDS)
    assert obj["apiVersion"] == "chaos-mesh.org/v1alpha1" and obj["kind"] == chaos_kind
    assert obj["spec"].get("action") == action
    assert obj["metadata"]["namespace"] == "train"
    assert obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "baft-harness", "baft.dev/run": "run-1",
                                         "baft.dev/fault": "7", "baft.dev/fault-kind": kind}
    assert obj["metadata"]["name"] == f"baft-run-1-7-{kind.replace('_', '-')}"
    for broken, path in breakages(obj):
        assert path in problems(broken)


def test_the_mapping_table() -> None:
    kill, = build("kill", rank=5, at_step=1)
    assert kill["spec"] == {"action": "pod-kill", "mode": "all", "gracePeriod": 0,
                            "selector": {"namespaces": ["train"], "labelSelectors": {**JOB, IDX: "5"},
                                         "podPhaseSelectors": ["Running"]}}
    term, = build("kill", rank=0, at_step=1, signal="SIGTERM")
    assert term["spec"]["gracePeriod"] == 30
    crash, = build("crash", rank=1, at_step=1, how="abort")
    assert crash["spec"]["containerNames"] == ["pytorch"]
    hang, = build("hang", rank=1, at_step=1)
    assert hang["spec"]["duration"] == "10m"
    lost, = build("node_loss", node=2, at_step=1)
    assert lost["spec"]["mode"] == "all" and lost["spec"]["selector"]["labelSelectors"][IDX] == "2"
    cut, = build("partition", link=["node0", "node2"], side="node0", from_step=1)
    assert cut["spec"]["direction"] == "both"
    assert cut["spec"]["selector"]["labelSelectors"][IDX] == "0"
    assert cut["spec"]["target"]["selector"]["labelSelectors"][IDX] == "2"
    slow, = build("delay", link=[0, 1], ms=2.5, from_step=1)
    assert slow["spec"]["delay"]["latency"] == "2500us" and slow["spec"]["direction"] == "both"
    thr, = build("throttle", link=[0, 1], rate="100mbit", from_step=1)
    bw = thr["spec"]["bandwidth"]
    assert bw["rate"] == "12500000bps" and bw["buffer"] == 125000 and bw["limit"] == 125000 + 625000
    assert thr["spec"]["target"]["selector"]["labelSelectors"][IDX] == "1"
    hog, = build("straggler", rank=1, factor=3.0, from_step=1)
    assert hog["spec"]["stressors"] == {"cpu": {"workers": 2, "load": 100}}
    full, = build("disk_full", from_step=1)
    assert full["spec"]["errno"] == 28 and "read" not in full["spec"]["methods"]
    assert full["spec"]["volumePath"] == "/checkpoints" and full["spec"]["selector"]["labelSelectors"] == JOB
    bad, = build("corrupt", at_step=1)
    assert bad["spec"]["mistake"] == {"filling": "random", "maxOccurrences": 1, "maxLength": 1}
    assert bad["spec"]["selector"]["labelSelectors"][IDX] == "0"
    late, = build("slow_storage", delay_ms=400, from_step=1)
    assert late["spec"]["delay"] == "400ms"


def test_ranks_share_a_pod_and_nodes_use_their_label() -> None:
    target = ClusterTarget(namespace="t", selector={"jobset.sigs.k8s.io/jobset-name": "gpt"},
                           rank_label="jobset.sigs.k8s.io/job-index", node_label="baft.dev/node", ranks_per_pod=4)
    kill, = manifests("kill", FAULTS["kill"][0](rank=5, at_step=1), 0, target, "r")
    assert kill["spec"]["selector"]["labelSelectors"]["jobset.sigs.k8s.io/job-index"] == "1"
    lost, = manifests("node_loss", FAULTS["node_loss"][0](node=3, at_step=1), 0, target, "r")
    assert lost["spec"]["selector"]["labelSelectors"] == {"jobset.sigs.k8s.io/jobset-name": "gpt", "baft.dev/node": "3"}
    assert ClusterTarget(namespace="t", selector=JOB).node_label == IDX


@needs_schema
def test_a_preemption_deletes_the_pods_with_its_grace_period() -> None:
    node, = build("preempt", node=2, at_step=1, grace_s=12.5)
    assert node["spec"]["gracePeriod"] == 13  # whole seconds, never shorter than asked
    assert node["spec"]["selector"]["labelSelectors"][IDX] == "2"
    target = ClusterTarget(namespace="t", selector=JOB, ranks_per_pod=2)
    one, = manifests("preempt", FAULTS["preempt"][0](ranks=[2, 3], at_step=1), 0, target, "r")
    assert one["spec"]["selector"]["labelSelectors"][IDX] == "1" and one["spec"]["gracePeriod"] == 30
    two, = manifests("preempt", FAULTS["preempt"][0](ranks=[0, 5], at_step=1, grace_s=0), 0, target, "r")
    assert two["spec"]["selector"]["expressionSelectors"] == [{"key": IDX, "operator": "In", "values": ["0", "2"]}]
    assert IDX not in two["spec"]["selector"]["labelSelectors"] and two["spec"]["gracePeriod"] == 0
    for obj in (node, one, two):
        validate(obj, CRDS)


def test_window_duration_only_when_the_window_has_seconds() -> None:
    steps, = build("partition", link=[0, 1], from_step=2, to_step=9)
    assert "duration" not in steps["spec"]
    open_ended, = build("partition", link=[0, 1], from_time=3.0)
    assert "duration" not in open_ended["spec"]
    timed, = build("partition", link=[0, 1], from_time=3.0, duration=1.25)
    assert timed["spec"]["duration"] == "1250ms"
    step_then_time, = build("straggler", rank=0, from_step=2, duration=60)
    assert step_then_time["spec"]["duration"] == "60s"


@pytest.mark.parametrize("kind, fields, says", [
    ("jitter", {"from_step": 1}, "data loader"),
    ("node_join", {"node": 1, "at_step": 1}, "scales it back up"),
    ("kill", {"rank": 0, "at_step": 1, "signal": "SIGINT"}, "SIGINT"),
    ("node_loss", {"node": 1, "at_step": 1, "replacement": False}, "replacement"),
    ("preempt", {"node": 1, "at_step": 1, "restart": False}, "restart"),
    ("corrupt", {"at_step": 1, "how": "truncate"}, "truncate"),
])
def test_unmappable_faults_say_why(kind: str, fields: dict[str, Any], says: str) -> None:
    with pytest.raises(Unmappable) as info:
        build(kind, **fields)
    assert info.value.kind == kind and says in str(info.value)


def test_a_config_of_the_wrong_kind_is_refused() -> None:
    with pytest.raises(FaultConfigError):
        manifests("kill", FAULTS["crash"][0](rank=0, at_step=1), 0, TARGET, "r")
    with pytest.raises(FaultConfigError):
        manifests("reboot", FAULTS["kill"][0](rank=0, at_step=1), 0, TARGET, "r")


# --- hypothesis: any valid config gives objects the cluster accepts -------------------------------------

label_text = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", fullmatch=True)
rates = st.builds(lambda n, u: f"{n}{u}", st.integers(1, 10**6), st.sampled_from(
    ["bit", "kbit", "mbit", "gbit", "kibit", "mibit", "bps", "kbps", "mbps", "kibps"]))
ranks, nodes = st.integers(0, 63), st.integers(0, 15)
seconds = st.floats(0.001, 86400, allow_nan=False)
windows = st.one_of(
    st.builds(lambda a, b: {"from_step": a, "to_step": a + b}, st.integers(0, 1000), st.integers(1, 100)),
    st.builds(lambda a: {"from_step": a}, st.integers(0, 1000)),
    st.builds(lambda t, d: {"from_time": t, "duration": d}, st.floats(0, 1e4), seconds),
    st.builds(lambda t: {"from_time": t}, st.floats(0, 1e4)))
points = st.one_of(
    st.builds(lambda s, e, n: {"at_step": s, "every": e, "times": n}, st.integers(0, 1000), st.integers(1, 50),
              st.integers(1, 10)),
    st.builds(lambda t: {"at_time": t}, st.floats(0, 1e4)),
    st.builds(lambda m, s: {"mtbf": m, "seed": s, "times": 3}, st.floats(0.1, 1e4), st.integers(0, 2**31)))

offsets = st.builds(lambda sign, terms: sign + "".join(terms), st.sampled_from(["", "-", "+"]), st.lists(st.builds(
    "{}{}".format, st.integers(1, 10**6), st.sampled_from(["ns", "us", "ms", "s", "m", "h"])), min_size=1, max_size=2))


@st.composite
def links(draw: st.DrawFn) -> dict[str, Any]:
    a, b = draw(st.lists(nodes, min_size=2, max_size=2, unique=True))
    return {"link": [draw(st.sampled_from([a, f"node{a}"])), draw(st.sampled_from([b, f"node{b}"]))]}


FIELDS: dict[str, Any] = {
    "kill": st.builds(lambda r, s, p: {"rank": r, "signal": s, **p}, ranks, st.sampled_from(["SIGKILL", "SIGTERM"]),
                      points),
    "crash": st.builds(lambda r, h, p: {"rank": r, "how": h, **p}, ranks,
                       st.sampled_from(["segfault", "abort", "exit", "exception"]), points),
    "hang": st.builds(lambda r, p: {"rank": r, **p}, ranks, points),
    "node_loss": st.builds(lambda n, p: {"node": n, **p}, nodes, points),
    "preempt": st.builds(lambda who, g, p: {**who, "grace_s": g, **p},
                         st.one_of(nodes.map(lambda n: {"node": n}),
                                   st.lists(ranks, min_size=1, max_size=6, unique=True).map(lambda r: {"ranks": r})),
                         st.floats(0, 3600), points),
    "throttle": st.builds(lambda lk, r, b, w: {**lk, "rate": r, "burst": b, **w}, links(), rates,
                          st.one_of(st.none(), st.integers(1600, 10**9).map(str)), windows),
    "partition": st.builds(lambda lk, i, w: {**lk, "side": lk["link"][i], **w}, links(), st.integers(0, 1), windows),
    "delay": st.builds(lambda lk, ms, w: {**lk, "ms": ms, **w}, links(), st.floats(0.001, 1e5), windows),
    "straggler": st.builds(lambda r, f, w: {"rank": r, "factor": f, **w}, ranks, st.floats(1.001, 64), windows),
    "slow_storage": st.builds(lambda d, w: {"delay_ms": d, **w}, st.floats(0.001, 1e6), windows),
    "corrupt": st.builds(lambda f, p: {"file": f, **p}, st.integers(0, 10), points),
    "disk_full": st.builds(lambda m, w: {"size_mb": m, **w}, st.integers(1, 10**5), windows),
    "clock_skew": st.builds(lambda who, off, ids, w: {**who, "offset": off, "clock_ids": ids, **w},
                            st.one_of(ranks.map(lambda r: {"rank": r}), nodes.map(lambda n: {"node": n})), offsets,
                            st.lists(st.sampled_from(CLOCK_IDS), min_size=1, max_size=4, unique=True), windows),
}
targets = st.builds(
    lambda ns, job, rpp, cpus, prefix: ClusterTarget(namespace=ns, selector={"app": job}, ranks_per_pod=rpp,
                                                     cpus_per_pod=cpus, name_prefix=prefix),
    st.from_regex(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True), label_text, st.integers(1, 8),
    st.integers(1, 256), st.from_regex(r"[a-z]([-a-z0-9]{0,18}[a-z0-9])?", fullmatch=True))


@needs_schema
@settings(max_examples=300, deadline=None)
@given(data=st.data(), kind=st.sampled_from(sorted(FIELDS)), target=targets, run_id=label_text,
       fault_id=st.integers(0, 10**6), occurrence=st.one_of(st.none(), st.integers(0, 10**4)))
def test_generated_configs_always_give_valid_objects(data: st.DataObject, kind: str, target: ClusterTarget,
                                                     run_id: str, fault_id: int, occurrence: int | None) -> None:
    config = FAULTS[kind][0](**data.draw(FIELDS[kind]))
    for obj in manifests(kind, config, fault_id, target, run_id, occurrence):
        validate(obj, CRDS)  # must not raise
        name = obj["metadata"]["name"]
        assert is_dns_label(name) and len(name) <= 63
        assert obj["metadata"]["labels"]["baft.dev/run"] == run_id
        for broken, path in breakages(obj):  # a validator that accepted everything fails here
            assert path in problems(broken)


# --- Schedule ----------------------------------------------------------------------------------------------

def periodic(kind: str, every: float, **fields: Any) -> Any:
    return FAULTS[kind][0](at_time=30, every_seconds=every, times=5, **fields)


@needs_schema
def test_schedule_of_a_periodic_kill() -> None:
    sched = schedule_manifest("kill", periodic("kill", 7, rank=1), 2, TARGET, "run-1")
    validate(sched, CRDS)
    assert sched["kind"] == "Schedule" and sched["spec"]["schedule"] == "@every 7s"
    assert sched["spec"]["type"] == "PodChaos" and sched["spec"]["podChaos"]["action"] == "pod-kill"
    assert sched["spec"]["concurrencyPolicy"] == "Forbid" and sched["spec"]["historyLimit"] == 5
    for broken_cron in ("every 7s", "@every 7", "*/7 * * *", "61 * * * *"):
        broken = copy.deepcopy(sched)
        broken["spec"]["schedule"] = broken_cron
        assert "$.spec.schedule" in problems(broken)
    del sched["spec"]["podChaos"]
    assert "needs its podChaos spec" in problems(sched)


@needs_schema
def test_schedule_checks_the_embedded_spec_with_the_webhook_rules() -> None:
    sched = schedule_manifest("crash", periodic("crash", 60, rank=1), 2, TARGET, "run-1")
    validate(sched, CRDS)
    del sched["spec"]["podChaos"]["containerNames"]
    assert "$.spec.podChaos.containerNames" in problems(sched)


@needs_schema
def test_schedule_limits() -> None:
    with pytest.raises(FaultConfigError):
        schedule_manifest("kill", periodic("kill", 7.5, rank=1), 0, TARGET, "r")  # robfig counts whole seconds
    with pytest.raises(FaultConfigError):
        schedule_manifest("kill", FAULTS["kill"][0](rank=1, at_step=3, every=2, times=3), 0, TARGET, "r")
    with pytest.raises(FaultConfigError):  # a 10 min hang cannot repeat every 5 min
        schedule_manifest("hang", periodic("hang", 300, rank=1), 0, TARGET, "r")
    validate(schedule_manifest("hang", periodic("hang", 3600, rank=1), 0, TARGET, "r"), CRDS)
    with pytest.raises(Unmappable):
        schedule_manifest("corrupt", FAULTS["corrupt"][0](at_time=1, every_seconds=60, times=2), 0, TARGET, "r")


@pytest.mark.parametrize("spec", ["@every 7s", "@every 1h30m", "@hourly", "*/5 * * * *", "0 9-17/2 * jan-jun mon-fri",
                                  "TZ=UTC 0 0 1 * *", "? * * * *"])
def test_cron_accepted(spec: str) -> None:
    check_cron(spec)


# --- clock skew (TimeChaos) ---------------------------------------------------------------------------------

@needs_schema
def test_clock_skew_maps_to_time_chaos_and_bad_values_are_refused() -> None:
    skew, = build("clock_skew", node=2, offset="1h30m", clock_ids=["CLOCK_REALTIME", "CLOCK_MONOTONIC"], from_time=0,
                  duration=90)
    validate(skew, CRDS)
    assert skew["spec"] == {"mode": "all", "selector": {"namespaces": ["train"], "labelSelectors": {**JOB, IDX: "2"},
                                                         "podPhaseSelectors": ["Running"]},
                            "timeOffset": "1h30m", "clockIds": ["CLOCK_REALTIME", "CLOCK_MONOTONIC"],
                            "containerNames": ["pytorch"], "duration": "90s"}
    for field, value, says in (("timeOffset", "10 minutes", "$.spec.timeOffset: parse timeOffset"),
                               ("timeOffset", 600, "$.spec.timeOffset"), ("clockIds", ["CLOCK_TAI"], "$.spec.clockIds"),
                               ("clockIds", "CLOCK_REALTIME", "$.spec.clockIds")):
        assert says in problems({**skew, "spec": {**skew["spec"], field: value}})


@pytest.mark.parametrize("fields, field", [
    ({"rank": 0, "offset": "10 min"}, "offset"), ({"rank": 0, "offset": "0s"}, "offset"),
    ({"rank": 0, "offset": "-0"}, "offset"), ({"rank": 0, "offset": "5s", "clock_ids": ["CLOCK_TAI"]}, "clock_ids"),
    ({"rank": 0, "offset": "5s", "clock_ids": []}, "clock_ids"), ({"offset": "5s"}, "rank"),
    ({"rank": 0, "node": 0, "offset": "5s"}, "rank"), ({"rank": 9, "offset": "5s"}, "rank"),
])
def test_clock_skew_config_is_checked(fields: dict[str, Any], field: str) -> None:
    config = FAULTS["clock_skew"][0](from_time=1, **fields)
    with pytest.raises(FaultConfigError) as info:
        config.check(RunShape(world_size=4, steps=10, nodes=2))
    assert info.value.field == field


def test_clock_skew_refuses_to_run_locally(tmp_path: Path) -> None:
    config = FAULTS["clock_skew"][0](rank=0, offset="-10m", from_step=1)
    config.check(RunShape(world_size=2, steps=10, nodes=1))
    for refuse in (config.preflight, ClockSkewInjector(config, 0, WorkerContext(
            rank=0, fault_dir=tmp_path, record=lambda *a, **k: None)).begin):
        with pytest.raises(HostUnsupported, match=re.escape("runs only on a cluster: baft run SCENARIO --target k8s")):
            refuse()


# --- names, targets, YAML, CRD files ---------------------------------------------------------------------------

@given(run_id=label_text, fault_id=st.integers(0, 10**9), occurrence=st.one_of(st.none(), st.integers(0, 10**9)))
def test_names_are_dns_labels_for_any_run_id(run_id: str, fault_id: int, occurrence: int | None) -> None:
    name = object_name(TARGET, run_id, fault_id, "slow_storage", occurrence)
    assert is_dns_label(name) and len(name) <= 63
    assert name.startswith("baft-") and name.endswith(f"-{fault_id}-slow-storage"
                                                      + (f"-{occurrence}" if occurrence is not None else ""))


def test_long_run_ids_are_cut_but_stay_distinct() -> None:
    a, b = "x" * 62 + "a", "x" * 62 + "b"
    na, nb = object_name(TARGET, a, 12, "node_loss"), object_name(TARGET, b, 12, "node_loss")
    assert len(na) == len(nb) == 63 and na != nb and na.endswith("-12-node-loss")
    assert object_name(TARGET, "Run_1", 0, "kill") == "baft-run-1-0-kill"


@pytest.mark.parametrize("run_id", ["", "-run", "run!", "x" * 64, "a b"])
def test_run_ids_that_cannot_label_are_refused(run_id: str) -> None:
    with pytest.raises(FaultConfigError) as info:
        object_name(TARGET, run_id, 0, "kill")
    assert info.value.field == "run_id"


@pytest.mark.parametrize("field, value", [
    ("namespace", "Train"), ("namespace", "a_b"), ("namespace", "n" * 64), ("selector", {}),
    ("selector", {"app": "bad value"}), ("rank_label", "app"), ("rank_label", "bad key/"), ("node_label", "-x"),
    ("container", "PyTorch"), ("name_prefix", "p" * 21), ("checkpoint_path", "checkpoints"),
    ("checkpoint_path", "/ckpt/*"), ("ranks_per_pod", 0), ("cpus_per_pod", True), ("hang_duration", "10 minutes"),
    ("hang_duration", "0s"), ("term_grace_seconds", -1),
])
def test_cluster_target_validation(field: str, value: Any) -> None:
    fields: dict[str, Any] = {"namespace": "train", "selector": {"app": "gpt"}, field: value}
    with pytest.raises(FaultConfigError) as info:
        ClusterTarget(**fields)
    assert info.value.field == field and info.value.found == value


@needs_schema
def test_to_yaml_round_trips_and_is_multi_document() -> None:
    objs = [o for kind in MAPPABLE for o in build(kind, **EXAMPLES[kind][0])]
    text = to_yaml(objs)
    assert text.startswith("---\n") and text.count("\n---\n") == len(objs) - 1
    back = list(yaml.safe_load_all(text))
    assert back == objs
    for obj in back:
        validate(obj, CRDS)


@needs_schema
def test_every_ci_scenario_fault_maps_or_says_why() -> None:
    seen = 0
    for path in sorted((ROOT / "scenarios" / "ci").glob("*.yaml")):
        for i, entry in enumerate(yaml.safe_load(path.read_text()).get("faults") or []):
            (kind, fields), = entry.items()
            config = FAULTS[kind][0](**fields)
            try:
                objs = manifests(kind, config, i, TARGET, path.stem[:40])
            except Unmappable as e:
                assert kind in ("jitter", "node_join") or (kind == "node_loss" and not fields.get("replacement", True)) \
                    or (kind == "preempt" and not fields.get("restart", True)), e
                continue
            for obj in objs:
                validate(obj, CRDS)
                seen += 1
    assert seen >= 20
