"""Apply Chaos Mesh objects to a live cluster, confirm they were injected, and always delete them.

:mod:`injectors.chaosmesh.manifests` builds the objects and :mod:`injectors.chaosmesh.schema` checks them
(against the CRDs the cluster serves, which :mod:`injectors.chaosmesh.crds` reads: the only other module
that sends a request); this module is the one that changes anything on a Kubernetes API server. It uses
``kubernetes.client.CustomObjectsApi`` (group ``chaos-mesh.org``, version ``v1alpha1``),
imported when a :class:`ChaosClient` is made, so a run that never targets a cluster
never imports ``kubernetes``; a missing package says how to install it.

A fault on a cluster is only real once Chaos Mesh reports it, so :meth:`ChaosClient.wait_injected`
waits for both signals Chaos Mesh gives: the condition ``AllInjected`` is ``"True"`` and every
``status.experiment.containerRecords[].phase`` is ``"Injected"`` (and, when the caller knows
how many pods the selector must match, at least that many records). A fault that never
injects raises :class:`NotInjected` naming what did not.

:meth:`ChaosClient.injected` is the rollback of ARCHITECTURE.md rule 4: whatever happens
while the fault is active (an exception, a timeout, Ctrl-C) every object it created is
deleted in a ``finally``, and each step is written to the journal.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from injectors.chaosmesh.crds import Crds, api_reason
from injectors.chaosmesh.schema import GROUP, PLURALS, VERSION, validate
from injectors.errors import HostUnsupported, InjectorError

__all__ = ["Cancelled", "ChaosApiError", "ChaosClient", "Journal", "NotInjected", "NotRecovered",
           "injection_problems"]

INSTALL_HINT = "pip install 'baft-harness[k8s]' (or: pip install kubernetes)"
#: Journal callback: (event, payload), e.g. ``("chaos_created", {"name": ..., "kind": ..., "namespace": ...})``.
Journal = Callable[[str, dict[str, Any]], None]


class ChaosApiError(InjectorError):
    """The API server refused a request about a Chaos Mesh object; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, action: str, obj: dict[str, Any], status: int, reason: str) -> None:
        self.action, self.status, self.reason = action, status, reason
        kind, name, namespace = _ident(obj)
        super().__init__(f"{action} {kind} {name!r} in namespace {namespace!r} failed: HTTP {status}: {reason}")


class NotInjected(InjectorError):
    """Chaos Mesh did not report a fault injected in time; ``problems`` lists what was missing."""

    def __init__(self, obj: dict[str, Any], timeout: float, problems: list[str], status: dict[str, Any]) -> None:
        self.problems, self.status = problems, status
        self.kind, self.name, self.namespace = _ident(obj)
        super().__init__(f"{self.kind} {self.name!r} in namespace {self.namespace!r} was not injected within "
                         f"{timeout:g} s:\n" + "\n".join(f"  - {p}" for p in problems))


class Cancelled(InjectorError):
    """Waiting for a fault to be injected was called off (the run is stopping); its objects are deleted."""


class NotRecovered(InjectorError):
    """A deleted Chaos Mesh object was still there after the timeout: Chaos Mesh keeps it (its finalizer)
    until every record is recovered, so the fault may still be in place."""

    def __init__(self, obj: dict[str, Any], timeout: float, current: dict[str, Any]) -> None:
        self.kind, self.name, self.namespace = _ident(obj)
        records = ((current.get("status") or {}).get("experiment") or {}).get("containerRecords") or []
        shown = ", ".join(f"{r.get('id', '?')}: {r.get('phase')!r}" for r in records) or "no container records"
        super().__init__(f"{self.kind} {self.name!r} in namespace {self.namespace!r} was deleted but is still there "
                         f"after {timeout:g} s (Chaos Mesh has not finished recovering: {shown}); check the "
                         "chaos-controller-manager's log, and remove the finalizer by hand only once the fault is "
                         "undone")


