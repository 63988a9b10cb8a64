"""Scenario validation: every kind of bad input names file, key path, expected and found."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.cli import main as cli_main
from harness.errors import ScenarioError
from harness.scenario import load
from tests.crds import SHARED_CRDS, needs_schema

GOOD = """\
name: kill-rank1-step17
workload: {model: gpt-tiny, stages: 2, data_parallel: 1, microbatches: 4, schedule: 1f1b, steps: 30, seed: 0, nodes: 1}
checkpoint: {strategy: sync, every: 5}
faults:
  - kill: {rank: 1, at_step: 17}
expect: {bitwise: true, max_lost_steps: 5}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


def test_the_issue_example_loads(tmp_path: Path) -> None:
    s = load(write(tmp_path, GOOD))
    assert s.name == "kill-rank1-step17"
    assert s.workload.world_size == 2
    assert s.faults[0].kind == "kill" and s.faults[0].config.rank == 1
    assert s.expect.max_lost_steps == 5


def test_fsdp_composes_with_several_chunks_per_rank() -> None:
    """FSDP2 on an interleaved or zero-bubble schedule (refused until torch's runtime schedules were shown to
    unshard and reshard each chunk: scenarios/ci/pp-fsdp-interleaved.yaml, bit for bit)."""
    s = load(Path(__file__).resolve().parents[2] / "scenarios" / "ci" / "pp-fsdp-interleaved.yaml", host=False)
    assert (s.workload.dp_shard, s.workload.virtual_stages, s.workload.world_size) == (2, 2, 4)


def test_fsdp_and_tp_compose_in_one_stage(tmp_path: Path) -> None:
    s = load(write(tmp_path, GOOD.replace("seed: 0,", "seed: 0, tp: 2, dp_shard: 2,")))
    assert (s.workload.world_size, s.workload.dp_shard, s.workload.tp) == (8, 2, 2)


def test_smoke_scenario_in_repo_is_valid() -> None:
    root = Path(__file__).resolve().parents[2]
    for f in sorted((root / "scenarios").rglob("*.yaml")):
        load(f)


