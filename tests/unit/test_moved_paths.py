"""The rooms answer for the names their old modules had (``from baft.store import Store``), without a warning; the
internal module paths from before the rooms (issue 35) were dropped in 0.2.0; a renamed public name keeps its
old name with a warning for a release."""
from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from baft.errors import BaftDeprecationWarning


def test_the_internal_module_paths_from_before_the_rooms_are_gone() -> None:
    """Version 0.2.0 dropped the internal aliases (CHANGELOG.md): ``baft.wire`` no longer imports."""
    for old in ("baft.wire", "baft.bubble", "baft.slotring", "baft.placement"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)


def test_a_name_that_was_never_there_is_still_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("baft.nothing_like_this")
    with pytest.raises(ImportError):
        exec("from baft import nothing_like_this", {})


@pytest.mark.parametrize(("room", "names"), [
    ("baft.store", ["Store", "StoreConfig", "ReplicationConfig", "main", "parse_args", "ROUND_TIMEOUT"]),
    ("baft.state", ["TrainState", "rng_state", "set_rng_state", "flatten", "fingerprint_components",
                    "digest_components", "local_view", "local_tensors", "is_dtensor", "TensorPlacement"]),
    ("baft.snapshot", ["SnapshotBuffer", "Slot"]),
    ("baft.persist", ["latest", "committed_steps", "read_manifest", "serialize", "deserialize", "MANIFEST"]),
])
def test_a_room_answers_for_its_old_modules_names(room: str, names: list[str]) -> None:
    module = importlib.import_module(room)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in names:
            assert getattr(module, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = module.nothing


@pytest.mark.parametrize(("module", "old", "new"), [
    ("injectors.network", "Topology", "NetworkTopology"),
])
def test_a_renamed_class_keeps_its_old_name_with_a_warning(module: str, old: str, new: str) -> None:
    code = (f"import warnings; warnings.simplefilter('error', FutureWarning)\n"
            f"import {module} as m\ntry:\n    m.{old}\nexcept FutureWarning as e:\n    print(e)\n"
            f"warnings.simplefilter('ignore')\nprint(m.{old} is m.{new} if hasattr(m, '{new}') else "
            f"m.{old}.__name__ == '{new}')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert f"{module}.{old} is deprecated" in out and new in out
    assert out.splitlines()[-1] == "True"


def test_python_m_baft_store_still_starts_the_store() -> None:
    out = subprocess.run([sys.executable, "-m", "baft.store", "--help"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("usage: python -m baft.store")
    assert "torch" not in subprocess.run(
        [sys.executable, "-c", "import sys, baft.store.cli; print(sorted(m for m in sys.modules if m == 'torch'))"],
        capture_output=True, text=True, check=True).stdout.split("[")[1]


def test_the_warning_class_is_the_harness_one() -> None:
    from harness.errors import HarnessDeprecationWarning

    assert HarnessDeprecationWarning is BaftDeprecationWarning
    assert issubclass(BaftDeprecationWarning, FutureWarning)


