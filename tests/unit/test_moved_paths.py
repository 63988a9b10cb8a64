"""The module paths and names from before baft's rooms (issue 35) keep working for a release, with a warning
that names the new path; the rooms answer for the names their old modules had, without one."""
from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from baft._moved import MOVED
from baft.errors import BaftDeprecationWarning


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_is_the_new_module_with_a_warning(old: str) -> None:
    """In a fresh interpreter (the warning is given once per process): ``import`` and ``from baft import``."""
    new = MOVED[old]
    leaf = old.rpartition(".")[2]
    code = (f"import warnings; warnings.simplefilter('error', FutureWarning)\n"
            f"import {new} as new\n"
            f"try:\n    import {old}\nexcept FutureWarning as e:\n    print('warned:', e)\n"
            f"warnings.simplefilter('ignore')\n"
            f"import {old} as o\nfrom baft import {leaf} as f\nimport sys\n"
            f"print(o is new, f is new, sys.modules['{old}'] is new, new.__spec__.name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert f"warned: {old} is deprecated and will be removed in the next release: use {new}" in out
    assert out.splitlines()[-1] == f"True True True {new}"  # one module, its own spec kept


def test_the_warning_points_at_the_importing_line(tmp_path) -> None:
    script = tmp_path / "user.py"
    script.write_text("import baft.wire\n")
    out = subprocess.run([sys.executable, "-W", "always", str(script)], capture_output=True, text=True, check=True)
    assert f"{script}:1: BaftDeprecationWarning: baft.wire is deprecated" in out.stderr


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
    ("baft.state", "Placement", "TensorPlacement"),
    ("harness.worker.spec", "Placement", "LaunchFacts"),
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


def test_checkpoint_group_still_makes_the_gloo_group_with_a_warning() -> None:
    """``baft.strategies.restore.checkpoint_group`` became ``baft.mesh.control.own_group`` (issue 37)."""
    from baft.errors import _warned
    from baft.strategies.restore import checkpoint_group

    _warned.discard("baft.strategies.restore.checkpoint_group")
    with pytest.warns(BaftDeprecationWarning, match="use baft.mesh.control.own_group"):
        assert checkpoint_group() is None  # no process group here: none, as own_group gives
