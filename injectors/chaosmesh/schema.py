"""Validate Chaos Mesh objects as a live cluster would: the CRD schemas, then the admission webhook's rules.

The CRDs (``chaos-mesh.org`` ``v1alpha1``, v2.8 line) come from a :class:`~injectors.chaosmesh.crds.Crds`
the caller passes: the cluster's own, or a directory the user names (:mod:`injectors.chaosmesh.crds`).
An object is checked in three layers, and :func:`validate` reports every problem of every layer at
once, each with its JSON path and where the rule comes from:

* ``(schema)`` — the served ``v1alpha1`` version's ``schema.openAPIV3Schema`` with a Draft 7
  validator. Two things are made strict on the way, because the API server would
  otherwise accept a mistake silently: an unknown field is an error (the server
  *prunes* it, so a misspelt field would just not happen), and ``format: int32`` /
  ``int64`` bounds are enforced. OpenAPI 3.0's boolean ``exclusiveMinimum`` and
  ``nullable`` are translated to Draft 7.
* ``(api-server)`` — ObjectMeta: a DNS-1123 name and namespace, valid labels.
* ``(webhook)`` — what Chaos Mesh's admission webhook checks and the schema lacks,
  transcribed from ``api/v1alpha1/*_webhook.go``: ``container-kill`` needs
  ``containerNames``; NetworkChaos ``direction: from|both`` needs ``target`` unless
  the action is ``partition``; a bandwidth ``rate`` parses as Chaos Mesh's
  ``ConvertUnitToBytes`` does; every duration, latency, jitter and IO delay parses
  as a Go ``time.Duration``; stressors exist and have workers > 0; IOChaos errno is
  not 0 and percent is in 0..100; a Schedule's cron parses as robfig/cron's
  ``ParseStandard``; pod-mode values are in range.
* ``(harness)`` — a few stricter checks of ours where Chaos Mesh would accept an
  object that then fails at injection: the action's own sub-spec is present, a rate
  is at least 1 byte/s, IO methods are ones Chaos Mesh defines, a Schedule's type
  names a kind and carries that kind's spec, TimeChaos clock ids are ones the chaos
  daemon knows.

A Workflow gets ``workflow_webhook.go``'s rules (entry and children name templates; unique
DNS-1123 names; a Suspend has a deadline; a chaos template carries its ``templateType``'s
spec, without ``duration``: the ``deadline`` is that), each embedded spec its kind's rules,
and ours: deadlines parse (``time.ParseDuration``), chaos has one, children form no cycle.

``jsonschema`` is an optional dependency, imported only here, only when validating.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any

from injectors.chaosmesh.crds import API_VERSION, GROUP, PLURALS, VERSION, Crds
from injectors.chaosmesh.formats import (
    chaos_rate_bytes,
    check_cron,
    is_dns_label,
    is_dns_subdomain,
    is_label_key,
    is_label_value,
    parse_go_duration,
)
from injectors.errors import HostUnsupported, InjectorError

__all__ = ["API_VERSION", "CLOCK_IDS", "GROUP", "IO_METHODS", "PLURALS", "SCHEDULE_EMBEDS", "VERSION", "WORKFLOW_EMBEDS",
           "Crds", "ManifestInvalid", "validate"]

#: Schedule ``type`` -> the spec field that embeds that kind (Chaos Mesh's ScheduleItem).
SCHEDULE_EMBEDS: dict[str, str] = {
    "PodChaos": "podChaos", "NetworkChaos": "networkChaos", "StressChaos": "stressChaos",
    "IOChaos": "ioChaos", "TimeChaos": "timeChaos",
}

#: Chaos Mesh's ``IoMethod`` values (api/v1alpha1/podiochaos_types.go).
IO_METHODS = frozenset({
    "lookup", "forget", "getattr", "setattr", "readlink", "mknod", "mkdir", "unlink", "rmdir", "symlink",
    "rename", "link", "open", "read", "write", "flush", "release", "fsync", "opendir", "readdir",
    "releasedir", "fsyncdir", "statfs", "setxattr", "getxattr", "listxattr", "removexattr", "access",
    "create", "getlk", "setlk", "bmap"})

#: Workflow ``templateType`` of a chaos -> the template field embedding its spec (Chaos Mesh's EmbedChaos;
#: the CRD's template properties). Only the kinds of :data:`SCHEDULE_EMBEDS` get the webhook's spec rules here.
WORKFLOW_EMBEDS: dict[str, str] = {
    **SCHEDULE_EMBEDS, "AWSChaos": "awsChaos", "AzureChaos": "azureChaos", "BlockChaos": "blockChaos",
    "DNSChaos": "dnsChaos", "GCPChaos": "gcpChaos", "HTTPChaos": "httpChaos", "JVMChaos": "jvmChaos",
    "KernelChaos": "kernelChaos", "PhysicalMachineChaos": "physicalmachineChaos",
}

#: Clock ids TimeChaos accepts (its CRD description; the chaos daemon's ``EncodeClkIds`` refuses any other).
CLOCK_IDS: tuple[str, ...] = (
    "CLOCK_REALTIME", "CLOCK_MONOTONIC", "CLOCK_PROCESS_CPUTIME_ID", "CLOCK_THREAD_CPUTIME_ID", "CLOCK_MONOTONIC_RAW",
    "CLOCK_REALTIME_COARSE", "CLOCK_MONOTONIC_COARSE", "CLOCK_BOOTTIME", "CLOCK_REALTIME_ALARM", "CLOCK_BOOTTIME_ALARM")

INSTALL_HINT = "pip install 'baft-harness[k8s]' (or: pip install jsonschema)"


class ManifestInvalid(InjectorError):
    """A Chaos Mesh object the cluster would refuse (or silently change); ``errors`` lists every problem."""

    def __init__(self, kind: str, name: str, errors: list[str]) -> None:
        self.kind, self.name, self.errors = kind, name, errors
        super().__init__(f"{kind} {name!r} is invalid ({len(errors)} problem{'s' * (len(errors) != 1)}):\n"
                         + "\n".join(f"  - {e}" for e in errors))


# --- the CRD schemas -----------------------------------------------------------------------------

def _draft7(node: Any) -> Any:
    """A copy of an OpenAPI 3.0 structural schema as a strict Draft 7 schema (see the module docstring)."""
    if isinstance(node, list):
        return [_draft7(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _draft7(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False  # the API server prunes unknown fields: make that visible
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(out.get(exclusive), bool):
            if out.pop(exclusive) and bound in out:
                out[exclusive] = out.pop(bound)
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


@functools.lru_cache(maxsize=64)  # per source and kind: a source reads each CRD once, its validator is kept
def _validator(crds: Crds, kind: str) -> Any:
    try:
        import jsonschema
    except ImportError:
        raise HostUnsupported(f"validating Chaos Mesh manifests needs jsonschema: {INSTALL_HINT}") from None
    checker = jsonschema.FormatChecker(formats=())
    for fmt, bits in (("int32", 32), ("int64", 64)):
        checker.checks(fmt)(functools.partial(_fits_int, bits=bits))
    return jsonschema.Draft7Validator(_draft7(crds.schema(kind)), format_checker=checker)


def _fits_int(value: object, bits: int) -> bool:
    return not isinstance(value, int) or isinstance(value, bool) or -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)


# --- validation ----------------------------------------------------------------------------------

def validate(obj: dict[str, Any], crds: Crds) -> None:
    """Raise :class:`ManifestInvalid` listing every reason the cluster would refuse ``obj`` (see module docstring).

    ``crds``: where its kind's CRD comes from; a CRD it cannot give raises
    :class:`~injectors.chaosmesh.crds.CrdUnavailable` naming it."""
    if not isinstance(obj, dict):
        raise ManifestInvalid("?", "?", [f"$: expected an object, found {type(obj).__name__}"])
    kind, meta = obj.get("kind"), obj.get("metadata")
    name = str(meta.get("name", "?")) if isinstance(meta, dict) else "?"
    if obj.get("apiVersion") != API_VERSION:
        raise ManifestInvalid(str(kind), name,
                              [f"$.apiVersion: expected {API_VERSION!r}, found {obj.get('apiVersion')!r}"])
    if kind not in PLURALS:
        raise ManifestInvalid(str(kind), name, [f"$.kind: expected one of {', '.join(PLURALS)}, found {kind!r}"])
    errors = [f"{e.json_path}: {e.message} (schema)"
              for e in sorted(_validator(crds, kind).iter_errors(obj), key=lambda e: list(map(str, e.path)))]
    errors += list(_meta_rules(meta))
    spec = obj.get("spec")
    if isinstance(spec, dict):
        errors += list(_spec_rules(kind, spec, "$.spec"))
    if errors:
        raise ManifestInvalid(kind, name, errors)


def _meta_rules(meta: Any) -> Iterator[str]:
    if not isinstance(meta, dict):
        yield "$.metadata: expected an object with a name (api-server)"
        return
    if not is_dns_subdomain(meta.get("name")):
        yield f"$.metadata.name: expected a DNS-1123 subdomain, found {meta.get('name')!r} (api-server)"
    if "namespace" in meta and not is_dns_label(meta["namespace"]):
        yield f"$.metadata.namespace: expected a DNS-1123 label, found {meta['namespace']!r} (api-server)"
    labels = meta.get("labels") or {}
    for key, value in labels.items() if isinstance(labels, dict) else ():
        if not is_label_key(key) or not is_label_value(value):
            yield f"$.metadata.labels[{key!r}]: expected a valid label key and value, found {value!r} (api-server)"


def _spec_rules(kind: str, spec: dict[str, Any], at: str, in_workflow: bool = False) -> Iterator[str]:
    """The webhook's (and our) rules for one spec; a Schedule's or a Workflow's embedded spec is checked the
    same way (``in_workflow``: the template's ``deadline`` stands for the spec's ``duration``)."""
    yield from _duration_rule(spec.get("duration"), f"{at}.duration")
    if kind not in ("Schedule", "Workflow"):
        yield from _mode_rule(spec, at)
    if kind == "PodChaos":
        action = spec.get("action")
        if action == "container-kill" and not spec.get("containerNames"):
            yield f"{at}.containerNames: container-kill needs containerNames (webhook)"
        if action == "pod-failure" and "duration" not in spec and not in_workflow:
            yield f"{at}.duration: pod-failure needs a duration (CRD description)"
    elif kind == "TimeChaos":
        yield from _time_rules(spec, at)
    elif kind == "Workflow":
        yield from _workflow_rules(spec, at)
    elif kind == "NetworkChaos":
        yield from _network_rules(spec, at)
    elif kind == "StressChaos":
        yield from _stress_rules(spec, at)
    elif kind == "IOChaos":
        yield from _io_rules(spec, at)
    elif kind == "Schedule":
        try:
            check_cron(spec.get("schedule", ""))
        except ValueError as e:
            yield f"{at}.schedule: {e} (webhook)"
        embedded = SCHEDULE_EMBEDS.get(spec["type"]) if isinstance(spec.get("type"), str) else None
        if embedded is None:
            yield f"{at}.type: expected one of {', '.join(SCHEDULE_EMBEDS)}, found {spec.get('type')!r} (harness)"
        elif not isinstance(spec.get(embedded), dict):
            yield f"{at}.{embedded}: a Schedule of type {spec['type']} needs its {embedded} spec (harness)"
        else:
            yield from _spec_rules(spec["type"], spec[embedded], f"{at}.{embedded}")


def _duration_rule(value: Any, at: str, what: str = "duration") -> Iterator[str]:
    if value is None:
        return
    try:
        parse_go_duration(value)
    except ValueError as e:
        yield f"{at}: {what} must be a Go duration: {e} (webhook)"


def _mode_rule(spec: dict[str, Any], at: str) -> Iterator[str]:
    mode, value = spec.get("mode"), spec.get("value")
    if mode in ("fixed", "fixed-percent", "random-max-percent"):
        high = math.inf if mode == "fixed" else 100
        if not (isinstance(value, str) and value.isdigit() and 0 < int(value) <= high):
            yield f"{at}.value: mode {mode} needs a value in 1..{high}, found {value!r} (webhook)"


def _float_rule(value: Any, at: str) -> Iterator[str]:
    try:
        float(value)
    except (TypeError, ValueError):
        yield f"{at}: expected a number in a string, found {value!r} (webhook)"


def _network_rules(spec: dict[str, Any], at: str) -> Iterator[str]:
    action, direction = str(spec.get("action")), spec.get("direction", "to")
    if action != "partition" and direction in ("from", "both"):
        if spec.get("target") is None:
            yield f"{at}.direction: '{direction}' needs a target unless the action is partition (webhook)"
        if spec.get("externalTargets") is not None:
            yield f"{at}.direction: '{direction}' cannot be used with externalTargets (webhook)"
    if isinstance(spec.get("target"), dict):
        yield from _mode_rule(spec["target"], f"{at}.target")
    if action in ("delay", "loss", "duplicate", "corrupt", "bandwidth") and not isinstance(spec.get(action), dict):
        yield f"{at}.{action}: action {action} needs its {action} spec (harness)"
    if action == "netem" and not any(isinstance(spec.get(k), dict) for k in ("delay", "loss", "duplicate", "corrupt")):
        yield f"{at}: action netem needs one of delay, loss, duplicate, corrupt (harness)"
    delay = spec.get("delay")
    if isinstance(delay, dict):
        yield from _duration_rule(delay.get("latency"), f"{at}.delay.latency", "latency")
        yield from _duration_rule(delay.get("jitter"), f"{at}.delay.jitter", "jitter")
        if "correlation" in delay:
            yield from _float_rule(delay["correlation"], f"{at}.delay.correlation")
        if isinstance(delay.get("reorder"), dict):
            for k in ("reorder", "correlation"):
                if k in delay["reorder"]:
                    yield from _float_rule(delay["reorder"][k], f"{at}.delay.reorder.{k}")
    for k in ("loss", "duplicate", "corrupt"):
        sub = spec.get(k)
        if isinstance(sub, dict):
            for f in (k, "correlation"):
                if f in sub:
                    yield from _float_rule(sub[f], f"{at}.{k}.{f}")
    bandwidth = spec.get("bandwidth")
    if isinstance(bandwidth, dict) and isinstance(bandwidth.get("rate"), str):
        try:
            if chaos_rate_bytes(bandwidth["rate"]) < 1:
                yield f"{at}.bandwidth.rate: a rate of 0 bytes/s stops all traffic (harness)"
        except ValueError as e:
            yield f"{at}.bandwidth.rate: {e} (webhook)"


def _stress_rules(spec: dict[str, Any], at: str) -> Iterator[str]:
    stressors = spec.get("stressors")
    if not spec.get("stressngStressors") and not isinstance(stressors, dict):
        yield f"{at}.stressors: missing stressors (webhook)"
        return
    if isinstance(stressors, dict):
        if not any(isinstance(stressors.get(k), dict) for k in ("cpu", "memory")):
            yield f"{at}.stressors: missing stressors: give cpu or memory (webhook)"
        for k in ("cpu", "memory"):
            s = stressors.get(k)
            if isinstance(s, dict) and not (isinstance(s.get("workers"), int) and s["workers"] > 0):
                yield (f"{at}.stressors.{k}.workers: workers should always be positive, "
                       f"found {s.get('workers')!r} (webhook)")


def _io_rules(spec: dict[str, Any], at: str) -> Iterator[str]:
    action = spec.get("action")
    if action == "latency":
        if "delay" not in spec:
            yield f"{at}.delay: action latency needs a delay (webhook)"
        else:
            yield from _duration_rule(spec["delay"], f"{at}.delay", "delay")
    if action == "fault" and not spec.get("errno"):
        yield f"{at}.errno: action fault: errno 0 is not supported (webhook)"
    percent = spec.get("percent", 100)
    if isinstance(percent, int) and not 0 <= percent <= 100:
        yield f"{at}.percent: percent field should be in 0-100, found {percent} (webhook)"
    if action == "mistake" and not isinstance(spec.get("mistake"), dict):
        yield f"{at}.mistake: action mistake needs its mistake spec (harness)"
    listed = spec.get("methods")
    methods = listed if isinstance(listed, list) else []
    unknown = [m for m in methods if not isinstance(m, str) or m not in IO_METHODS]
    if unknown:
        yield f"{at}.methods: unknown IO methods {unknown} (harness; known: {', '.join(sorted(IO_METHODS))})"


def _time_rules(spec: dict[str, Any], at: str) -> Iterator[str]:
    if "timeOffset" in spec:
        try:
            parse_go_duration(spec["timeOffset"])
        except ValueError as e:
            yield f"{at}.timeOffset: parse timeOffset field error: {e} (webhook)"
    ids = spec.get("clockIds")
    unknown = [c for c in ids if not isinstance(c, str) or c not in CLOCK_IDS] if isinstance(ids, list) else []
    if unknown:
        yield (f"{at}.clockIds: unknown clock ids {unknown}: the chaos daemon refuses them at injection "
               f"(harness; known: {', '.join(CLOCK_IDS)})")


# --- Workflow (api/v1alpha1/workflow_webhook.go, and what the workflow controller needs) ---------

_CHAOS_NOT_IN = ("task", "children", "conditionalBranches", "schedule")
_NOT_IN = {  # template type -> fields the webhook forbids on it ("this template should not contain ...")
    "Suspend": _CHAOS_NOT_IN, "StatusCheck": _CHAOS_NOT_IN, "Serial": ("task", "conditionalBranches", "schedule"),
    "Parallel": ("task", "conditionalBranches", "schedule"), "Schedule": ("task", "children", "conditionalBranches"),
    "Task": ("children", "schedule")}


def _workflow_rules(spec: dict[str, Any], at: str) -> Iterator[str]:
    templates = spec.get("templates")
    if not isinstance(templates, list) or not templates:
        yield f"{at}.templates: templates in workflow could not be empty (webhook)"
        return
    items = [(i, t) for i, t in enumerate(templates) if isinstance(t, dict)]
    names = [t.get("name") for _, t in items]
    known = {n for n in names if isinstance(n, str)}
    entry = spec.get("entry")
    if not entry:
        yield f"{at}.entry: the entry of workflow is required (webhook)"
    elif not isinstance(entry, str) or entry not in known:
        yield f"{at}.entry: can not find a template with name {entry!r} (webhook)"
    duplicated = sorted(n for n in known if names.count(n) > 1)
    if duplicated:
        yield f"{at}.templates: template name must be unique, duplicated names: {duplicated} (webhook)"
    for i, t in items:
        yield from _template_rules(t, f"{at}.templates[{i}]", known)
    yield from _cycle_rule({t["name"]: t.get("children") for _, t in items if isinstance(t.get("name"), str)
                            and t.get("templateType") in ("Serial", "Parallel")}, f"{at}.templates")


def _template_rules(t: dict[str, Any], at: str, known: set[str]) -> Iterator[str]:
    name, kind, deadline = t.get("name"), t.get("templateType"), t.get("deadline")
    kind = kind if isinstance(kind, str) else repr(kind)  # reported, never hashed (it may be a list)
    if not is_dns_subdomain(name):
        yield f"{at}.name: field name must be DNS-1123 subdomain, found {name!r} (webhook)"
    elif len(name) > 57:  # the controller labels child nodes with "{name}-{5 random}", a label value
        yield f"{at}.name: at most 57 characters, found {len(name)} (harness)"
    if deadline is not None:
        try:
            if parse_go_duration(deadline) < 0:
                yield f"{at}.deadline: a negative deadline has passed before the template starts (harness)"
        except ValueError as e:
            yield f"{at}.deadline: the workflow controller parses it with time.ParseDuration: {e} (harness)"
    embedded = [f for f in WORKFLOW_EMBEDS.values() if t.get(f) is not None]
    if kind in WORKFLOW_EMBEDS:
        field = WORKFLOW_EMBEDS[kind]
        forbidden: tuple[str, ...] = _CHAOS_NOT_IN
        if not isinstance(t.get(field), dict):
            yield f"{at}.{field}: parse workflow field error: missing chaos spec {kind} (webhook)"
        else:
            if t[field].get("duration") is not None:
                yield (f"{at}.{field}.duration: should not define duration in chaos when using Workflow, "
                       "use Template#Deadline instead (webhook)")
            if kind in SCHEDULE_EMBEDS:
                yield from _spec_rules(kind, t[field], f"{at}.{field}", in_workflow=True)
        others = [f for f in embedded if f != field]
        if others:
            yield f"{at}: a {kind} template uses only {field}, found also {others} (harness)"
        if deadline is None:
            yield (f"{at}.deadline: a chaos template needs a deadline: the Workflow deletes the chaos object "
                   "when it passes, and nothing else ends it (harness)")
    elif kind in _NOT_IN:
        forbidden = _NOT_IN[kind]
        if embedded:
            yield f"{at}: this template should not contain any Chaos, found {embedded} (webhook)"
        if kind == "Suspend" and not deadline:
            yield f"{at}.deadline: deadline in template with type Suspend could not be empty (webhook)"
        if kind == "Schedule" and isinstance(t.get("schedule"), dict):
            yield from _spec_rules("Schedule", t["schedule"], f"{at}.schedule")
    else:
        yield f"{at}.templateType: unrecognized template type: {kind} (webhook)"
        return
    for f in forbidden:
        if t.get(f):
            yield f"{at}.{f}: this template should not contain {f} (webhook)"
    children = t.get("children")
    if kind in ("Serial", "Parallel") and isinstance(children, list):
        for j, child in enumerate(children):
            if not isinstance(child, str) or child not in known:
                yield f"{at}.children[{j}]: can not find a template with name {child!r} (webhook)"


def _cycle_rule(children: dict[str, Any], at: str) -> Iterator[str]:
    """Serial/Parallel templates whose children lead back to themselves: a Workflow that never ends."""
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> list[str] | None:
        kids = children.get(node)
        for kid in kids if isinstance(kids, list) else []:
            if kid in path:
                return path[path.index(kid):] + [kid]
            if isinstance(kid, str) and kid in children and kid not in done and (found := walk(kid, path + [kid])):
                return found
        done.add(node)
        return None

    for start in children:
        if start not in done and (cycle := walk(start, [start])):
            yield f"{at}: children form a cycle {' -> '.join(cycle)}, so the Workflow never ends (harness)"
            return
