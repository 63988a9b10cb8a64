"""The worker spec: one typed object, serialised to the JSON a worker has always read."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from baft import BaftConfig, CheckpointConfig

from harness.bench.bench import BenchConfig, BenchSpec
from harness.errors import ScenarioError
from harness.scenario import load
from harness.worker.session import Session
from harness.worker.spec import FaultSpec, WorkerSpec, WorkloadConfig
from injectors import FaultConfigError
from injectors.link import ThrottleConfig
from injectors.process import NodeLossConfig

ROOT = Path(__file__).resolve().parents[2]

#: A worker spec as the launcher wrote it before the spec had a type (a faulted baft run on two nodes).
OLD_SPEC = {
    "workload": {"model": "gpt-tiny", "stages": 2, "data_parallel": 2, "microbatches": 4, "microbatch_size": 4,
                 "schedule": "1f1b", "virtual_stages": 1, "steps": 22, "seed": 12, "nodes": 2, "lr": 0.003,
                 "warmup": 10, "dataset_size": 512, "script": None, "nproc": 1, "args": [], "mutant": None},
    "checkpoint": {"strategy": "baft", "every": 50, "dir": "/runs/x/faulted/checkpoints", "keep": 3,
                   "shm_dir": "/dev/shm/baft-run-1", "replicas": 1, "replicate_every": 1, "replication_rate": 0.0,
                   "replication_yield": True, "store": "", "node": 0},
    "faults": [{"kind": "throttle", "config": {"link": ["node0", "node1"], "rate": "50mbit", "from_step": 5}},
               {"kind": "node_loss", "config": {"node": 1, "at_step": 16}}],
    "stores": ["127.0.0.1:40001", "127.0.0.1:40002"],
    "node_memory": "/dev/shm/baft-run-1",
    "run_dir": "/runs/x/faulted",
    "started_at": 1700000000.25,
}


def write(tmp_path: Path, data: object) -> Path:
    p = tmp_path / "worker-spec.json"
    p.write_text(json.dumps(data, indent=1))
    return p


def test_a_spec_file_from_before_loads_typed(tmp_path: Path) -> None:
    spec = WorkerSpec.load(write(tmp_path, OLD_SPEC))
    assert isinstance(spec.workload, WorkloadConfig) and spec.workload.world_size == 4
    assert isinstance(spec.checkpoint, CheckpointConfig) and spec.checkpoint.strategy == "baft"
    assert [f.kind for f in spec.faults] == ["throttle", "node_loss"]
    assert isinstance(spec.faults[0].config, ThrottleConfig) and isinstance(spec.faults[1].config, NodeLossConfig)
    assert spec.faults[1].config.at_step == 16
    assert spec.stores == OLD_SPEC["stores"] and spec.started_at == 1700000000.25


def test_the_round_trip_gives_back_the_same_json(tmp_path: Path) -> None:
    spec = WorkerSpec.load(write(tmp_path, OLD_SPEC))
    again = json.loads(spec.dumps())
    # every key as before; the configs' defaults are now spelt out
    assert [k for k in again if k in OLD_SPEC] == list(OLD_SPEC) and set(again) - set(OLD_SPEC) == {"probe", "flush_on_sigterm"}
    for key in ("stores", "node_memory", "run_dir", "started_at"):
        assert again[key] == OLD_SPEC[key], key
    assert {k: again["workload"][k] for k in OLD_SPEC["workload"]} == OLD_SPEC["workload"]
    assert again["workload"]["dp_shard"] == 1  # a field added since: its default
    # the checkpoint keys the strategies' sections replaced, each at its path now (baft.config.RENAMED_KEYS)
    from baft.config import RENAMED_KEYS

    def at(tree: dict, path: str) -> object:
        for part in path.split("."):
            tree = tree[part]
        return tree

    assert {k: at(again["checkpoint"], RENAMED_KEYS.get(k, k)) for k in OLD_SPEC["checkpoint"]} == OLD_SPEC["checkpoint"]
    assert not set(again["checkpoint"]) & set(RENAMED_KEYS)
    assert again["checkpoint"]["baft"]["planner"]["copier"] == "inline"
    assert again["faults"][1]["config"]["node"] == 1 and again["faults"][1]["config"]["replacement"] is True
    assert WorkerSpec.from_plain(again, "again") == spec


def test_a_spec_built_from_a_scenario_round_trips() -> None:
    scenario = load(ROOT / "scenarios" / "ci" / "link-throttle-replication.yaml", host=False)
    spec = WorkerSpec(workload=scenario.workload, checkpoint=scenario.checkpoint, faults=scenario.faults,
                      run_dir="/r", started_at=3.5)
    text = spec.dumps()
    assert "stores" not in json.loads(text) and "node_memory" not in json.loads(text)  # None: left out
    assert WorkerSpec.from_plain(json.loads(text), "spec") == spec


def test_the_reference_runs_spec_with_a_bare_checkpoint_section_loads(tmp_path: Path) -> None:
    spec = WorkerSpec.load(write(tmp_path, {"workload": {"steps": 3}, "checkpoint": {"strategy": "none"},
                                            "faults": [], "run_dir": "/r", "started_at": 0.0}))
    assert spec.checkpoint.strategy == "none" and spec.workload.steps == 3 and spec.stores is None


@pytest.mark.parametrize(("change", "path", "expected"), [
    ({"faults": [{"kind": "explode", "config": {}}]}, "faults[0].kind", "a fault kind"),
    ({"faults": [{"kind": "kill"}]}, "faults[0]", "the keys kind and config"),
    ({"faults": [{"kind": "kill", "config": {"rank": 0, "colour": "red"}}]}, "faults[0].config.colour", "one of the keys"),
    ({"workload": {"stages": 0}}, "workload.stages", ">= 1"),
    ({"checkpoint": {"every": 0}}, "checkpoint.every", ">= 1"),
    ({"checkpoint": {"async_dcp": {"mode": "fiber"}}}, "checkpoint.async_dcp.mode", "one of"),
    ({"checkpoint": {"async_dcp": {"stager": "yes"}}}, "checkpoint.async_dcp.stager", "true or false"),
    ({"checkpoint": {"persist_nice": 20}}, "checkpoint.persist_nice", "0 to 19"),
    ({"checkpoint": {"baft": {"persist_window_ms": -1}}}, "checkpoint.baft.persist_window_ms", ">= 0"),
    ({"checkpoint": {"baft": {"persist_window_ms": "2ms"}}}, "checkpoint.baft.persist_window_ms", "a number"),
    ({"checkpoint": {"baft": {"replication": {"rate": -1}}}}, "checkpoint.baft.replication.rate", ">= 0"),
    ({"checkpoint": {"baft": {"colour": 1}}}, "checkpoint.baft.colour", "one of the keys"),
    # a key the sections replaced is judged at its new path, and given at both paths is refused
    ({"checkpoint": {"dcp_async": "fiber"}}, "checkpoint.async_dcp.mode", "one of"),
    ({"checkpoint": {"replicas": 1, "baft": {"replication": {"replicas": 2}}}}, "checkpoint.baft.replication.replicas",
     "not both"),
    ({"stores": None}, "node_memory", "both stores and node_memory"),
    ({"workload": {"amp": "fp8"}}, "workload.amp", "one of"),
    # the zero-bubble schedules: two chunks per rank in a V, or looped ones in whole rounds
    ({"workload": {"schedule": "zbv", "virtual_stages": 3, "stages": 1}}, "workload.virtual_stages", "2 with schedule zbv"),
    ({"workload": {"schedule": "zbv"}}, "workload.virtual_stages", "2 with schedule zbv"),
    ({"workload": {"schedule": "dualpipev", "virtual_stages": 2, "microbatches": 2}}, "workload.microbatches",
     "at least 2*stages (4"),
    ({"workload": {"schedule": "interleaved-zb", "virtual_stages": 1}}, "workload.virtual_stages",
     "at least 2 with schedule interleaved-zb"),
    ({"workload": {"schedule": "interleaved-zb", "virtual_stages": 2, "microbatches": 3}}, "workload.microbatches",
     "a multiple of stages (2) with schedule interleaved-zb"),
    ({"workload": {"schedule": "zero-bubble"}}, "workload.schedule", "one of"),
    ({"workload": {"amp": "fp16", "amp_init_scale": 0}}, "workload.amp_init_scale", "> 0"),
])
def test_a_bad_spec_names_the_key(tmp_path: Path, change: dict, path: str, expected: str) -> None:
    with pytest.raises(ScenarioError) as err:
        WorkerSpec.load(write(tmp_path, {**OLD_SPEC, **change}))
    assert err.value.path == path and expected in err.value.expected


def test_a_fault_spec_checks_its_kind_and_config() -> None:
    with pytest.raises(FaultConfigError):
        FaultSpec(kind="kill", config=NodeLossConfig(node=0, at_step=1))


def test_a_session_reads_its_spec_by_attribute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BAFT_NODE_INDEX", "1")
    session = Session(write(tmp_path, OLD_SPEC))
    assert session.steps == 22 and session.run_dir == Path("/runs/x/faulted")
    assert session.node == 1 and session.node_memory == Path("/dev/shm/baft-run-1/node1")
    cfg = session.checkpoint_config  # placed on node 1
    assert (cfg.node, cfg.store, cfg.shm_dir) == (1, "127.0.0.1:40002", "/dev/shm/baft-run-1/node1")


def test_the_probe_apis_old_import_and_key_paths_work_with_one_warning_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README documented ``from harness.session import Session`` and ``run.spec["workload"]``; both moved
    (harness.worker.session, a typed spec) and broke users' scripts without notice."""
    import importlib
    import sys
    import warnings

    from baft import errors as baft_errors

    import harness
    from harness import errors

    monkeypatch.setattr(baft_errors, "_warned", set())
    monkeypatch.delitem(sys.modules, "harness.session", raising=False)
    assert harness.Session is Session  # the stable path, no warning
    with pytest.warns(errors.HarnessDeprecationWarning, match=r"harness\.session .*from harness import Session"):
        old = importlib.import_module("harness.session")
    assert old.Session is Session
    session = Session(write(tmp_path, OLD_SPEC))
    with pytest.warns(errors.HarnessDeprecationWarning, match=r"spec\.workload\.steps"):
        assert session.spec["workload"]["steps"] == 22
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: the second read is silent
        assert session.spec["stores"] == ["127.0.0.1:40001", "127.0.0.1:40002"]
        assert session.spec.get("nothing", 5) == 5
        assert "workload" in session.spec and "nothing" not in session.spec  # a dict's key test, and its keys
        assert {"workload", "checkpoint", "faults", "stores"} <= set(session.spec)
    with pytest.raises(AttributeError, match="no attribute 'Sesion'"):
        harness.Sesion  # noqa: B018


