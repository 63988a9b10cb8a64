"""The checkpoint section: what every strategy shares, a section per strategy (``baft``, ``async_dcp``), and
the keys those sections replaced, which still load for a release with a warning naming their new path."""
from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baft import errors
from baft.bubbles.planner import PlannerConfig
from baft.bubbles.profiler import ProfilerConfig
from baft.config import RENAMED_KEYS, AsyncDcpConfig, BaftConfig, CheckpointConfig
from baft.errors import BaftDeprecationWarning
from baft.store.config import ReplicationConfig

from harness.errors import ScenarioError
from harness.scenario import load
from harness.schema import build, to_plain

#: A valid value for each renamed key, and one more, so a draw can tell a value from the default.
VALUES: dict[str, list[Any]] = {
    "shm_dir": ["/dev/shm/a", "/dev/shm/b"], "replicate_every": [2, 5], "persist_writer": ["thread", "dcp"],
    "writer_priority": ["normal", "idle"], "persist_window_ms": [0.0, 7.5], "store": ["127.0.0.1:1"], "node": [1, 3],
    "profiler": [ProfilerConfig(warmup=5)], "planner": [PlannerConfig(chunk_bytes=4096)], "replicas": [0, 2],
    "placement": ["group", "ring"], "domain_nodes": [2, 4], "replication_rate": [1e6, 5e7],
    "replication_yield": [False, True], "replication_max_slowdown": [0.25, 0.5], "store_priority": ["normal"],
    "dcp_async": ["process", "thread"], "dcp_stager": [False, True],
}


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(errors, "_warned", set())  # each test sees its warnings (once per process otherwise)


def nested(old: dict[str, Any]) -> CheckpointConfig:
    """The config the old keys mean, built with the new sections only."""
    cfg = CheckpointConfig(strategy="baft")
    for key, value in old.items():
        *parents, leaf = RENAMED_KEYS[key].split(".")
        objs = [cfg]
        for p in parents:
            objs.append(getattr(objs[-1], p))
        new = dataclasses.replace(objs[-1], **{leaf: value})
        for obj, p in zip(reversed(objs[:-1]), reversed(parents)):
            new = dataclasses.replace(obj, **{p: new})
        cfg = new
    return cfg


def test_every_renamed_key_has_a_path_that_exists() -> None:
    assert set(VALUES) == set(RENAMED_KEYS)
    cfg = CheckpointConfig()
    for new in RENAMED_KEYS.values():
        value: Any = cfg
        for part in new.split("."):
            value = getattr(value, part)  # an AttributeError names a path that does not exist


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(VALUES)), st.just(None), max_size=6), st.integers(0, 1))
def test_old_keyword_arguments_build_what_the_sections_would(keys: dict[str, None], pick: int) -> None:
    old = {k: VALUES[k][pick % len(VALUES[k])] for k in keys}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        errors._warned.clear()
        cfg = CheckpointConfig(strategy="baft", **old)
    assert cfg == nested(old)
    said = {str(w.message).split(" is deprecated")[0] for w in seen if w.category is BaftDeprecationWarning}
    assert said == {f"CheckpointConfig.{k}" for k in old}


def test_an_old_keyword_warns_with_the_new_path() -> None:
    with pytest.warns(BaftDeprecationWarning, match=r"CheckpointConfig\.replicas is deprecated .*use "
                                                    r"CheckpointConfig\.baft\.replication\.replicas"):
        cfg = CheckpointConfig(strategy="baft", replicas=2, baft=BaftConfig(shm_dir="/dev/shm/x"))
    assert cfg.baft.replication.replicas == 2 and cfg.baft.shm_dir == "/dev/shm/x"  # merged into the section given


def test_an_old_attribute_reads_the_new_path_with_a_warning() -> None:
    cfg = CheckpointConfig(strategy="async-dcp", async_dcp=AsyncDcpConfig(mode="process"))
    with pytest.warns(BaftDeprecationWarning, match=r"CheckpointConfig\.dcp_async .*CheckpointConfig\.async_dcp\.mode"):
        assert cfg.dcp_async == "process"
    with pytest.raises(AttributeError, match="nothing"):
        _ = cfg.nothing


