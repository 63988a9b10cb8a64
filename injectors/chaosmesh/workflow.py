"""A timed sequence of faults as one Chaos Mesh Workflow, run by the cluster on its own clock.

:func:`workflow_manifest` turns the time-triggered faults of a scenario into one
``Workflow`` (``chaos-mesh.org/v1alpha1``)::

    entry: faults                      Parallel: every occurrence at once, each on its own branch
      f{id}-{kind}-{k}                 Serial: one branch per fault occurrence k
        f{id}-{kind}-{k}-wait          Suspend, deadline = the occurrence's start (left out at 0)
        f{id}-{kind}-{k}-chaos         the chaos (templateType PodChaos, ...; spec under podChaos, ...)

The chaos template's ``deadline`` is how long the chaos object lives: Chaos Mesh's
Workflow creates the object when the template starts and deletes it when the deadline
passes, and its webhook refuses a ``duration`` inside the embedded spec for that
reason. So:

* a **window** fault (``from_time`` + ``duration``) gets deadline = ``duration``;
* a **point** fault that lasts while its object exists (``hang``: pod-failure) gets
  deadline = the ``duration`` its mapping carries (:attr:`ClusterTarget.hang_duration`);
* a **point** fault that acts once when its object is created (``kill``, ``node_loss``:
  pod-kill; ``crash``: container-kill) gets :data:`POINT_DEADLINE`. Deleting such an
  object undoes nothing, so the deadline only bounds how long it lives: long enough for
  the controller to inject every selected pod and record it (``AllInjected``, normally
  seconds), short enough that the branch ends and the object is gone well within a run.

Time runs from the Workflow's creation, so the harness must create it when it launches
the job (the origin of ``at_time`` / ``from_time``); the controller's reconcile adds
about a second of lag. A point fault with ``at_time`` is one occurrence, or ``times``
occurrences ``every_seconds`` apart, each its own branch.

What a Workflow cannot express raises :class:`~injectors.chaosmesh.manifests.Unmappable`: step
triggers (``at_step``, ``from_step``: a Workflow runs on the cluster's clock, not the
job's steps; the harness must follow the journal for those), ``mtbf`` (the harness
draws and follows the moments), a window without ``duration`` (it ends with the run,
which only the harness sees), and a point fault keyed to a checkpoint phase (it fires
at the first such phase after ``at_time``, which the cluster cannot see). Validate the
result with :func:`injectors.chaosmesh.schema.validate`.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

from injectors.chaosmesh.formats import is_dns_label, parse_go_duration
from injectors.chaosmesh.manifests import MANAGED_BY, ClusterTarget, Unmappable, go_duration, manifests, object_name
from injectors.chaosmesh.schema import API_VERSION, WORKFLOW_EMBEDS
from injectors.errors import FaultConfigError
from injectors.process import LOOP_PHASES
from injectors.trigger import PointFault, WindowFault

__all__ = ["ENTRY", "POINT_DEADLINE", "workflow_manifest"]

ENTRY = "faults"
"""Name of the entry template (the Parallel of all branches); branch names start with ``f<digit>``."""
POINT_DEADLINE = "30s"
"""Lifetime of the chaos object of a point fault that acts once on creation (see the module docstring)."""
#: Phases that recur within every step, so "the first one after at_time" is at_time to within a step.
STEP_PHASES = LOOP_PHASES  # the phases every training loop announces, whatever the strategy
#: Longest template name: the controller names a node ``{template}-{5 random}`` and labels its
#: children with that name, a label value of at most 63 characters.
MAX_TEMPLATE_NAME = 57

_CLOCK = "a Workflow runs on the cluster's clock, not the job's steps (the harness must follow the journal for those)"


def workflow_manifest(faults: Sequence[tuple[int, str, Any]], target: ClusterTarget, run_id: str,
                      name: str | None = None) -> dict[str, Any]:
    """One Workflow injecting every ``(fault_id, kind, config)`` at its time (see the module docstring).

    ``fault_id`` is the fault's index in the scenario (distinct ids), ``kind`` its scenario key
    and ``config`` its config; ``name`` defaults to ``{name_prefix}-{run_id}-workflow``. Raises
    :class:`Unmappable` for a fault a Workflow cannot time and :class:`FaultConfigError` for bad
    input. Not validated here: pass the result to :func:`injectors.chaosmesh.schema.validate`.
    """
    name = object_name(target, run_id, None, "workflow") if name is None else name
    if not is_dns_label(name):
        raise FaultConfigError("name", "a DNS-1123 label (the controller labels its nodes with the name)", name)
    if not faults:
        raise FaultConfigError("faults", "at least one time-triggered fault", list(faults))
    seen: set[int] = set()
    branches: list[str] = []
    templates: list[dict[str, Any]] = []
    for fault_id, kind, config in faults:
        if isinstance(fault_id, bool) or not isinstance(fault_id, int) or fault_id < 0 or fault_id in seen:
            raise FaultConfigError("fault_id", "distinct integers >= 0", fault_id)
        seen.add(fault_id)
        (obj,) = manifests(kind, config, fault_id, target, run_id)
        chaos_kind, spec = obj["kind"], dict(obj["spec"])
        lasts = spec.pop("duration", None)  # the Workflow's deadline is the duration (the webhook's rule)
        for k, (start, deadline) in enumerate(_timing(kind, config, lasts)):
            branch = f"f{fault_id}-{kind.replace('_', '-')}-{k}"
            if len(branch) + len("-chaos") > MAX_TEMPLATE_NAME:
                raise FaultConfigError("fault_id", f"a template name of at most {MAX_TEMPLATE_NAME} characters",
                                       branch)
            steps: list[dict[str, Any]] = []
            if start:
                steps.append({"name": f"{branch}-wait", "templateType": "Suspend", "deadline": start})
            steps.append({"name": f"{branch}-chaos", "templateType": chaos_kind, "deadline": deadline,
                          WORKFLOW_EMBEDS[chaos_kind]: copy.deepcopy(spec)})  # no YAML aliases between branches
            templates += [{"name": branch, "templateType": "Serial", "children": [s["name"] for s in steps]}, *steps]
            branches.append(branch)
    entry = {"name": ENTRY, "templateType": "Parallel", "children": branches}
    return {"apiVersion": API_VERSION, "kind": "Workflow",
            "metadata": {"name": name, "namespace": target.namespace,
                         "labels": {"app.kubernetes.io/managed-by": MANAGED_BY, "baft.dev/run": run_id,
                                    "baft.dev/fault-kind": "workflow"}},
            "spec": {"entry": ENTRY, "templates": [entry, *templates]}}


def _timing(kind: str, config: Any, lasts: str | None) -> list[tuple[str | None, str]]:
    """``(start, deadline)`` of each occurrence, as Go durations; start None when it is at 0."""
    if isinstance(config, WindowFault):
        if config.from_time is None:
            raise Unmappable(kind, f"from_step: {_CLOCK}")
        if config.duration is None:
            raise Unmappable(kind, "from_time without duration: the window lasts until the run ends, which only the "
                                   "harness sees; give duration for a Workflow")
        return [(_start(config.from_time, "from_time"), go_duration(config.duration))]
    if not isinstance(config, PointFault):
        raise FaultConfigError(kind, "a point or window fault config", type(config).__name__)
    if config.at_step is not None:
        raise Unmappable(kind, f"at_step: {_CLOCK}")
    if config.mtbf is not None:
        raise Unmappable(kind, "mtbf: the harness draws the random moments and follows them in the journal; give "
                               "at_time (with every_seconds and times) for a Workflow")
    if config.at_time is None:
        raise FaultConfigError("at_time", "a time trigger (at_time)", None)
    if config.phase not in STEP_PHASES:
        raise Unmappable(kind, f"phase: {config.phase} — it fires at the first {config.phase} after at_time, a "
                               "moment of the job the cluster cannot see; a Workflow fires at the time itself")
    deadline = lasts or POINT_DEADLINE
    times = config.time_occurrences()
    if lasts is not None and len(times) > 1 and (config.every_seconds or 0) <= parse_go_duration(lasts):
        raise FaultConfigError("every_seconds", f"a period longer than the fault lasts ({lasts})",
                               config.every_seconds)
    return [(_start(t, "at_time"), deadline) for t in times]


def _start(seconds: float, field: str) -> str | None:
    if not math.isfinite(seconds) or seconds < 0:
        raise FaultConfigError(field, "seconds >= 0", seconds)
    return None if round(seconds * 1000) == 0 else go_duration(seconds)
