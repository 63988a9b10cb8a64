"""A timed sequence of faults as one Chaos Mesh Workflow, checked against the real CRD and the webhook's rules."""
from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from injectors import FAULTS, FaultConfigError, WindowFault
from injectors.chaosmesh.formats import is_dns_label, parse_go_duration
from injectors.chaosmesh.manifests import ClusterTarget, ManifestInvalid, Unmappable, object_name, validate
from injectors.chaosmesh.schema import WORKFLOW_EMBEDS
from injectors.chaosmesh.workflow import ENTRY, MAX_TEMPLATE_NAME, POINT_DEADLINE, workflow_manifest
from tests.crds import CRDS, needs_crds, needs_schema
from tests.unit.test_chaosmesh import FIELDS, JOB, TARGET, label_text, problems, targets

TRIGGERS = {"at_step", "every", "times", "at_time", "every_seconds", "mtbf", "seed", "from_step", "to_step",
            "from_time", "duration"}
#: Every kind a Workflow can time (corrupt waits for a checkpoint phase; jitter has no mapping at all).
TIMED = sorted(k for k in FIELDS if k != "corrupt")
starts = st.one_of(st.just(0.0), st.floats(0, 1e4))
#: Deadlines are whole milliseconds, rounded to the nearest (half to even: 62.5 ms is "62ms"), so a deadline is
#: off by at most half a millisecond, that bound included, plus the float error of seconds -> ms.
HALF_MS = 5e-4 + 1e-9


def fault(kind: str, **fields: Any) -> Any:
    return FAULTS[kind][0](**fields)


@st.composite
def timed_faults(draw: st.DrawFn, kind: str) -> Any:
    """A config of ``kind`` (fields drawn as test_chaosmesh draws them) with a time trigger instead of its own."""
    fields = {k: v for k, v in draw(FIELDS[kind]).items() if k not in TRIGGERS}
    if issubclass(FAULTS[kind][0], WindowFault):
        return fault(kind, **fields, from_time=draw(starts), duration=draw(st.floats(0.001, 86400)))
    times = draw(st.integers(1, 4))
    period = draw(st.floats(601, 7200) if kind == "hang" else st.floats(0.5, 3600))  # a hang lasts 10m
    repeat = {"every_seconds": period, "times": times} if times > 1 else {}
    return fault(kind, **fields, at_time=draw(starts), **repeat)


@st.composite
def fault_lists(draw: st.DrawFn) -> list[tuple[int, str, Any]]:
    kinds = draw(st.lists(st.sampled_from(TIMED), min_size=1, max_size=6))
    ids = draw(st.lists(st.integers(0, 10**6), min_size=len(kinds), max_size=len(kinds), unique=True))
    return [(i, kind, draw(timed_faults(kind))) for i, kind in zip(ids, kinds)]


def expected_timing(kind: str, config: Any, target: ClusterTarget) -> list[tuple[float, float]]:
    """(start, how long the chaos object lives) of each occurrence, in seconds."""
    if isinstance(config, WindowFault):
        return [(config.from_time, config.duration)]
    lasts = parse_go_duration(target.hang_duration if kind == "hang" else POINT_DEADLINE)
    return [(t, lasts) for t in config.time_occurrences()]


def by_name(wf: dict[str, Any]) -> dict[str, tuple[int, dict[str, Any]]]:
    return {t["name"]: (i, t) for i, t in enumerate(wf["spec"]["templates"])}


