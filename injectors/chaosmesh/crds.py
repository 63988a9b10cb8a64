"""Where the Chaos Mesh CRDs come from: the cluster the faults go to, or a directory the user names.

Every Chaos Mesh object is validated against its kind's CustomResourceDefinition
(:mod:`injectors.chaosmesh.schema`), and the CRDs are the user's, never the package's: the
package ships none and never looks beside its own install directory. A :class:`Crds` is one
source of them, and the validator takes one:

* :meth:`Crds.from_cluster` — what the cluster serves (``GET
  /apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.chaos-mesh.org``), so an
  object is checked against exactly the schema the API server will apply. A cluster without
  Chaos Mesh answers 404: :class:`CrdUnavailable` names the CRD and says how to install it.
  Reading a CRD needs ``get`` on ``customresourcedefinitions`` (``baft deploy --harness``
  grants it, for the CRDs of :data:`~injectors.chaosmesh.schema.PLURALS` the harness creates).
* :meth:`Crds.from_dir` — a directory of YAML files, for a run that touches no cluster
  (``--dry-run``): each file may hold several documents (a release's ``crd.yaml``, or
  ``kubectl get crd A B -o yaml``, which is one ``List``); CRDs are picked by ``metadata.name``.
  :meth:`Crds.from_user` is ``--crds DIR``, else ``$BAFT_CHAOS_CRDS``, else an error saying how
  to get them.

Nothing is read until a kind is first validated; then its CRD is read once per source and kept,
and the schema used is that of version ``v1alpha1`` (what the harness sends), which must be served.
"""
from __future__ import annotations

import copy
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from injectors.errors import InjectorError

__all__ = ["API_VERSION", "CRDS_ENV", "CrdUnavailable", "Crds", "GROUP", "HOW_TO_GET", "PLURALS", "VERSION",
           "api_reason", "crd_name"]

GROUP = "chaos-mesh.org"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

#: Kind -> plural; the CRD is named ``{plural}.chaos-mesh.org``.
PLURALS: dict[str, str] = {
    "PodChaos": "podchaos", "NetworkChaos": "networkchaos", "StressChaos": "stresschaos",
    "IOChaos": "iochaos", "TimeChaos": "timechaos", "Schedule": "schedules", "Workflow": "workflows",
}

#: The environment variable naming a directory of CRDs when no cluster is used.
CRDS_ENV = "BAFT_CHAOS_CRDS"
#: The Chaos Mesh release whose CRDs the harness is checked against (v2.8 line).
RELEASE = "v2.8.0"
HOW_TO_GET = (f"save them from a cluster with Chaos Mesh (kubectl get crd podchaos.{GROUP} networkchaos.{GROUP} ... "
              f"-o yaml > DIR/crds.yaml) or take the release's (curl -sSLo DIR/crd.yaml "
              f"https://mirrors.chaos-mesh.org/{RELEASE}/crd.yaml), then --crds DIR or {CRDS_ENV}=DIR")
INSTALL_CHAOS_MESH = (f"install Chaos Mesh {RELEASE} (helm install chaos-mesh chaos-mesh/chaos-mesh -n chaos-mesh "
                      f"--create-namespace --version {RELEASE.lstrip('v')}, from https://charts.chaos-mesh.org; see "
                      "https://chaos-mesh.org/docs/production-installation-using-helm/)")
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 5x faster on Schedule's CRD


class CrdUnavailable(InjectorError):
    """A Chaos Mesh CRD could not be had from its source; ``name`` is the CRD, the message says how to get it."""

    def __init__(self, name: str, message: str) -> None:
        self.name = name
        super().__init__(message)


def crd_name(kind: str) -> str:
    """The name of a Chaos Mesh kind's CustomResourceDefinition (``podchaos.chaos-mesh.org``)."""
    return f"{PLURALS[kind]}.{GROUP}"