def test_the_bench_spec_round_trips(tmp_path: Path) -> None:
    bench = BenchConfig(strategies=["baft"], cycles=2, workload=WorkloadConfig(stages=4, microbatches=8, nodes=2),
                        checkpoint=CheckpointConfig(keep=2, baft=BaftConfig(writer="thread")))
    spec = BenchSpec(bench=bench, shm_dir="/dev/shm/b", run_dir="/r")
    back = BenchSpec.load(write(tmp_path, spec.plain()))
    assert back == spec and back.bench.strategies == ["none", "baft"]
    assert back.bench.workload.stages == 4 and back.bench.checkpoint.baft.writer == "thread"


def test_each_schedule_places_its_chunks() -> None:
    """Rank s's model chunks: looped (s, s+P, ...) or in a V (s, 2P-1-s: rank 0 holds the first and last stage),
    every stage on exactly one rank."""
    from types import SimpleNamespace

    from harness.worker.workload import chunk_stages

    for schedule, v in (("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-zb", 3), ("zbv", 2), ("dualpipev", 2)):
        for stages in (1, 2, 3, 4):
            cfg = SimpleNamespace(stages=stages, virtual_stages=v, schedule=schedule)
            held = [chunk_stages(cfg, s) for s in range(stages)]  # type: ignore[arg-type]
            assert sorted(i for h in held for i in h) == list(range(stages * v)), (schedule, stages)
            if schedule in ("zbv", "dualpipev"):
                assert all(h == [s, 2 * stages - 1 - s] for s, h in enumerate(held)) and held[0][-1] == 2 * stages - 1
            else:
                assert all(h == [s + k * stages for k in range(v)] for s, h in enumerate(held))