def broken_copies(wf: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """Copies of a generated Workflow, each broken in one way the cluster refuses, with the path the error names."""
    last = len(wf["spec"]["templates"]) - 1
    chaos = wf["spec"]["templates"][last]
    parent, serial = next((i, t) for i, t in enumerate(wf["spec"]["templates"])
                          if chaos["name"] in t.get("children", []))
    out = []
    for mutate, path in (
            (lambda s: s["templates"].pop(), f"$.spec.templates[{parent}].children[{len(serial['children']) - 1}]"),
            (lambda s: s["templates"][-1].__setitem__("name", ENTRY), "template name must be unique"),
            (lambda s: s["templates"][-1].__setitem__("deadline", "soon"), f"$.spec.templates[{last}].deadline"),
            (lambda s: s.__setitem__("entry", "nope"), "$.spec.entry: can not find a template"),
            (lambda s: s["templates"][-1][WORKFLOW_EMBEDS[chaos["templateType"]]].__setitem__("duration", "5s"),
             "should not define duration in chaos when using Workflow"),
            (lambda s: s["templates"][-1].__setitem__("templateType", "Chaos"),
             f"$.spec.templates[{last}].templateType"),
    ):
        broken = copy.deepcopy(wf)
        mutate(broken["spec"])
        out.append((broken, path))
    return out


# --- generated: any time-triggered faults give a Workflow the cluster accepts, with the right timing -----------

@needs_schema
@settings(max_examples=120, deadline=None)
@given(faults=fault_lists(), target=targets, run_id=label_text)
def test_generated_fault_lists_give_valid_workflows_with_the_right_timing(
        faults: list[tuple[int, str, Any]], target: ClusterTarget, run_id: str) -> None:
    wf = workflow_manifest(faults, target, run_id)
    validate(wf, CRDS)  # must not raise
    assert wf["metadata"]["name"] == object_name(target, run_id, None, "workflow")
    named = by_name(wf)
    assert len(named) == len(wf["spec"]["templates"])  # unique
    assert all(is_dns_label(n) and len(n) <= MAX_TEMPLATE_NAME for n in named)
    branches = []
    for fault_id, kind, config in faults:
        for k, (start, lasts) in enumerate(expected_timing(kind, config, target)):
            branch = f"f{fault_id}-{kind.replace('_', '-')}-{k}"
            branches.append(branch)
            _, serial = named[branch]
            assert serial["templateType"] == "Serial"
            *wait, (_, chaos) = [named[c] for c in serial["children"]]
            if wait:
                assert wait[0][1]["templateType"] == "Suspend"
                assert parse_go_duration(wait[0][1]["deadline"]) == pytest.approx(start, abs=HALF_MS)
            else:
                assert start <= HALF_MS
            assert parse_go_duration(chaos["deadline"]) == pytest.approx(lasts, abs=HALF_MS)
            embedded = chaos[WORKFLOW_EMBEDS[chaos["templateType"]]]
            assert "duration" not in embedded and embedded["selector"]["namespaces"] == [target.namespace]
    assert named[ENTRY][1] == {"name": ENTRY, "templateType": "Parallel", "children": branches}
    assert len(named) == 1 + len(branches) * 2 + sum(len(named[b][1]["children"]) - 1 for b in branches)
    for broken, path in broken_copies(wf):  # a validator that accepted everything fails here
        assert path in problems(broken)


# --- one worked example ----------------------------------------------------------------------------------------

@needs_schema
def test_a_sequence_of_kill_hang_partition_and_clock_skew() -> None:
    wf = workflow_manifest([
        (0, "kill", fault("kill", rank=1, at_time=30, every_seconds=60, times=2)),
        (1, "hang", fault("hang", rank=0, at_time=0)),
        (4, "partition", fault("partition", link=[0, 1], from_time=12.5, duration=20)),
        (5, "clock_skew", fault("clock_skew", node=1, offset="-5m", from_time=0, duration=60)),
    ], TARGET, "run-1")
    validate(wf, CRDS)
    assert wf["metadata"] == {"name": "baft-run-1-workflow", "namespace": "train", "labels": {
        "app.kubernetes.io/managed-by": "baft-harness", "baft.dev/run": "run-1", "baft.dev/fault-kind": "workflow"}}
    named = {t["name"]: t for t in wf["spec"]["templates"]}
    assert named[ENTRY]["children"] == ["f0-kill-0", "f0-kill-1", "f1-hang-0", "f4-partition-0", "f5-clock-skew-0"]
    assert named["f0-kill-1"]["children"] == ["f0-kill-1-wait", "f0-kill-1-chaos"]
    assert named["f0-kill-1-wait"] == {"name": "f0-kill-1-wait", "templateType": "Suspend", "deadline": "90s"}
    assert named["f0-kill-1-chaos"]["deadline"] == POINT_DEADLINE
    assert named["f0-kill-1-chaos"]["podChaos"] == {"action": "pod-kill", "mode": "all", "gracePeriod": 0,
                                                    "selector": {"namespaces": ["train"], "labelSelectors": {
                                                        **JOB, "training.kubeflow.org/replica-index": "1"},
                                                        "podPhaseSelectors": ["Running"]}}
    assert named["f1-hang-0"]["children"] == ["f1-hang-0-chaos"]  # at 0: no Suspend
    assert named["f1-hang-0-chaos"]["deadline"] == "10m" and "duration" not in named["f1-hang-0-chaos"]["podChaos"]
    assert named["f4-partition-0-wait"]["deadline"] == "12500ms" and named["f4-partition-0-chaos"]["deadline"] == "20s"
    assert named["f5-clock-skew-0-chaos"]["templateType"] == "TimeChaos"
    assert named["f5-clock-skew-0-chaos"]["timeChaos"]["timeOffset"] == "-5m"
    assert named["f0-kill-0-chaos"]["podChaos"] is not named["f0-kill-1-chaos"]["podChaos"]  # no YAML aliases


# --- what a Workflow cannot time -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, fields, says", [
    ("kill", {"rank": 0, "at_step": 3}, "not the job's steps"),
    ("partition", {"link": [0, 1], "from_step": 3, "duration": 5}, "not the job's steps"),
    ("partition", {"link": [0, 1], "from_time": 3}, "give duration"),
    ("kill", {"rank": 0, "mtbf": 60, "times": 3}, "mtbf"),
    ("corrupt", {"at_time": 5}, "phase: saved"),
    ("kill", {"rank": 0, "at_time": 5, "phase": "persist"}, "phase: persist"),
    ("jitter", {"from_time": 1, "duration": 5}, "data loader"),
])
def test_faults_a_workflow_cannot_time_are_unmappable(kind: str, fields: dict[str, Any], says: str) -> None:
    with pytest.raises(Unmappable) as info:
        workflow_manifest([(0, kind, fault(kind, **fields))], TARGET, "r")
    assert info.value.kind == kind and says in str(info.value)


