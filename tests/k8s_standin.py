"""A stand-in Kubernetes API server for Chaos Mesh objects, so the real ``kubernetes`` client can be tested here.

No API server can run on this machine (ARCHITECTURE.md), so tests point the real
client (``kubernetes.client.Configuration(host=standin.host)``) at this one. It
implements only what :mod:`injectors.chaosmesh.client` uses, for group ``chaos-mesh.org``
version ``v1alpha1``:

* ``POST   /apis/chaos-mesh.org/v1alpha1/namespaces/{ns}/{plural}``: store the object, add
  ``metadata.uid``, ``resourceVersion`` and ``creationTimestamp``; 201 with it (409 if the
  name exists, 400 if the body's namespace or kind disagrees with the path).
* ``GET    .../{plural}/{name}``: the object (404 Status if absent). Its first
  ``inject_after_gets`` GETs return it without a ``status``; later ones with Chaos Mesh's
  injected status: conditions ``Selected`` and ``AllInjected`` ``"True"`` and ``pods`` container
  records ``{ns}/pod-{i}/pytorch`` with phase ``Injected``.
* ``GET    .../{plural}``: a list of the namespace's objects of that plural.
* ``DELETE .../{plural}/{name}``: remove it, 200 with a Success Status (404 if absent). With
  ``recover_after_gets`` set, deletion waits on Chaos Mesh's finalizer as on a real cluster: the
  object stays, with ``metadata.deletionTimestamp`` and its records recovering, for that many
  more GETs, then is gone (404).
* ``GET    /api/v1/namespaces/{ns}/pods?labelSelector=k=v,...``: the pods of ``pod_list``
  (``{"name": ..., "labels": {...}}``) in that namespace whose labels match every ``k=v``.
* ``GET    /apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}``: the CRD of ``crds``
  (name -> document; by default every CRD in ``../shared/chaos-mesh-crds``, :mod:`tests.crds`), 404 for
  one it lacks (a cluster without Chaos Mesh), 403 for all with ``forbid_crds`` (no ClusterRole).

Knobs (attributes; change them between requests): ``inject_after_gets``, ``pods``,
``never_inject`` (the status stays ``AllInjected=False`` with every record ``Not Injected``),
``fail_record`` (the last record stays ``Not Injected`` while ``AllInjected`` claims ``True``:
inconsistent on purpose, to show the client checks the records itself), ``recover_after_gets``
(``None``: a delete removes at once), ``pod_list``, ``crds`` (delete one to uninstall it),
``forbid_crds``. Every request is recorded in ``requests`` as
``(method, path)`` and every POSTed body in ``created``; ``deleted`` lists ``(namespace, plural,
name)`` in the order deletes were asked for.
"""
from __future__ import annotations

import contextlib
import copy
import json
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.crds import CRDS, shared_documents

PREFIX = "/apis/chaos-mesh.org/v1alpha1/namespaces/"
CORE = "/api/v1/namespaces/"
CRD_PREFIX = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
KINDS = {"podchaos": "PodChaos", "networkchaos": "NetworkChaos", "stresschaos": "StressChaos",
         "iochaos": "IOChaos", "timechaos": "TimeChaos", "schedules": "Schedule", "workflows": "Workflow"}


