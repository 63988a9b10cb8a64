"""The validator of Chaos Mesh objects (:mod:`injectors.chaosmesh.schema`): units, the CRD schemas and the webhook's
rules refuse what the cluster refuses, naming the JSON path; the CRD files themselves."""
from __future__ import annotations

import copy
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from injectors import FAULTS, FaultConfigError, HostUnsupported
from injectors.chaosmesh import schema as chaosschema
from injectors.chaosmesh.crds import CRDS_ENV, Crds, CrdUnavailable, crd_name
from injectors.chaosmesh.formats import chaos_rate_bytes, parse_go_duration
from injectors.chaosmesh.manifests import (
    ManifestInvalid,
    chaos_rate,
    go_duration,
    go_millis,
    schedule_manifest,
    straggler_workers,
    tc_rate,
    validate,
)
from injectors.network import parse_rate
from tests.crds import CRDS, SHARED_CRDS, needs_crds, needs_schema, shared_documents, stricter_podchaos, write_crds
from tests.unit.test_chaosmesh import TARGET, build, problems

# --- units -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tc, chaos", [
    ("50mbit", "6250000bps"),    # 50e6 bit/s = 6.25e6 B/s, not a multiple of 1024
    ("8mibit", "1mbps"),         # 8 * 2^20 bit/s = 2^20 B/s: Chaos Mesh's mbps is MiB/s
    ("1mbps", "1000000bps"),     # tc's mbps is 10^6 B/s; Chaos Mesh's 1mbps would be 1048576 B/s
    ("1gibit", "128mbps"),
    ("800", "100bps"),           # a bare tc number is bit/s
])
def test_rate_conversion_examples(tc: str, chaos: str) -> None:
    assert chaos_rate(tc) == chaos
    assert parse_rate(tc_rate(chaos)) == parse_rate(tc)


@given(n=st.integers(1, 10**9), unit=st.sampled_from(["bit", "kbit", "mbit", "gbit", "kibit", "mibit", "gibit",
                                                       "bps", "kbps", "mbps", "kibps", "mibps"]))
def test_rate_round_trip_from_tc(n: int, unit: str) -> None:
    bits = parse_rate(f"{n}{unit}")
    back = parse_rate(tc_rate(chaos_rate(f"{n}{unit}")))
    assert back == bits or bits % 8  # exact for a whole number of bytes/s
    assert abs(back - bits) <= 4 or (bits < 4 and back == 8)  # else the nearest byte/s, at least 1


@given(n=st.integers(0, 10**6), unit=st.sampled_from(["bps", "kbps", "mbps", "gbps", "tbps"]),
       spelled=st.sampled_from([str.lower, str.upper, lambda s: f" {s} "]))
def test_rate_round_trip_from_chaos_mesh(n: int, unit: str, spelled: Any) -> None:
    text = spelled(f"{n}{unit}")
    exact = n * 1024 ** ["bps", "kbps", "mbps", "gbps", "tbps"].index(unit)
    assert chaos_rate_bytes(text) == exact
    if exact:
        assert chaos_rate_bytes(chaos_rate(tc_rate(text))) == exact


@pytest.mark.parametrize("rate", ["50mbit", "1.5mbps", "-1bps", "+1bps", "", "mbps", "1e3bps", "99999999999999tbps"])
def test_chaos_mesh_rate_parser_refuses(rate: str) -> None:
    with pytest.raises(ValueError):
        chaos_rate_bytes(rate)


@pytest.mark.parametrize("text, seconds", [("300ms", 0.3), ("-1.5h", -5400), ("2h45m", 9900), ("1.s", 1),
                                           (".5s", 0.5), ("0", 0), ("+0", 0), ("1\u00b5s", 1e-6),
                                           ("1\u03bcs", 1e-6), ("1h1m1s1ms1us1ns", 3661.001001001)])
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "1", "s", ".s", "1d", "1 s", "--1s", "1.5.5s", "5 minutes", "1h-1m",
                                  "3000000h"])
def test_bad_go_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_go_duration(text)


@given(s=st.floats(1e-3, 1e7), ms=st.floats(1e-3, 1e7))
def test_durations_we_write_parse_back(s: float, ms: float) -> None:
    assert parse_go_duration(go_duration(s)) == pytest.approx(s, abs=5e-4)
    assert parse_go_duration(go_millis(ms, "ms")) == pytest.approx(ms / 1e3, abs=5e-7)


