"""The Chaos Mesh CRDs the tests validate against: ``../shared/chaos-mesh-crds`` beside the checkout, explicitly.

The package never looks there (a user's CRDs come from their cluster, or ``--crds`` / ``BAFT_CHAOS_CRDS``
without one); the tests do, through this module only, and the stand-in API server serves the same files.
A test that needs them is marked :data:`needs_crds` (:data:`needs_schema`: jsonschema too). Without the
folder such a test skips, saying where it looked; under ``CI=true`` it fails instead, so CI never passes
by skipping most of what checks the manifests.
"""
from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from injectors.chaosmesh.crds import Crds, crd_name

ROOT = Path(__file__).resolve().parents[1]
SHARED_CRDS = ROOT.parent / "shared" / "chaos-mesh-crds"
#: The one source the tests validate with (nothing is read until a kind is first validated).
CRDS = Crds.from_dir(SHARED_CRDS)

needs_crds = pytest.mark.usefixtures("chaos_crds")
needs_schema = pytest.mark.usefixtures("chaos_crds", "jsonschema_installed")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def require_crds() -> Crds:
    """:data:`CRDS`, after checking the folder is there: else skip (fail under ``CI=true``), saying where."""
    if not SHARED_CRDS.is_dir():
        why = (f"no Chaos Mesh CRDs at {SHARED_CRDS} (the tests read ../shared/chaos-mesh-crds beside the checkout: "
               "a directory of chaos-mesh.org_*.yaml files of the v2.8 line)")
        if in_ci():
            pytest.fail(f"{why}; CI=true, so this is a failure, not a skip", pytrace=False)
        pytest.skip(why)
    return CRDS


@functools.cache
def shared_documents() -> dict[str, dict[str, Any]]:
    """Every CRD of the folder by name (``podchaos.chaos-mesh.org``), parsed once; shared: do not change them.
    Empty when the folder is missing (the tests that need it skip or fail through their marker)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    out: dict[str, dict[str, Any]] = {}
    for file in sorted(SHARED_CRDS.glob("*.yaml")) if SHARED_CRDS.is_dir() else []:
        with file.open(encoding="utf-8") as f:
            out.update((d["metadata"]["name"], d) for d in yaml.load_all(f, Loader=loader)
                       if isinstance(d, dict) and d.get("kind") == "CustomResourceDefinition")
    return out


def stricter_podchaos(refused: str = "pod-kill") -> dict[str, Any]:
    """The PodChaos CRD with ``refused`` taken out of ``spec.action``'s enum: a source that refuses what the
    shipped CRD accepts, so a test sees which source a validation really used."""
    crd = copy.deepcopy(shared_documents()[crd_name("PodChaos")])
    action = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["action"]
    action["enum"] = [a for a in action["enum"] if a != refused]
    return crd


def write_crds(directory: Path, *docs: dict[str, Any], name: str = "crd.yaml") -> Path:
    """``docs`` as one multi-document YAML file in ``directory`` (as a release's ``crd.yaml`` is); returns the file."""
    directory.mkdir(parents=True, exist_ok=True)
    file = directory / name
    file.write_text(yaml.dump_all(docs, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), explicit_start=True))
    return file