def _ident(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return str(obj.get("kind", "?")), str(meta.get("name", "?")), str(meta.get("namespace", "?"))


def injection_problems(status: dict[str, Any] | None, expected_pods: int | None = None) -> list[str]:
    """Why a Chaos Mesh object's ``status`` does not (yet) show the fault injected; empty when it does.

    Injected means: condition ``AllInjected`` is ``"True"``, there is at least one container
    record (at least ``expected_pods`` when given), and every record's phase is ``"Injected"``.
    Each problem names the conditions or the record (``id``: ``phase``) at fault.
    """
    status = status or {}
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    records = [r for r in ((status.get("experiment") or {}).get("containerRecords") or []) if isinstance(r, dict)]
    problems = []
    if not any(c.get("type") == "AllInjected" and c.get("status") == "True" for c in conditions):
        shown = ", ".join(f"{c.get('type')}={c.get('status')}" + (f" ({c['reason']})" if c.get("reason") else "")
                          for c in conditions) or "none"
        problems.append(f"condition AllInjected is not True (conditions: {shown})")
    want = max(1, expected_pods or 0)
    if len(records) < want:
        problems.append(f"{len(records)} container record{'s' * (len(records) != 1)}, expected at least {want}")
    problems += [f"record {r.get('id', '?')}: phase {r.get('phase')!r}, expected 'Injected'"
                 for r in records if r.get("phase") != "Injected"]
    return problems


def _kubernetes() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise HostUnsupported(f"talking to a Kubernetes cluster needs the kubernetes package: {INSTALL_HINT}") \
            from None
    return kubernetes


def _api_client(k8s: Any, kubeconfig: str | None, context: str | None) -> Any:
    """A client from ``kubeconfig`` (``None``: ``$KUBECONFIG`` or ``~/.kube/config``), or, inside a pod
    with neither, from the pod's service account (the in-cluster harness Job)."""
    default = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if kubeconfig is None and not os.path.exists(default.split(os.pathsep)[0]) \
            and os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = k8s.client.Configuration()
        try:
            k8s.config.load_incluster_config(client_configuration=configuration)
        except k8s.config.ConfigException as e:
            raise HostUnsupported(f"in a pod, but its service account is not usable: {e}") from None
        return k8s.client.ApiClient(configuration)
    try:
        return k8s.config.new_client_from_config(config_file=kubeconfig, context=context, persist_config=False)
    except (k8s.config.ConfigException, OSError) as e:
        raise HostUnsupported(f"no usable kubeconfig ({kubeconfig or '$KUBECONFIG or ~/.kube/config'}): {e}") \
            from None


class ChaosClient:
    """Create, watch and delete Chaos Mesh objects through one Kubernetes API client.

    Give ``api_client`` (a ``kubernetes.client.ApiClient``, e.g. one pointed at a test server)
    or a ``kubeconfig`` path (``None``: ``$KUBECONFIG`` or ``~/.kube/config``) and optionally
    its ``context``. ``check`` validates every object before sending it (needs jsonschema; see
    :mod:`injectors.chaosmesh.schema`), so a mistake fails before it reaches the cluster, against
    ``crds``: by default the CRDs this cluster serves (:meth:`Crds.from_cluster`, read when a kind
    is first validated), so an object is checked against the schema the API server will apply.
    ``request_timeout`` bounds each HTTP request in seconds.
    """

    def __init__(self, kubeconfig: str | None = None, *, context: str | None = None, api_client: Any = None,
                 check: bool = True, request_timeout: float = 30.0, crds: Crds | None = None) -> None:
        k8s = _kubernetes()
        import urllib3  # the kubernetes client's transport: a refused or dropped connection is its error

        self._rest = k8s.client.exceptions.ApiException
        self._transport = (urllib3.exceptions.HTTPError, OSError)
        if api_client is None:
            api_client = _api_client(k8s, kubeconfig, context)
        self.api = k8s.client.CustomObjectsApi(api_client)
        self.core = k8s.client.CoreV1Api(api_client)
        self.check = check
        self.request_timeout = request_timeout
        self.crds = crds if crds is not None else Crds.from_cluster(api_client, request_timeout)
        """Where the objects' CRDs come from (see :mod:`injectors.chaosmesh.crds`)."""

    # --- one request each ----------------------------------------------------------------------

    def _call(self, action: str, obj: dict[str, Any], method: Callable[..., Any], *args: Any) -> Any:
        kind, name, namespace = _ident(obj)
        if kind not in PLURALS:
            raise ChaosApiError(action, obj, 0, f"unknown Chaos Mesh kind; expected one of {', '.join(PLURALS)}")
        try:
            return method(GROUP, VERSION, namespace, PLURALS[kind], *args, _request_timeout=self.request_timeout)
        except self._rest as e:
            raise ChaosApiError(action, obj, int(e.status or 0), api_reason(e)) from None
        except self._transport as e:
            raise ChaosApiError(action, obj, 0, f"no answer from the API server: {e}") from None

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create ``obj`` in its namespace and return the object as the server stored it."""
        if self.check:
            validate(obj, self.crds)
        return self._call("create", obj, self.api.create_namespaced_custom_object, obj)

    def get(self, obj: dict[str, Any]) -> dict[str, Any]:
        """The object named like ``obj`` as it is now on the server (with ``status``)."""
        return self._call("get", obj, self.api.get_namespaced_custom_object, _ident(obj)[1])

    def delete(self, obj: dict[str, Any]) -> bool:
        """Delete the object named like ``obj``; ``False`` when it was already gone (404)."""
        try:
            self._call("delete", obj, self.api.delete_namespaced_custom_object, _ident(obj)[1])
        except ChaosApiError as e:
            if e.status == 404:
                return False
            raise
        return True

    def wait_injected(self, obj: dict[str, Any], timeout: float, poll: float = 0.5,
                      expected_pods: int | None = None, cancel: threading.Event | None = None) -> dict[str, Any]:
        """Poll the object until Chaos Mesh reports it injected (see :func:`injection_problems`); return it.

        Raises :class:`NotInjected` after ``timeout`` seconds, listing the conditions and every
        container record that is not injected, and :class:`Cancelled` once ``cancel`` is set.
        """
        deadline = time.monotonic() + timeout
        while True:
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"stopped waiting for {_ident(obj)[0]} {_ident(obj)[1]!r} to be injected")
            current = self.get(obj)
            problems = injection_problems(current.get("status"), expected_pods)
            if not problems:
                return current
            left = deadline - time.monotonic()
            if left <= 0:
                raise NotInjected(obj, timeout, problems, current.get("status") or {})
            time.sleep(min(poll, left))

    def wait_gone(self, obj: dict[str, Any], timeout: float, poll: float = 0.5) -> float:
        """Poll a deleted object until the server no longer has it; return the seconds waited.

        Chaos Mesh puts a finalizer on every object and removes it only once each record is
        recovered (the fault undone), so "gone" is the signal that the cluster is back to
        normal. Raises :class:`NotRecovered` after ``timeout`` seconds.
        """
        start = time.monotonic()
        while True:
            try:
                current = self.get(obj)
            except ChaosApiError as e:
                if e.status == 404:
                    return time.monotonic() - start
                raise
            left = start + timeout - time.monotonic()
            if left <= 0:
                raise NotRecovered(obj, timeout, current)
            time.sleep(min(poll, left))

    def matching_pods(self, namespace: str, labels: dict[str, str]) -> list[str]:
        """Names of the running pods in ``namespace`` carrying every label in ``labels`` (what a selector hits)."""
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        try:
            pods = self.core.list_namespaced_pod(namespace, label_selector=selector,
                                                 _request_timeout=self.request_timeout)
        except self._rest as e:
            raise ChaosApiError("list pods", {"kind": "Pod", "metadata": {"name": selector, "namespace": namespace}},
                                int(e.status or 0), api_reason(e)) from None
        except self._transport as e:
            raise ChaosApiError("list pods", {"kind": "Pod", "metadata": {"name": selector, "namespace": namespace}},
                                0, f"no answer from the API server: {e}") from None
        # What Chaos Mesh will act on: running pods, not one being deleted (a killed pod lingers while it
        # terminates, its replacement may still be Pending).
        return sorted(p.metadata.name for p in pods.items
                      if p.metadata.deletion_timestamp is None and p.status is not None and p.status.phase == "Running")

    # --- a fault's lifetime ----------------------------------------------------------------------

    @contextmanager
    def injected(self, objs: dict[str, Any] | Sequence[dict[str, Any]], timeout: float,
                 journal: Journal | None = None, *, poll: float = 0.5,
                 expected_pods: int | None = None, recover_timeout: float | None = None,
                 cancel: threading.Event | None = None) -> Iterator[list[dict[str, Any]]]:
        """Apply ``objs`` (one object or a list), wait until each is injected, yield them as stored, then delete.

        Deletion runs in a ``finally`` for every object that was created, whether the body
        returned, raised, timed out waiting, or was interrupted (``KeyboardInterrupt``).
        ``journal`` receives ``chaos_created``, ``chaos_injected`` and ``chaos_deleted`` (or
        ``chaos_delete_failed``) for each object, each with its ``name``, ``kind`` and ``namespace``.
        A failed deletion is raised unless another exception is already on its way out; then it is
        only journaled, so the original error (or Ctrl-C) is not hidden.

        With ``recover_timeout`` the rollback also waits until each deleted object is gone
        (:meth:`wait_gone`: Chaos Mesh has undone the fault) and journals ``chaos_recovered`` with
        the seconds it took (``chaos_not_recovered`` if it does not go; raised unless another error
        is on its way out). After Ctrl-C it does not wait: the deletes were sent. Setting ``cancel``
        (from another thread) stops the wait for injection (:class:`Cancelled`) and, like Ctrl-C, the
        wait for recovery.
        """
        todo = [objs] if isinstance(objs, dict) else list(objs)
        note: Journal = journal or (lambda event, payload: None)
        if self.check:
            for obj in todo:  # every object is checked before the first is created
                validate(obj, self.crds)
        created: list[dict[str, Any]] = []
        failing: BaseException | None = None
        try:
            stored = []
            for obj in todo:
                out = self.apply(obj)
                created.append(obj)
                stored.append(out)
                note("chaos_created", {**_payload(obj), "uid": (out.get("metadata") or {}).get("uid")})
            for i, obj in enumerate(created):
                start = time.monotonic()
                stored[i] = self.wait_injected(obj, timeout, poll, expected_pods, cancel)
                records = ((stored[i].get("status") or {}).get("experiment") or {}).get("containerRecords") or []
                note("chaos_injected", {**_payload(obj), "records": [r.get("id") for r in records],
                                        "waited_s": round(time.monotonic() - start, 3)})
            yield stored
        except BaseException as e:
            failing = e
            raise
        finally:
            errors = []
            for obj in reversed(created):
                try:
                    existed = self.delete(obj)
                except Exception as e:
                    errors.append(e)
                    note("chaos_delete_failed", {**_payload(obj), "error": str(e)})
                else:
                    note("chaos_deleted", {**_payload(obj), "existed": existed})
            # After an error the cluster must still be seen clean before the run goes on; after
            # Ctrl-C (not an Exception) the deletes were asked for and the user wants out.
            stopping = cancel is not None and cancel.is_set()  # the run is stopping (an error, Ctrl-C)
            if recover_timeout is not None and not errors and not stopping \
                    and (failing is None or isinstance(failing, Exception)):
                for obj in reversed(created):
                    try:
                        waited = self.wait_gone(obj, recover_timeout, poll)
                    except Exception as e:
                        errors.append(e)
                        note("chaos_not_recovered", {**_payload(obj), "error": str(e)})
                    else:
                        note("chaos_recovered", {**_payload(obj), "waited_s": round(waited, 3)})
            if errors and failing is None:
                raise errors[0]


def _payload(obj: dict[str, Any]) -> dict[str, Any]:
    kind, name, namespace = _ident(obj)
    return {"name": name, "kind": kind, "namespace": namespace}