def test_straggler_workers_approximate_the_factor() -> None:
    assert straggler_workers(2.0, 4) == 4 and straggler_workers(1.5, 8) == 4
    assert straggler_workers(1.01, 1) == 1  # at least one worker (the webhook's rule)
    assert straggler_workers(10**6, 64) == 8192  # stress-ng's maximum
    with pytest.raises(FaultConfigError):
        straggler_workers(1.0, 4)


# --- the validator refuses what the cluster refuses --------------------------------------------------------

@needs_schema
def test_schema_errors_name_the_json_path() -> None:
    kill, = build("kill", rank=0, at_step=1)
    kill["spec"]["gracePeriod"] = "0"
    kill["spec"]["selector"]["labelSelectors"]["x"] = 3
    text = problems(kill)
    assert "$.spec.gracePeriod: '0' is not of type 'integer' (schema)" in text
    assert "$.spec.selector.labelSelectors.x" in text


@needs_schema
def test_every_problem_is_reported_at_once() -> None:
    kill, = build("kill", rank=0, at_step=1)
    kill["spec"].update(mode="sometimes", gracePeriod=-1, duration="soon")
    kill["metadata"]["name"] = "Not_A_Name"
    with pytest.raises(ManifestInvalid) as info:
        validate(kill, CRDS)
    assert len(info.value.errors) == 4 and info.value.kind == "PodChaos"


@needs_schema
def test_unknown_fields_are_refused_not_pruned() -> None:
    kill, = build("kill", rank=0, at_step=1)
    kill["spec"]["signal"] = "SIGKILL"  # PodChaos has no signal: the API server would silently drop it
    assert "'signal' was unexpected" in problems(kill)


@needs_schema
def test_container_kill_needs_container_names() -> None:
    crash, = build("crash", rank=0, at_step=1)
    del crash["spec"]["containerNames"]
    assert "$.spec.containerNames: container-kill needs containerNames (webhook)" in problems(crash)


@needs_schema
def test_direction_both_needs_a_target_unless_partition() -> None:
    slow, = build("delay", link=[0, 1], from_step=1)
    del slow["spec"]["target"]
    assert "$.spec.direction: 'both' needs a target" in problems(slow)
    cut, = build("partition", link=[0, 1], from_step=1)
    del cut["spec"]["target"]
    validate(cut, CRDS)  # the webhook lets a partition go without one


@needs_schema
def test_bandwidth_rules() -> None:
    thr, = build("throttle", link=[0, 1], rate="50mbit", from_step=1)
    for field, value, says in (("rate", "50mbit", "invalid unit"), ("limit", 0, "$.spec.bandwidth.limit"),
                               ("buffer", 2**31, "$.spec.bandwidth.buffer"), ("rate", "0bps", "0 bytes/s")):
        broken = copy.deepcopy(thr)
        broken["spec"]["bandwidth"][field] = value
        assert says in problems(broken)


@pytest.mark.parametrize("kind, fields, at, value", [
    ("hang", {"rank": 0, "at_step": 1}, ("duration",), "10 minutes"),
    ("delay", {"link": [0, 1], "from_step": 1}, ("delay", "latency"), "1h-"),
    ("slow_storage", {"from_step": 1}, ("delay",), "500"),
])
@needs_schema
def test_bad_go_durations_are_refused(kind: str, fields: dict[str, Any], at: tuple[str, ...], value: str) -> None:
    obj, = build(kind, **fields)
    node = obj["spec"]
    for key in at[:-1]:
        node = node[key]
    node[at[-1]] = value
    assert "$.spec." + ".".join(at) in problems(obj)


@needs_schema
def test_kind_specific_webhook_rules() -> None:
    hog, = build("straggler", rank=0, from_step=1)
    hog["spec"]["stressors"]["cpu"]["workers"] = 0
    assert "workers should always be positive" in problems(hog)
    del hog["spec"]["stressors"]
    assert "missing stressors" in problems(hog)
    full, = build("disk_full", from_step=1)
    full["spec"]["errno"] = 0
    assert "errno 0 is not supported" in problems(full)
    full["spec"].update(errno=28, percent=101, methods=["write", "scribble"])
    text = problems(full)
    assert "percent field should be in 0-100" in text and "'scribble'" in text
    hang, = build("hang", rank=0, at_step=1)
    del hang["spec"]["duration"]
    assert "pod-failure needs a duration" in problems(hang)
    hang["spec"].update(duration="1m", mode="fixed-percent", value="150")
    assert "$.spec.value" in problems(hang)