class StandIn:
    """The server; use as a context manager (``with StandIn() as s: ... s.host``)."""

    def __init__(self, *, inject_after_gets: int = 0, pods: int = 1, never_inject: bool = False,
                 fail_record: bool = False, recover_after_gets: int | None = None,
                 pod_list: list[dict[str, Any]] | None = None, crds: dict[str, dict[str, Any]] | None = None,
                 forbid_crds: bool = False) -> None:
        self.inject_after_gets, self.pods = inject_after_gets, pods
        self.crds: dict[str, dict[str, Any]] = dict(shared_documents() if crds is None else crds)
        self.forbid_crds = forbid_crds
        self.never_inject, self.fail_record = never_inject, fail_record
        self.recover_after_gets = recover_after_gets
        self.pod_list: list[dict[str, Any]] = pod_list or []
        self.deleted: list[tuple[str, str, str]] = []
        self.deleting: dict[tuple[str, str, str], int] = {}  # GETs left before a finalized object is gone
        self.requests: list[tuple[str, str]] = []
        self.created: list[dict[str, Any]] = []
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.gets: dict[tuple[str, str, str], int] = {}
        self.lock = threading.Lock()
        self._version = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> StandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    # --- behaviour ------------------------------------------------------------------------------

    def status(self, namespace: str) -> dict[str, Any]:
        ok = not self.never_inject
        records = [{"id": f"{namespace}/pod-{i}/pytorch", "selectorKey": ".", "phase": "Injected" if ok else
                    "Not Injected", "injectedCount": int(ok), "recoveredCount": 0} for i in range(self.pods)]
        if self.fail_record and records:
            records[-1].update(phase="Not Injected", injectedCount=0)
        return {"conditions": [{"type": "Selected", "status": "True"},
                               {"type": "AllInjected", "status": "True" if ok else "False"},
                               {"type": "AllRecovered", "status": "False"},
                               {"type": "Paused", "status": "False"}],
                "experiment": {"desiredPhase": "Run", "containerRecords": records}}

    def handle(self, method: str, path: str, body: Any, query: str = "") -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.requests.append((method, path))
            if path.startswith(CORE) and path.endswith("/pods") and method == "GET":
                return self._pods(path[len(CORE):-len("/pods")], query)
            if path.startswith(CRD_PREFIX) and method == "GET":
                return self._crd(path[len(CRD_PREFIX):])
            if not path.startswith(PREFIX):
                return _status(404, "NotFound", f"the server could not find the requested resource ({path})")
            parts = path[len(PREFIX):].split("/")
            if len(parts) not in (2, 3) or parts[1] not in KINDS:
                return _status(404, "NotFound", f"the server could not find the requested resource ({path})")
            namespace, plural = parts[0], parts[1]
            if len(parts) == 2:
                if method == "POST":
                    return self._create(namespace, plural, body)
                if method == "GET":
                    items = [o for (ns, p, _), o in sorted(self.objects.items()) if (ns, p) == (namespace, plural)]
                    return 200, {"apiVersion": "chaos-mesh.org/v1alpha1", "kind": KINDS[plural] + "List",
                                 "metadata": {"resourceVersion": str(self._version)}, "items": items}
                return _status(405, "MethodNotAllowed", f"{method} is not supported on a collection here")
            key = (namespace, plural, parts[2])
            if key not in self.objects:
                return _status(404, "NotFound", f'{plural}.chaos-mesh.org "{parts[2]}" not found', parts[2], plural)
            if method == "GET":
                if key in self.deleting:
                    return self._recovering(key)
                self.gets[key] = self.gets.get(key, 0) + 1
                obj = self.objects[key]
                if self.gets[key] > self.inject_after_gets or self.never_inject:
                    obj["status"] = self.status(namespace)
                return 200, obj
            if method == "DELETE":
                self.deleted.append(key)
                if self.recover_after_gets is None:
                    del self.objects[key]
                    return _status(200, "", "", parts[2], plural, "Success")
                obj = self.objects[key]  # Chaos Mesh's finalizer holds it until every record is recovered
                if key not in self.deleting:
                    self.deleting[key] = self.recover_after_gets
                    obj["metadata"]["deletionTimestamp"] = _now()
                return 200, obj
            return _status(405, "MethodNotAllowed", f"{method} is not supported on an object here")

    def _recovering(self, key: tuple[str, str, str]) -> tuple[int, dict[str, Any]]:
        if self.deleting[key] <= 0:
            del self.deleting[key], self.objects[key]
            return _status(404, "NotFound", f'{key[1]}.chaos-mesh.org "{key[2]}" not found', key[2], key[1])
        self.deleting[key] -= 1
        obj = self.objects[key]
        status = obj.setdefault("status", self.status(key[0]))
        for c in status.get("conditions", []):
            if c["type"] == "AllInjected":
                c["status"] = "False"
        for r in status.get("experiment", {}).get("containerRecords", []):
            r["phase"] = "Not Injected"
        status.setdefault("experiment", {})["desiredPhase"] = "Stop"
        return 200, obj

    def _pods(self, namespace: str, query: str) -> tuple[int, dict[str, Any]]:
        wanted = dict(kv.split("=", 1) for q in parse_qs(query).get("labelSelector", [])
                      for kv in q.split(",") if kv)
        items = [{"apiVersion": "v1", "kind": "Pod",
                  "metadata": {"name": p["name"], "namespace": namespace, "labels": p["labels"]},
                  "status": {"phase": p.get("phase", "Running")}}
                 for p in self.pod_list if p.get("namespace", namespace) == namespace
                 and all(p["labels"].get(k) == v for k, v in wanted.items())]
        return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": str(self._version)},
                     "items": items}

    def _crd(self, name: str) -> tuple[int, dict[str, Any]]:
        what = f'customresourcedefinitions.apiextensions.k8s.io "{name}"'
        if self.forbid_crds:
            return _status(403, "Forbidden", f'{what} is forbidden: User "system:serviceaccount:train:baft-harness" '
                                             'cannot get resource "customresourcedefinitions" in API group '
                                             '"apiextensions.k8s.io" at the cluster scope')
        if name not in self.crds:
            return _status(404, "NotFound", f"{what} not found", name, "customresourcedefinitions",
                           group="apiextensions.k8s.io")
        return 200, self.crds[name]

    def _create(self, namespace: str, plural: str, body: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            return _status(400, "BadRequest", "the body is not an object with metadata")
        self.created.append(copy.deepcopy(body))
        meta = body["metadata"]
        if meta.get("namespace", namespace) != namespace:
            return _status(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                                              "sent on the request")
        if body.get("kind") != KINDS[plural]:
            return _status(400, "BadRequest", f"kind {body.get('kind')!r} does not belong under {plural}")
        key = (namespace, plural, str(meta.get("name")))
        if key in self.objects:
            return _status(409, "AlreadyExists", f'{plural}.chaos-mesh.org "{key[2]}" already exists', key[2], plural)
        self._version += 1
        stored = copy.deepcopy(body)
        stored["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()), resourceVersion=str(self._version),
                                  creationTimestamp=_now())
        self.objects[key] = stored
        return 201, stored


@contextlib.contextmanager
def connected(server: StandIn, request_timeout: float = 5) -> Iterator[Any]:
    """The real client (a :class:`injectors.chaosmesh.client.ChaosClient`) pointed at ``server``, validating
    against the CRDs the server serves; on the way out, every object that reached the server must be one a
    real cluster would accept (checked against the CRD files themselves, not what the server served)."""
    import kubernetes

    from injectors.chaosmesh.client import ChaosClient
    from injectors.chaosmesh.schema import validate

    api = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=server.host))
    try:
        yield ChaosClient(api_client=api, request_timeout=request_timeout)
    finally:
        api.close()
        for body in server.created:
            validate(body, CRDS)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str, name: str = "", plural: str = "",
            outcome: str = "Failure", group: str = "chaos-mesh.org") -> tuple[int, dict[str, Any]]:
    status: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": outcome, "code": code}
    if outcome != "Success":
        status.update(message=message, reason=reason)
    if name:
        status["details"] = {"name": name, "group": group, "kind": plural}
    return code, status


def _handler(standin: StandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                code, out = _status(400, "BadRequest", "the body is not JSON")
            else:
                url = urlsplit(self.path)
                code, out = standin.handle(self.command, url.path, body, url.query)
            data = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            pass

    return Handler