@pytest.mark.parametrize("faults, name, field", [
    ([], None, "faults"),
    ([(0, "kill", fault("kill", rank=0, at_time=1))] * 2, None, "fault_id"),
    ([(-1, "kill", fault("kill", rank=0, at_time=1))], None, "fault_id"),
    ([(0, "hang", fault("hang", rank=0, at_time=1, every_seconds=300, times=2))], None, "every_seconds"),
    ([(0, "kill", fault("kill", rank=0, at_time=1))], "Not_A_Name", "name"),
    ([(0, "kill", fault("crash", rank=0, at_time=1))], None, "kill"),
])
def test_bad_input_is_refused(faults: list[tuple[int, str, Any]], name: str | None, field: str) -> None:
    with pytest.raises(FaultConfigError) as info:
        workflow_manifest(faults, TARGET, "r", name)
    assert info.value.field == field


@needs_schema
def test_a_given_name_is_used() -> None:
    wf = workflow_manifest([(3, "kill", fault("kill", rank=0, at_time=1))], TARGET, "r", "nightly-kills")
    validate(wf, CRDS)
    assert wf["metadata"]["name"] == "nightly-kills"


# --- the validator refuses what the cluster refuses ------------------------------------------------------------

def workflow(*templates: dict[str, Any], entry: str = "main") -> dict[str, Any]:
    return {"apiVersion": "chaos-mesh.org/v1alpha1", "kind": "Workflow", "metadata": {"name": "wf", "namespace": "t"},
            "spec": {"entry": entry, "templates": list(templates)}}


KILL = {"action": "pod-kill", "mode": "all", "selector": {"namespaces": ["t"], "labelSelectors": {"app": "gpt"}}}