@needs_schema
def test_strict_schema_translates_openapi_booleans() -> None:
    sched = schedule_manifest("kill", FAULTS["kill"][0](rank=0, at_time=0, every_seconds=60, times=2), 0, TARGET, "r")
    sched["spec"]["startingDeadlineSeconds"] = 1  # exclusiveMinimum: true, minimum: 0 -> must be > 0
    validate(sched, CRDS)
    sched["spec"]["startingDeadlineSeconds"] = 0
    assert "$.spec.startingDeadlineSeconds" in problems(sched)
    sched["spec"]["startingDeadlineSeconds"] = None  # nullable: true
    validate(sched, CRDS)


@needs_schema
def test_objects_that_are_not_chaos_mesh_are_refused() -> None:
    kill, = build("kill", rank=0, at_step=1)
    assert "$.apiVersion" in problems({**kill, "apiVersion": "v1"})
    assert "$.kind" in problems({**kill, "kind": "Pod"})


# --- the CRD files, and inputs that are not objects at all -----------------------------------------------

@needs_crds
def test_crd_schema_is_the_file_and_a_copy() -> None:
    schema = CRDS.schema("NetworkChaos")
    assert schema["properties"]["spec"]["properties"]["bandwidth"]["required"] == ["buffer", "limit", "rate"]
    schema["properties"].clear()
    assert CRDS.schema("NetworkChaos")["properties"]
    with pytest.raises(ValueError):
        CRDS.schema("ChaosMonkey")


def docs(*kinds: str) -> list[dict[str, Any]]:
    return [shared_documents()[crd_name(k)] for k in kinds]


@needs_schema
def test_a_directory_of_multi_document_files_gives_crds_by_name(tmp_path: Path) -> None:
    # A release's crd.yaml: many documents in one file, not all CRDs; `kubectl get crd A B -o yaml`: one List.
    write_crds(tmp_path, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "chaos-mesh"}},
               *docs("NetworkChaos", "PodChaos"))
    write_crds(tmp_path, {"apiVersion": "v1", "kind": "List", "items": docs("IOChaos")}, name="from-kubectl.yml")
    (tmp_path / "notes.txt").write_text("not YAML: ignored")
    crds = Crds.from_dir(tmp_path)
    kill, = build("kill", rank=0, at_step=1)
    validate(kill, crds)
    validate(build("disk_full", from_time=5, duration=20)[0], crds)
    with pytest.raises(ManifestInvalid, match=re.escape("$.spec.mode")):
        validate({**kill, "spec": {**kill["spec"], "mode": "sometimes"}}, crds)  # a bad manifest is still refused
    with pytest.raises(CrdUnavailable, match="no CustomResourceDefinition stresschaos.chaos-mesh.org in "
                                             f"{re.escape(str(tmp_path))} \\(2 YAML files read\\).*kubectl get crd"):
        validate(build("straggler", rank=1, factor=3.0, from_step=6)[0], crds)


@needs_schema
def test_the_source_given_is_the_one_used_each_read_once(tmp_path: Path) -> None:
    write_crds(tmp_path, stricter_podchaos("pod-kill"))
    reads: list[str] = []
    strict = Crds.from_dir(tmp_path)
    counted = Crds("counted", lambda name: reads.append(name) or shared_documents()[name])
    kill, = build("kill", rank=0, at_step=1)
    for _ in range(3):
        validate(kill, counted)
        with pytest.raises(ManifestInvalid, match=re.escape("$.spec.action: 'pod-kill' is not one of")):
            validate(kill, strict)  # the other source's validator is not this one's: a cache per source
    assert reads == ["podchaos.chaos-mesh.org"]


@needs_crds
@pytest.mark.parametrize("change, says", [
    (lambda v: v.update(served=False), "spec.versions: expected v1alpha1 served, found ['v1alpha1 (not served)']"),
    (lambda v: v.update(name="v1beta1"), "spec.versions: expected v1alpha1 served, found ['v1beta1']"),
    (lambda v: v.pop("schema"), "spec.versions[0].schema.openAPIV3Schema: expected an object, found None"),
])
def test_a_crd_without_a_served_v1alpha1_schema_is_refused(tmp_path: Path, change: Any, says: str) -> None:
    crd = copy.deepcopy(shared_documents()["podchaos.chaos-mesh.org"])
    change(crd["spec"]["versions"][0])
    write_crds(tmp_path, crd)
    with pytest.raises(CrdUnavailable) as info:
        Crds.from_dir(tmp_path).schema("PodChaos")
    assert str(info.value) == f"directory {tmp_path}: CRD podchaos.chaos-mesh.org: {says}"


