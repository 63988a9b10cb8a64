"""The store room's tests: every one runs with the run's store secret set, and may ask for two stores."""
from __future__ import annotations

from pathlib import Path

import pytest

from baft.store.config import ReplicationConfig

from tests.fakes.stores import SECRET, stores


@pytest.fixture(autouse=True)
def _the_runs_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the launcher gives every worker and store of a run (requests and clients read it)."""
    monkeypatch.setenv("BAFT_STORE_SECRET", SECRET)


@pytest.fixture
def two_stores(tmp_path: Path):
    with stores(tmp_path, ReplicationConfig(replicas=1)) as (addresses, _):
        yield tmp_path, addresses
