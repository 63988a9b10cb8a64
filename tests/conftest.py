"""Shared test setup: one intra-op thread, deterministic torch."""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from typing import TYPE_CHECKING

import pytest  # after the environment above: nothing imported here may pull in torch first

if TYPE_CHECKING:
    from injectors.chaosmesh.crds import Crds


@pytest.fixture(scope="session")
def chaos_crds() -> Crds:
    """The Chaos Mesh CRDs of ``../shared/chaos-mesh-crds`` (:mod:`tests.crds`: skip, or fail under CI)."""
    from tests.crds import require_crds

    return require_crds()


@pytest.fixture(scope="session")
def jsonschema_installed() -> None:
    pytest.importorskip("jsonschema", reason="needs jsonschema (pip install 'baft-harness[k8s]')")