@pytest.mark.parametrize(
    ("old", "new", "path", "expected"),
    [
        ("seed: 0,", "seed: 0, colour: red,", "workload.colour", "one of the keys"),
        ("stages: 2,", "stages: two,", "workload.stages", "an integer"),
        ("stages: 2,", "stages: 2.5,", "workload.stages", "an integer"),
        ("stages: 2,", "stages: -1,", "workload.stages", ">= 1"),
        ("stages: 2,", "stages: 9,", "workload.stages", "at most 4"),
        ("steps: 30,", "steps: 0,", "workload.steps", ">= 1"),
        ("schedule: 1f1b", "schedule: zigzag", "workload.schedule", "one of gpipe, 1f1b"),
        ("nodes: 1}", "nodes: 3}", "workload.nodes", "divisor"),
        ("schedule: 1f1b", "schedule: interleaved-1f1b", "workload.virtual_stages", "at least 2"),
        ("seed: 0,", "seed: 0, virtual_stages: 2,", "workload.virtual_stages", "1 with schedule 1f1b"),
        ("seed: 0,", "seed: 0, tp: 0,", "workload.tp", ">= 1"),
        ("seed: 0,", "seed: 0, tp: 3,", "workload.tp", "a divisor of the MLP width 256"),
        ("gpt-tiny,", "mlp, tp: 2,", "workload.tp", "1 with model mlp"),
        ("seed: 0,", "seed: 0, dp_shard: 0,", "workload.dp_shard", ">= 1"),
        ("seed: 0,", "seed: 0, layout: diagonal,", "workload.layout", "replica-major"),
        ("- kill: {rank: 1, at_step: 17}", "- kill: {rank: 1, at_step: 17, phase: snapshot}", "faults[0].kill.phase", "snapshot needs baft"),
        ("- kill: {rank: 1, at_step: 17}", "- node_loss: {node: 1, at_step: 3}", "faults[0].node_loss.node", "0..0"),
        ("microbatches: 4,", "microbatches: 1,", "workload.microbatches", "at least stages"),
        ("every: 5", "every: -5", "checkpoint.every", ">= 1"),
        ("every: 5", "every: 5, baft: {replication: {domain_nodes: -2}}", "checkpoint.baft.replication.domain_nodes",
         "an integer >= 0"),
        # a key the strategies' sections replaced: judged, and named, at its path now
        ("every: 5", "every: 5, domain_nodes: -2", "checkpoint.baft.replication.domain_nodes", "an integer >= 0"),
        ("strategy: sync", "strategy: magic", "checkpoint.strategy", "one of none, sync"),
        ("rank: 1,", "rank: 2,", "faults[0].kill.rank", "0..1"),
        ("rank: 1,", "rank: -1,", "faults[0].kill.rank", ">= 0"),
        ("at_step: 17", "at_step: 30", "faults[0].kill.at_step", "0..29"),
        ("at_step: 17", "at_step: true", "faults[0].kill.at_step", "an integer"),
        ("- kill:", "- explode:", "faults[0].explode", "a fault kind"),
        ("max_lost_steps: 5", "max_lost_steps: -1", "expect.max_lost_steps", ">= 0"),
        ("max_lost_steps: 5", "max_lost_steps: 5, rng: lenient", "expect.rng", "consumed or strict"),
        ("seed: 0,", "seed: 0, launcher: python,", "workload.launcher", "a one-process command"),
        ("seed: 0,", "seed: 0, launcher: mpirun,", "workload.launcher", "torchrun"),
        ("seed: 0,", "seed: 0, cwd: .,", "workload.cwd", "null without command"),
        ("bitwise: true", "bitwise: yes please", "expect.bitwise", "true or false"),
        ("name: kill-rank1-step17", "name: x\ncolour: red", "colour", "one of the keys"),
    ],
)
def test_bad_values_name_their_key_path(tmp_path: Path, old: str, new: str, path: str, expected: str) -> None:
    assert old in GOOD
    f = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ScenarioError) as err:
        load(f)
    assert err.value.path == path
    assert expected in err.value.expected
    msg = str(err.value)
    assert msg.startswith(str(f)) and path in msg and "found" in msg