def api_reason(e: Any) -> str:
    """The ``message`` of the Status an API server sent back with an error, else the HTTP reason."""
    try:
        body = json.loads(e.body or "")
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])
    except (TypeError, ValueError):
        pass
    return str(e.reason or "no reason given")


class Crds:
    """One source of Chaos Mesh CRDs (see the module docstring); make one with a ``from_*`` constructor.

    ``where`` says where they come from in messages; ``read`` returns the CRD document of a name
    (``podchaos.chaos-mesh.org``) or raises :class:`CrdUnavailable`. Safe to share between threads.
    """

    __slots__ = ("where", "_read", "_schemas", "_lock")

    def __init__(self, where: str, read: Callable[[str], dict[str, Any]]) -> None:
        self.where = where
        self._read = read
        self._schemas: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Crds({self.where})"

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str]) -> Crds:
        """The CRDs in the YAML files (``*.yaml``, ``*.yml``) of directory ``path``, picked by ``metadata.name``."""
        return cls(f"directory {path}", _DirReader(Path(path)))

    @classmethod
    def from_user(cls, path: str | os.PathLike[str] | None) -> Crds:
        """``path`` (``--crds``), else ``$BAFT_CHAOS_CRDS``; checked now to be a directory, so a typo fails at once."""
        given = path if path is not None else os.environ.get(CRDS_ENV) or None
        if given is None:
            raise CrdUnavailable("", f"without a cluster the Chaos Mesh CRDs must be given: {HOW_TO_GET}")
        if not Path(given).is_dir():
            origin = "--crds" if path is not None else CRDS_ENV
            raise CrdUnavailable("", f"{origin}: expected a directory of Chaos Mesh CRD YAML files, found "
                                     f"{str(given)!r} ({'not a directory' if Path(given).exists() else 'no such path'})")
        return cls.from_dir(given)

    @classmethod
    def from_cluster(cls, api_client: Any, request_timeout: float = 30.0) -> Crds:
        """The CRDs the cluster behind ``api_client`` (a ``kubernetes.client.ApiClient``) serves."""
        host = getattr(getattr(api_client, "configuration", None), "host", None) or "?"
        return cls(f"the cluster at {host}", _ClusterReader(api_client, request_timeout))

    def schema(self, kind: str) -> dict[str, Any]:
        """The ``openAPIV3Schema`` of ``kind`` ("PodChaos", ...) at version ``v1alpha1``; a copy the caller may change."""
        if kind not in PLURALS:
            raise ValueError(f"not a Chaos Mesh kind: {kind!r} (known: {', '.join(PLURALS)})")
        with self._lock:  # one read per kind, also when several firings validate at once
            if kind not in self._schemas:
                self._schemas[kind] = _served_schema(self._read(crd_name(kind)), kind, self.where)
            return copy.deepcopy(self._schemas[kind])


def _served_schema(crd: Any, kind: str, where: str) -> dict[str, Any]:
    """The schema the API server applies to ``kind`` objects of ``v1alpha1``, from its CRD document."""
    name = crd_name(kind)

    def bad(path: str, expected: str, found: object) -> CrdUnavailable:
        return CrdUnavailable(name, f"{where}: CRD {name}: {path}: expected {expected}, found {found!r}")

    spec = crd.get("spec") if isinstance(crd, dict) else None
    if not isinstance(spec, dict):
        raise bad("spec", "an object (apiextensions.k8s.io/v1 CustomResourceDefinition)", spec)
    if (spec.get("names") or {}).get("kind") != kind:
        raise bad("spec.names.kind", repr(kind), (spec.get("names") or {}).get("kind"))
    versions = [v for v in spec.get("versions") or [] if isinstance(v, dict)]
    version = next((v for v in versions if v.get("name") == VERSION), None)
    if version is None or not version.get("served"):
        found = [f"{v.get('name')}{'' if v.get('served') else ' (not served)'}" for v in versions]
        raise bad("spec.versions", f"{VERSION} served", found)
    schema = (version.get("schema") or {}).get("openAPIV3Schema")
    if not isinstance(schema, dict):
        raise bad(f"spec.versions[{versions.index(version)}].schema.openAPIV3Schema", "an object", schema)
    return schema