def test_a_key_at_both_paths_is_refused() -> None:
    with pytest.raises(errors.BaftConfigError, match="not both"):
        CheckpointConfig(replicas=1, baft={"replication": {"replicas": 2}})  # type: ignore[arg-type]


def test_a_scenario_with_the_old_keys_loads_as_the_new_one_and_says_where(tmp_path: Path) -> None:
    body = "name: t\nworkload: {model: gpt-tiny, stages: 2, microbatches: 4, steps: 6, nodes: 2}\nfaults: []\n"
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(body + "checkpoint: {strategy: baft, every: 3, replicas: 1, replicate_every: 2, store_priority: normal}\n")
    new.write_text(body + "checkpoint: {strategy: baft, every: 3, baft: {replicate_every: 2, "
                          "replication: {replicas: 1, priority: normal}}}\n")
    with pytest.warns(BaftDeprecationWarning) as seen:
        a = load(old)
    assert any(f"{old}: checkpoint.store_priority is deprecated" in str(w.message)
               and "checkpoint.baft.replication.priority" in str(w.message) for w in seen)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new keys say nothing
        b = load(new)
    assert a.checkpoint == b.checkpoint and b.checkpoint.baft.replication == ReplicationConfig(replicas=1, priority="normal")


def test_a_bad_value_under_an_old_key_is_named_at_its_new_path(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as err, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build(CheckpointConfig, {"strategy": "baft", "replication_rate": -1}, "s.yaml", "checkpoint")
    assert err.value.path == "checkpoint.baft.replication.rate"


def test_the_spec_file_round_trips_the_sections() -> None:
    cfg = CheckpointConfig(strategy="baft", baft=BaftConfig(replicate_every=3, writer="thread",
                                                            replication=ReplicationConfig(replicas=2)),
                           async_dcp=AsyncDcpConfig(stager=False))
    plain = json.loads(json.dumps(to_plain(cfg)))
    assert set(plain) >= {"baft", "async_dcp"} and "replicas" not in plain
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert build(CheckpointConfig, plain, "worker-spec.json", "checkpoint") == cfg


def test_with_baft_changes_only_that_section() -> None:
    cfg = CheckpointConfig(strategy="baft", every=7)
    moved = cfg.with_baft(shm_dir="/dev/shm/y")
    assert moved.baft.shm_dir == "/dev/shm/y" and moved.every == 7 and cfg.baft.shm_dir == ""


def test_loading_a_mapping_leaves_it_as_given() -> None:
    """``baft fuzz`` builds the base scenario's mapping several times: the first build must not move the old
    keys into the caller's sections (the second then saw both paths and refused)."""
    data = {"strategy": "baft", "replicas": 1, "baft": {"replicate_every": 2}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = build(CheckpointConfig, data, "s.yaml", "checkpoint")
        second = build(CheckpointConfig, data, "s.yaml", "checkpoint")
    assert data == {"strategy": "baft", "replicas": 1, "baft": {"replicate_every": 2}}
    assert first == second and first.baft.replication.replicas == 1 and first.baft.replicate_every == 2


def test_an_old_keyword_against_a_section_that_sets_it_otherwise_is_refused() -> None:
    with pytest.raises(errors.BaftConfigError, match="differ"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        CheckpointConfig(baft=BaftConfig(writer="thread"), persist_writer="dcp")
    with pytest.raises(errors.BaftConfigError, match="a field of BaftConfig"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        CheckpointConfig(baft={"colour": 1}, replicas=1)  # type: ignore[arg-type]


def test_the_signature_is_the_dataclass_one() -> None:
    import inspect

    assert {"strategy", "every", "baft", "async_dcp"} <= set(inspect.signature(CheckpointConfig).parameters)