def test_missing_name(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as err:
        load(write(tmp_path, GOOD.replace("name: kill-rank1-step17\n", "")))
    assert err.value.path == "name"


def test_unreadable_yaml(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as err:
        load(write(tmp_path, "name: [unclosed\n"))
    assert "valid YAML" in str(err.value) and "line" in str(err.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="readable"):
        load(tmp_path / "nope.yaml")


def test_not_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="a mapping"):
        load(write(tmp_path, "- just\n- a list\n"))


def test_cli_exits_2_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path, GOOD.replace("rank: 1,", "rank: 5,"))
    assert cli_main(["run", str(f), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "faults[0].kill.rank" in err and str(f) in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # nothing started


def test_cli_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["validate", str(write(tmp_path, GOOD))]) == 0
    assert "ok" in capsys.readouterr().out


@settings(max_examples=60, deadline=None)
@given(rank=st.integers(-3, 8), at_step=st.integers(-3, 40), stages=st.integers(1, 4), dp=st.integers(1, 3))
def test_fault_bounds_follow_the_workload(tmp_path_factory: pytest.TempPathFactory, rank: int, at_step: int, stages: int, dp: int) -> None:
    text = (
        f"name: p\nworkload: {{stages: {stages}, data_parallel: {dp}, microbatches: 4, steps: 30}}\n"
        f"faults:\n  - kill: {{rank: {rank}, at_step: {at_step}}}\n"
    )
    f = tmp_path_factory.mktemp("h") / "s.yaml"
    f.write_text(text)
    valid = 0 <= rank < stages * dp and 0 <= at_step < 30
    if valid:
        assert load(f).faults[0].config.rank == rank
    else:
        with pytest.raises(ScenarioError) as err:
            load(f)
        assert err.value.path in ("faults[0].kill.rank", "faults[0].kill.at_step")


@pytest.mark.parametrize(
    "faults, run, path, expected",
    [
        ("- kill: {rank: 0, at_step: 2, every: 5, times: 4}", "{max_restarts: 3}", "run.max_restarts", "at least 4"),
        ("- hang: {rank: 0, at_step: 2}", "{hang_timeout: null}", "run.hang_timeout", "needs the watchdog"),
        ("- kill: {rank: 1, at_step: 17}", "{exit_timeout: 0}", "run.exit_timeout", "seconds > 0"),
        ("- kill: {rank: 0, at_step: 5, phase: saved}", "{}", "faults[0].kill.phase", "a phase of kill"),
        ("- corrupt: {at_step: 7}", "{}", "faults[0].corrupt.at_step", "a step baft persists"),
        ("- jitter: {from_step: 3, ranks: [2]}", "{}", "faults[0].jitter.ranks", "'all' or a non-empty list"),
        # the weight pass comes only where a zero-bubble schedule splits the backward (GOOD runs 1F1B)
        ("- kill: {rank: 1, at_step: 5, phase: backward_weight}", "{}", "faults[0].kill.phase",
         "comes only on a zero-bubble schedule"),
        # a fault in restart N's restore needs N restarts from the other faults; sync pulls from no peer
        ("- kill: {rank: 1, at_restore: 1, phase: restore}", "{}", "faults[0].kill.at_restore", "at most 0"),
        ("- kill: {rank: 1, at_step: 4}\n  - kill: {rank: 0, at_restore: 2, phase: restore_load}", "{max_restarts: 3}",
         "faults[1].kill.at_restore", "at most 1"),
        ("- kill: {rank: 1, at_step: 4}\n  - kill: {rank: 0, at_restore: 1, phase: restore_load}", "{max_restarts: 1}",
         "run.max_restarts", "at least 2"),
        ("- kill: {rank: 1, at_step: 4}\n  - kill: {rank: 0, at_restore: 1, phase: restore_pull}", "{}",
         "faults[1].kill.phase", "a phase checkpoint strategy 'sync' announces"),
    ],
)
def test_fault_schedule_problems_are_caught_before_running(tmp_path: Path, faults: str, run: str, path: str, expected: str) -> None:
    text = GOOD.replace("  - kill: {rank: 1, at_step: 17}", "  " + faults) + f"run: {run}\n"
    with pytest.raises(ScenarioError) as e:
        load(write(tmp_path, text))
    assert e.value.path == path and expected in e.value.expected


def test_an_adaptive_interval_refuses_a_persist_fault_at_a_fixed_step_and_bad_bounds_by_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    adaptive = GOOD.replace("checkpoint: {strategy: sync, every: 5}",
                            "checkpoint: {strategy: sync, every: 5, mtbf_hours: 2, every_min: 2, every_max: 50}")
    assert load(write(tmp_path, adaptive)).checkpoint.mtbf_hours == 2
    with pytest.raises(ScenarioError) as e:
        load(write(tmp_path, adaptive.replace("  - kill: {rank: 1, at_step: 17}", "  - corrupt: {at_step: 10}")))
    assert e.value.path == "faults[0].corrupt.at_step" and "known only while the job runs" in e.value.expected
    f = write(tmp_path, adaptive.replace("every_max: 50", "every_max: 4"))
    assert cli_main(["validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert "checkpoint.every" in err and "every_min" in err


def test_a_fault_the_host_cannot_inject_is_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("injectors.storage.os.geteuid", lambda: 1000)
    f = write(tmp_path, GOOD.replace("  - kill: {rank: 1, at_step: 17}", "  - disk_full: {from_step: 3}"))
    assert cli_main(["validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert "faults[0].disk_full" in err and "needs root" in err


ELASTIC = """\
name: elastic
workload: {model: gpt-tiny, stages: 2, data_parallel: 2, microbatches: 4, steps: 30, nodes: 2}
checkpoint: {strategy: baft, every: 5}
faults:
  - node_loss: {node: 1, at_step: 12, replacement: false}
expect: {loss: {rtol: 0.02, window: 5}}
"""


def test_the_elastic_scenario_loads_and_names_the_lost_node(tmp_path: Path) -> None:
    s = load(write(tmp_path, ELASTIC))
    assert s.lost_nodes == [1] and s.expect.loss is not None and s.expect.loss.window == 5
    assert s.workload.resized(2).microbatches == 8 and s.workload.resized(2).global_batch == s.workload.global_batch


@pytest.mark.parametrize(
    "old, new, path, expected",
    [
        ("node: 1,", "node: 0,", "faults[0].node_loss.node", "node 0 hosts the rendezvous"),
        ("at_step: 12,", "at_step: 12, every: 5,", "faults[0].node_loss.replacement", "only once"),
        ("strategy: baft", "strategy: sync", "checkpoint.strategy", "restores on fewer replicas"),
        ("expect: {loss: {rtol: 0.02, window: 5}}", "expect: {bitwise: true}", "expect.loss", "loss-curve tolerance"),
        ("microbatches: 4, steps: 30, nodes: 2", "microbatches: 4, steps: 30, nodes: 4", "workload.data_parallel",
         "divisible by stages"),
        ("data_parallel: 2, microbatches: 4, steps: 30, nodes: 2", "data_parallel: 3, microbatches: 3, steps: 30, nodes: 3",
         "workload.microbatches", "the global batch must stay"),
        ("rtol: 0.02", "rtol: -1", "expect.loss.rtol", ">= 0"),
        ("window: 5", "window: 0", "expect.loss.window", ">= 1"),
    ],
)
def test_elastic_problems_are_bad_input(tmp_path: Path, old: str, new: str, path: str, expected: str) -> None:
    assert old in ELASTIC
    with pytest.raises(ScenarioError) as e:
        load(write(tmp_path, ELASTIC.replace(old, new)))
    assert e.value.path == path and expected in e.value.expected, (e.value.path, e.value.expected)


def test_a_script_workload_resolves_its_path_and_counts_its_ranks(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    f = write(tmp_path, GOOD.replace("workload: {model: gpt-tiny, stages: 2, data_parallel: 1, microbatches: 4, schedule: 1f1b, "
                                     "steps: 30, seed: 0, nodes: 1}",
                                     "workload: {script: train.py, nproc: 3, nodes: 2, steps: 30, args: [--x, '1']}")
              .replace("rank: 1, at_step: 17", "rank: 5, at_step: 17"))
    s = load(f)
    assert s.workload.script == str(tmp_path / "train.py") and s.workload.world_size == 6
    with pytest.raises(Exception, match="script"):
        s.workload.resized(3)


def test_a_missing_script_is_bad_input(tmp_path: Path) -> None:
    f = write(tmp_path, GOOD.replace("model: gpt-tiny,", "script: nope.py,"))
    with pytest.raises(ScenarioError) as e:
        load(f)
    assert e.value.path == "workload.script" and "nope.py" in str(e.value.found)


CLOCK_SKEW = "  - clock_skew: {rank: 1, offset: -10m, from_time: 5, duration: 30}"


def test_a_local_clock_skew_is_refused_and_says_to_use_a_cluster(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path, GOOD.replace("  - kill: {rank: 1, at_step: 17}", CLOCK_SKEW))
    with pytest.raises(ScenarioError) as e:
        load(f)
    assert e.value.path == "faults[0].clock_skew" and "baft run SCENARIO --target k8s" in str(e.value.found)
    assert cli_main(["run", str(f), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "clock_skew runs only on a cluster" in err and "TimeChaos" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # nothing started
    with pytest.raises(ScenarioError) as e:  # the fault's own checks come first, with their key path
        load(write(tmp_path, GOOD.replace("  - kill: {rank: 1, at_step: 17}", CLOCK_SKEW.replace("-10m", "10 min"))))
    assert e.value.path == "faults[0].clock_skew.offset"


@pytest.mark.k8s
@needs_schema
def test_a_clock_skew_scenario_can_go_to_a_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path, GOOD.replace("  - kill: {rank: 1, at_step: 17}", CLOCK_SKEW))
    assert load(f, host=False).faults[0].config.offset == "-10m"  # the cluster target skips the host's preflight
    rc = cli_main(["run", str(f), "--target", "k8s", "--dry-run", "--crds", str(SHARED_CRDS), "--namespace", "train",
                   "--selector", "app=gpt"])
    assert rc == 0 and "kind: TimeChaos" in capsys.readouterr().out


COMMAND = """\
name: cmd
workload: {command: [train.py, --steps, 12], nproc: 2, steps: 12}
checkpoint: {strategy: none}
faults:
  - kill: {rank: 1, at_step: 7}
expect: {bitwise: true}
"""


@pytest.mark.parametrize(
    ("old", "new", "path", "expected"),
    [
        ("command: [train.py,", "command: [missing.py,", "workload.command[0]", "an existing training script"),
        ("command: [train.py, --steps, 12]", "command: []", "workload.command", "a list [SCRIPT, ARG...]"),
        ("nproc: 2,", "nproc: 2, script: train.py,", "workload.command", "not both"),
        ("at_step: 7}", "at_step: 7, phase: backward}", "faults[0].kill.phase", "iteration, data, save"),
        ("at_step: 7}", "at_step: 12}", "faults[0].kill.at_step", "0..11"),
    ],
)
def test_a_bad_command_workload_names_its_key_path(tmp_path: Path, old: str, new: str, path: str, expected: str) -> None:
    (tmp_path / "train.py").write_text("print('training')\n")
    assert old in COMMAND
    with pytest.raises(ScenarioError) as err:
        load(write(tmp_path, COMMAND.replace(old, new, 1)))
    assert (err.value.path, expected in err.value.expected) == (path, True), err.value


def test_a_command_workload_loads_with_its_script_made_absolute(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('training')\n")
    s = load(write(tmp_path, COMMAND))
    assert s.workload.command == [str(tmp_path / "train.py"), "--steps", "12"] and s.workload.world_size == 2


def test_a_python_launcher_needs_one_process_and_a_cwd_an_existing_directory(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    base = "name: x\nworkload: {{command: [train.py], steps: 4{extra}}}\nfaults: []\n"
    ok = load(write(tmp_path, base.format(extra=", launcher: python, cwd: .")))
    assert ok.workload.launcher == "python" and ok.workload.cwd == str(tmp_path.resolve())
    with pytest.raises(ScenarioError) as err:
        load(write(tmp_path, base.format(extra=", launcher: python, nproc: 2")))
    assert err.value.path == "workload.launcher"
    with pytest.raises(ScenarioError) as err:
        load(write(tmp_path, base.format(extra=", cwd: nowhere")))
    assert err.value.path == "workload.cwd" and "an existing directory" in err.value.expected


def test_a_plain_python_environment_has_no_distributed_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.worker.boot import as_plain_python

    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
                 "TORCHELASTIC_RESTART_COUNT": "2", "GROUP_RANK": "0", "BAFT_NODE": "node0", "PATH_X": "kept"}.items():
        monkeypatch.setenv(k, v)
    gone = as_plain_python()
    import os

    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                "GROUP_RANK"} & set(os.environ)
    assert os.environ["BAFT_NODE"] == "node0" and os.environ["PATH_X"] == "kept" and "RANK" in gone