class _DirReader:
    """CRD documents from a directory's YAML files, each file parsed once, only as far as a name needs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.found: dict[str, dict[str, Any]] = {}
        self.parsed: set[Path] = set()

    def __call__(self, name: str) -> dict[str, Any]:
        if not self.path.is_dir():
            raise CrdUnavailable(name, f"the Chaos Mesh CRDs: {self.path} is not a directory; {HOW_TO_GET}")
        files = sorted(p for p in self.path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
        # Chaos Mesh's own layout (config/crd/bases) has one file per CRD: try that one first.
        usual = self.path / f"{GROUP}_{name.split('.')[0]}.yaml"
        for file in sorted(files, key=lambda p: p != usual):
            if name in self.found:
                break
            if file not in self.parsed:
                self.parsed.add(file)
                for doc in self._documents(file):
                    self.found.setdefault(str((doc.get("metadata") or {}).get("name")), doc)
        if name not in self.found:
            raise CrdUnavailable(name, f"no CustomResourceDefinition {name} in {self.path} ({len(files)} YAML "
                                       f"file{'s' * (len(files) != 1)} read); {HOW_TO_GET}")
        return self.found[name]

    def _documents(self, file: Path) -> Iterator[dict[str, Any]]:
        """The CRDs of a file: its documents, and the items of a ``List`` (``kubectl get crd A B -o yaml``)."""
        try:
            with file.open(encoding="utf-8") as f:
                docs = list(yaml.load_all(f, Loader=_LOADER))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise CrdUnavailable("", f"{file}: expected YAML documents, found an unreadable file: {e}") from None
        for doc in docs:
            if not isinstance(doc, dict):
                continue
            for item in (doc.get("items") or []) if doc.get("kind") == "List" else [doc]:
                if isinstance(item, dict) and item.get("kind") == "CustomResourceDefinition":
                    yield item


class _ClusterReader:
    """CRD documents as the API server serves them (raw JSON: no client model in between to drop a field)."""

    def __init__(self, api_client: Any, request_timeout: float) -> None:
        import kubernetes  # the caller made api_client with it
        import urllib3

        self.api = kubernetes.client.ApiextensionsV1Api(api_client)
        self.rest = kubernetes.client.exceptions.ApiException
        self.transport = (urllib3.exceptions.HTTPError, OSError)
        self.request_timeout = request_timeout

    def __call__(self, name: str) -> dict[str, Any]:
        try:
            response = self.api.read_custom_resource_definition(name, _preload_content=False,
                                                                _request_timeout=self.request_timeout)
            crd = json.loads(response.data)  # type: ignore[attr-defined]  # unparsed (_preload_content=False): the HTTP response
        except self.rest as e:
            if e.status == 404:
                raise CrdUnavailable(name, f"the cluster has no CustomResourceDefinition {name}: Chaos Mesh is not "
                                           f"installed there; {INSTALL_CHAOS_MESH}") from None
            hint = (" (the harness needs get on customresourcedefinitions.apiextensions.k8s.io: the ClusterRole of "
                    "baft deploy --harness)") if e.status in (401, 403) else ""
            raise CrdUnavailable(name, f"reading CustomResourceDefinition {name} failed: HTTP {e.status}: "
                                       f"{api_reason(e)}{hint}") from None
        except self.transport as e:
            raise CrdUnavailable(name, f"reading CustomResourceDefinition {name} failed: no answer from the API "
                                       f"server: {e}") from None
        except ValueError as e:
            raise CrdUnavailable(name, f"reading CustomResourceDefinition {name}: the answer is not JSON: {e}") \
                from None
        return crd