def test_a_directory_must_be_given_and_be_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CRDS_ENV, raising=False)
    assert SHARED_CRDS.parent.is_dir()  # the package never looks beside the checkout, even where the folder is
    with pytest.raises(CrdUnavailable) as info:
        Crds.from_user(None)
    message = str(info.value)
    assert "\n" not in message and "kubectl get crd podchaos.chaos-mesh.org" in message
    assert "https://mirrors.chaos-mesh.org/v2.8.0/crd.yaml" in message and "--crds DIR" in message
    with pytest.raises(CrdUnavailable, match=f"--crds: expected a directory .*'{re.escape(str(tmp_path))}/nope' "
                                             "\\(no such path\\)"):
        Crds.from_user(tmp_path / "nope")
    monkeypatch.setenv(CRDS_ENV, str(tmp_path / "file"))
    (tmp_path / "file").write_text("")
    with pytest.raises(CrdUnavailable, match=f"{CRDS_ENV}: expected a directory .*\\(not a directory\\)"):
        Crds.from_user(None)
    monkeypatch.setenv(CRDS_ENV, str(tmp_path))
    assert Crds.from_user(None).where == f"directory {tmp_path}"
    with pytest.raises(CrdUnavailable, match=f"no CustomResourceDefinition podchaos.chaos-mesh.org in "
                                             f"{re.escape(str(tmp_path))} \\(0 YAML files read\\)"):
        Crds.from_user(None).schema("PodChaos")
    with pytest.raises(CrdUnavailable, match="is not a directory"):
        Crds.from_dir(tmp_path / "gone").schema("PodChaos")  # from_dir reads nothing until it must


@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_tests_without_the_crds_fail_in_ci_and_skip_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              ci: str, outcome: type[BaseException]) -> None:
    import tests.crds

    monkeypatch.setattr(tests.crds, "SHARED_CRDS", tmp_path / "chaos-mesh-crds")
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match=re.escape(f"no Chaos Mesh CRDs at {tmp_path / 'chaos-mesh-crds'}")):
        tests.crds.require_crds()


def test_missing_jsonschema_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    kill, = build("kill", rank=0, at_step=1)
    chaosschema._validator.cache_clear()
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # makes `import jsonschema` fail
    try:
        with pytest.raises(HostUnsupported, match=re.escape("pip install 'baft-harness[k8s]'")):
            validate(kill, CRDS)
    finally:
        chaosschema._validator.cache_clear()


@needs_schema
def test_garbage_is_refused_not_crashed_on() -> None:
    kill, = build("kill", rank=0, at_step=1)
    for spec in ({"action": ["pod-kill"], "mode": "all", "selector": {}},
                 {"action": "partition", "target": [], "direction": {}, "mode": 1},
                 {"action": "fault", "methods": [{}], "percent": "all", "stressors": [], "bandwidth": {"rate": 5}},
                 {"schedule": 7, "type": ["PodChaos"]}):
        for kind in ("PodChaos", "NetworkChaos", "IOChaos", "StressChaos", "Schedule"):
            garbage = {**kill, "kind": kind, "spec": spec, "metadata": {"name": "x", "labels": ["a"]}}
            with pytest.raises(ManifestInvalid):
                validate(garbage, CRDS)
    with pytest.raises(ManifestInvalid):
        validate([kill], CRDS)  # type: ignore[arg-type]


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                      max_size=3), max_leaves=8)
spec_keys = st.sampled_from(["action", "mode", "value", "selector", "duration", "direction", "target", "delay",
                             "bandwidth", "stressors", "stressngStressors", "errno", "percent", "methods", "mistake",
                             "containerNames", "schedule", "type", "podChaos", "externalTargets", "loss",
                             "timeOffset", "clockIds"])


@needs_schema
@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(["PodChaos", "NetworkChaos", "StressChaos", "IOChaos", "TimeChaos", "Schedule"]),
       spec=st.dictionaries(spec_keys, json_values, max_size=8), meta=st.dictionaries(
           st.sampled_from(["name", "namespace", "labels"]), json_values, max_size=3))
def test_validate_only_ever_raises_manifest_invalid(kind: str, spec: dict[str, Any], meta: dict[str, Any]) -> None:
    try:
        validate({"apiVersion": "chaos-mesh.org/v1alpha1", "kind": kind, "metadata": meta, "spec": spec}, CRDS)
    except ManifestInvalid as e:
        assert e.errors and all(line.startswith("$") for line in e.errors)