@needs_schema
@pytest.mark.parametrize("templates, says", [
    ([{"name": "main", "templateType": "Suspend"}], "$.spec.templates[0].deadline: deadline in template with type "
                                                     "Suspend could not be empty (webhook)"),
    ([{"name": "main", "templateType": "Serial", "children": ["gone"]}],
     "$.spec.templates[0].children[0]: can not find a template with name 'gone' (webhook)"),
    ([{"name": "main", "templateType": "PodChaos", "deadline": "1m"}], "$.spec.templates[0].podChaos: parse workflow "
                                                                        "field error: missing chaos spec PodChaos"),
    ([{"name": "main", "templateType": "PodChaos", "deadline": "1m", "networkChaos": {"action": "partition"},
       "podChaos": KILL}], "uses only podChaos, found also ['networkChaos']"),
    ([{"name": "main", "templateType": "PodChaos", "podChaos": KILL}], "$.spec.templates[0].deadline: a chaos template "
                                                                        "needs a deadline"),
    ([{"name": "main", "templateType": "Serial", "children": [], "podChaos": KILL}], "should not contain any Chaos"),
    ([{"name": "main", "templateType": "Suspend", "deadline": "1m", "children": ["main"]}],
     "$.spec.templates[0].children: this template should not contain children"),
    ([{"name": "main", "templateType": "Dance"}], "$.spec.templates[0].templateType: unrecognized template type"),
    ([{"name": "Main", "templateType": "Suspend", "deadline": "1m"}], "$.spec.templates[0].name: field name must be "
                                                                     "DNS-1123 subdomain"),
    ([{"name": "m" * 58, "templateType": "Suspend", "deadline": "1m"}], "at most 57 characters"),
    ([{"name": "main", "templateType": "Suspend", "deadline": "-1m"}], "a negative deadline"),
    ([{"name": "main", "templateType": "Serial", "children": ["a"]}, {"name": "a", "templateType": "Parallel",
                                                                      "children": ["b"]},
      {"name": "b", "templateType": "Serial", "children": ["a"]}], "children form a cycle a -> b -> a"),
    ([], "$.spec.templates: templates in workflow could not be empty"),
    ([{"name": "main", "templateType": "PodChaos", "deadline": "1m", "podChaos": {**KILL, "action": "container-kill"}}],
     "$.spec.templates[0].podChaos.containerNames: container-kill needs containerNames (webhook)"),
    ([{"name": "main", "templateType": "TimeChaos", "deadline": "1m", "timeChaos": {
        "mode": "all", "selector": KILL["selector"], "timeOffset": "5s", "clockIds": ["CLOCK_TAI"]}}],
     "$.spec.templates[0].timeChaos.clockIds"),
    ([{"name": "main", "templateType": "Schedule", "deadline": "1m", "schedule": {
        "schedule": "every 5s", "type": "PodChaos", "podChaos": KILL}}], "$.spec.templates[0].schedule.schedule"),
])
def test_webhook_rules(templates: list[dict[str, Any]], says: str) -> None:
    assert says in problems(workflow(*templates))


@needs_schema
def test_the_entry_is_required_and_pod_failure_takes_its_duration_from_the_deadline() -> None:
    assert "$.spec.entry: the entry of workflow is required" in problems(
        workflow({"name": "main", "templateType": "Suspend", "deadline": "1m"}, entry=""))
    validate(workflow({"name": "main", "templateType": "PodChaos", "deadline": "10m",
                       "podChaos": {**KILL, "action": "pod-failure"}}), CRDS)


@needs_crds
def test_embedded_chaos_fields_are_the_crds() -> None:
    fields = CRDS.schema("Workflow")["properties"]["spec"]["properties"]["templates"]["items"]["properties"]
    assert {f for f in fields if f.endswith("Chaos")} == set(WORKFLOW_EMBEDS.values())


json_values = st.recursive(st.none() | st.booleans() | st.integers(-9, 9) | st.sampled_from(
    ["main", "a", "1m", "soon", "Serial", "Parallel", "Suspend", "PodChaos", "Dance"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["name", "templateType", "children", "deadline", "podChaos", "task", "schedule", "action"]), inner,
        max_size=4), max_leaves=12)


@needs_schema
@settings(max_examples=200, deadline=None)
@given(spec=st.dictionaries(st.sampled_from(["entry", "templates"]), json_values, max_size=2))
def test_validate_only_ever_raises_manifest_invalid(spec: dict[str, Any]) -> None:
    try:
        validate({**workflow(), "spec": spec}, CRDS)
    except ManifestInvalid as e:
        assert e.errors and all(line.startswith("$") for line in e.errors)
