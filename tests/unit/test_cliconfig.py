"""Flags from config dataclasses (``harness/cliconfig.py``): ``baft bench`` and ``baft deploy`` take their
options, defaults and help from ``BenchConfig`` and ``DeployConfig``, and the flags give the config back. The
bench's workload and checkpoint sections are flags under their paths (``--checkpoint.baft.writer``); its flags
from before the sections still work, with a warning."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import baft.strategies.registry as registry
from baft import AsyncDcpConfig, BaftConfig, CheckpointConfig
from baft import errors as baft_errors
from baft.bubbles.planner import PlannerConfig
from baft.errors import BaftDeprecationWarning
from baft.store.config import ReplicationConfig

from harness.bench.bench import BenchConfig
from harness.cli import _parser
from harness.cli import main as cli_main
from harness.cliconfig import _options, add_config_arguments, argv_of, config_from_args, field_docs, flag
from harness.cluster.deploy import DeployConfig
from harness.errors import ConfigValueError, UsageError
from harness.worker.spec import WorkloadConfig

REQUIRED = {"namespace": "ml", "image": "reg/baft:1", "claim": "shared"}


@dataclass(kw_only=True, slots=True)
class Toy:
    """A config with one field of each kind a flag carries."""

    rate: float = 0.5
    """Parts per second (100% is 1)."""
    level: Literal[1, 2, 3] = 2
    """How hard."""
    label: str | None = None
    """A name, if any."""
    names: list[str] = field(default_factory=lambda: ["a", "b"])
    """Some names."""
    sizes: list[int] = field(default_factory=lambda: [1, 10])
    """Some sizes."""
    loud: bool = False
    """Say more."""
    count: int
    """How many (required)."""

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ConfigValueError("count", "an integer >= 0", self.count)


def sub_help(command: str, built_for: str | None = None) -> str:
    """``baft COMMAND --help``'s text, from the parser built for ``built_for`` (default: that command)."""
    p = _parser(built_for or command)
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return str(sub.choices[command].format_help())


def parsed(cls: type, argv: list[str]) -> Any:
    p = argparse.ArgumentParser()
    add_config_arguments(p, cls)
    return config_from_args(cls, p.parse_args(argv))


def test_docstrings_are_read_from_the_source() -> None:
    docs = field_docs(Toy)
    assert docs["rate"] == "Parts per second (100% is 1)." and docs["count"] == "How many (required)."
    assert field_docs(BenchConfig)["restore_repeats"] == "Timed restores per tier."


def test_defaults_live_in_the_config() -> None:
    assert parsed(Toy, ["--count", "3"]) == Toy(count=3)
    assert parsed(BenchConfig, []) == BenchConfig()
    assert parsed(DeployConfig, argv_of(DeployConfig(**REQUIRED))[:3]) == DeployConfig(**REQUIRED)
    assert parsed(Toy, ["--count=1", "--names", " x, y,,", "--loud", "--level", "3", "--rate", "2e-3"]) == \
        Toy(count=1, names=["x", "y"], loud=True, level=3, rate=0.002)


def test_the_flags_existing_scripts_use_still_work() -> None:
    cfg = parsed(BenchConfig, ["--cycles", "3", "--warmup", "1", "--strategies", "sync,baft", "--block", "2",
                               "--persist-every", "2", "--link-rate", "50mbit", "--workload.nodes", "2"])
    assert (cfg.strategies, cfg.persist_every, cfg.nodes, cfg.link_rate) == (["none", "sync", "baft"], [2], 2, "50mbit")

    dep = parsed(DeployConfig, ["--namespace", "ml", "--image", "i:1", "--claim", "shared", "--harness",
                                "--reference-run", "reference", "--cpu", "500m", "--memory", "1Gi", "--shm", "1Gi"])
    assert dep.harness and dep.reference_run == "reference" and (dep.cpu, dep.memory, dep.shm) == ("500m", "1Gi", "1Gi")


OLD_BENCH_FLAGS = ["--model", "gpt-small", "--stages", "4", "--dp-shard", "1", "--tp", "1", "--nodes", "2",
                   "--microbatches", "4", "--microbatch-size", "2", "--schedule", "gpipe", "--seed", "7",
                   "--persist-nice", "5", "--persist-writer", "thread", "--dcp-async", "process", "--no-dcp-stager",
                   "--replicate-every", "2", "--no-replication-yield", "--replication-max-slowdown", "0.25",
                   "--store-priority", "normal", "--writer-priority", "normal", "--persist-window-ms", "0",
                   "--baft-copier", "thread"]


def test_the_bench_flags_from_before_its_sections_work_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every flag ``baft bench`` had before it took the workload and checkpoint sections gives the same config as
    its new path, and warns naming that path; none is in ``--help``."""
    monkeypatch.setattr(baft_errors, "_warned", set())
    with pytest.warns(BaftDeprecationWarning) as caught:
        old = parsed(BenchConfig, OLD_BENCH_FLAGS)
    new = BenchConfig(
        workload=WorkloadConfig(model="gpt-small", stages=4, nodes=2, microbatches=4, microbatch_size=2,
                                schedule="gpipe", seed=7, dataset_size=8192),
        checkpoint=CheckpointConfig(keep=2, persist_nice=5, baft=BaftConfig(
            writer="thread", replicate_every=2, writer_priority="normal", persist_window_ms=0,
            planner=PlannerConfig(copier="thread"),
            replication=ReplicationConfig(yield_to_training=False, max_slowdown=0.25, priority="normal")),
            async_dcp=AsyncDcpConfig(mode="process", stager=False)))
    assert old == new
    said = {str(w.message) for w in caught}
    assert len(said) == len(BenchConfig.RENAMED_FLAGS)
    assert ("--no-replication-yield is deprecated and will be removed in the next release: use "
            "--no-checkpoint.baft.replication.yield-to-training") in said
    assert "--baft-copier is deprecated and will be removed in the next release: use --checkpoint.baft.planner.copier" in said
    text = sub_help("bench")
    assert "--checkpoint.baft.planner.copier" in text and "--baft-copier" not in text and "--persist-writer" not in text
    for old_name, path in BenchConfig.RENAMED_FLAGS.items():  # each maps onto a flag that exists
        assert path in {o.path for o in _options(BenchConfig)}, old_name


def test_a_section_field_is_a_flag_under_its_path() -> None:
    cfg = parsed(BenchConfig, ["--checkpoint.baft.writer", "dcp", "--checkpoint.baft.replication.rate", "1e6",
                               "--no-checkpoint.async-dcp.stager", "--workload.schedule", "interleaved-1f1b",
                               "--workload.virtual-stages", "2", "--checkpoint.keep", "1"])
    assert cfg.checkpoint.baft.writer == "dcp" and cfg.checkpoint.baft.replication.rate == 1e6
    assert cfg.checkpoint.async_dcp.stager is False and cfg.checkpoint.keep == 1
    assert (cfg.workload.schedule, cfg.workload.virtual_stages, cfg.workload.microbatches) == ("interleaved-1f1b", 2, 8)
    # a section none of whose flags is given keeps the bench's default instance
    assert parsed(BenchConfig, ["--cycles", "2"]).workload == BenchConfig().workload
    assert argv_of(BenchConfig(cycles=3, workload=WorkloadConfig(microbatches=8, dataset_size=8192, nodes=2),
                               checkpoint=CheckpointConfig(keep=2, baft=BaftConfig(writer="dcp"))),
                   changed_only=True) == ["--workload.nodes=2", "--checkpoint.baft.writer=dcp", "--cycles=3"]


def test_what_the_bench_sets_itself_is_no_flag_and_refused_in_code() -> None:
    text = sub_help("bench")
    for path in ("--workload.steps", "--workload.command", "--checkpoint.strategy", "--checkpoint.dir",
                 "--checkpoint.baft.shm-dir", "--checkpoint.baft.store", "--checkpoint.every "):
        assert path not in text, path
    with pytest.raises(SystemExit):
        parsed(BenchConfig, ["--checkpoint.strategy", "baft"])
    with pytest.raises(ConfigValueError, match=r"^checkpoint.strategy: expected 'sync', its default \(the bench sets"):
        BenchConfig(checkpoint=CheckpointConfig(strategy="baft"))
    with pytest.raises(ConfigValueError, match=r"^workload.command: expected None"):
        BenchConfig(workload=WorkloadConfig(command=["train.py"]))
    with pytest.raises(ConfigValueError, match=r"^checkpoint.baft.shm_dir: expected ''"):
        BenchConfig(checkpoint=CheckpointConfig(baft=BaftConfig(shm_dir="/dev/shm/x")))


def test_a_refused_value_names_its_flag() -> None:
    with pytest.raises(UsageError, match=r"^--count: expected an integer >= 0, found -1$"):
        parsed(Toy, ["--count=-1"])
    with pytest.raises(UsageError, match=r"^--strategies: expected names among none, sync, .*found 'magic'$"):
        parsed(BenchConfig, ["--strategies", "none,magic"])
    # a section's refusal (the workload's, baft's, the stores') names the flag under its path
    with pytest.raises(UsageError, match=r"^--checkpoint.baft.writer-priority: expected idle, lowest or normal, found 'fast'$"):
        parsed(BenchConfig, ["--checkpoint.baft.writer-priority", "fast"])
    with pytest.raises(UsageError, match=r"^--checkpoint.baft.replication.rate: expected a number >= 0"):
        parsed(BenchConfig, ["--checkpoint.baft.replication.rate=-1"])
    with pytest.raises(UsageError, match=r"^--checkpoint.baft.planner.fill: expected"):
        parsed(BenchConfig, ["--checkpoint.baft.planner.fill=7"])
    with pytest.raises(SystemExit):  # a required flag missing, a choice not offered: argparse says so
        parsed(DeployConfig, ["--namespace", "ml"])


def test_a_field_without_docstring_or_flag_type_is_refused() -> None:
    @dataclass
    class Undocumented:
        x: int = 1

    @dataclass
    class Mapping:
        m: dict[str, int] = field(default_factory=dict)
        """A mapping."""

    for cls, what in ((Undocumented, "needs a docstring"), (Mapping, "no flag for")):
        with pytest.raises(TypeError, match=what):
            add_config_arguments(argparse.ArgumentParser(), cls)


@pytest.mark.parametrize("command, cls", [("bench", BenchConfig), ("deploy", DeployConfig)])
def test_help_shows_every_option_with_its_docstring(command: str, cls: type, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    options = list(_options(cls))
    assert len(options) > 10
    for o in options:
        assert flag(o.path) in text and o.doc.split()[0] in text, o.path
    assert " ".join(field_docs(cls)["restore_repeats" if cls is BenchConfig else "shm"].split()[:3]) in text


def test_other_commands_do_not_build_the_config_flags() -> None:
    """Reading a config imports its component (and torch); ``baft report`` need not wait for it."""
    assert "--persist-every" in sub_help("bench") and "--checkpoint.baft.writer" in sub_help("bench")
    assert "--persist-every" not in sub_help("bench", "report")
    assert "--checkpoint.baft.writer" not in sub_help("bench", "report")
    args = _parser("bench").parse_args(["bench", "--persist-every", "5"])
    assert args.persist_every == "5"  # a list flag: parsed into [5] by config_from_args


def valid(cls: type, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Configs of ``cls`` built from ``fields``; None where the config refuses the combination."""
    def build(**kw: Any) -> Any:
        try:
            return cls(**kw)
        except ConfigValueError:
            return None

    return st.builds(build, **fields)


quantities = st.sampled_from(["1", "2", "500m", "1Gi", "1.5G", "4Gi", "1e3"])
labels = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,6}[a-z0-9])?", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(valid(DeployConfig, namespace=labels, image=st.from_regex(r"-?[a-z0-9./:@_-]{1,20}", fullmatch=True),
             claim=labels, name=labels, run=labels, harness=st.booleans(), reference_run=st.none() | labels,
             service_account=labels, rendezvous_port=st.integers(1024, 65535), store_port=st.integers(1024, 65535),
             cpu=quantities, memory=quantities, shm=quantities))
def test_deploy_flags_round_trip(cfg: DeployConfig | None) -> None:
    assume(cfg is not None)
    assert parsed(DeployConfig, argv_of(cfg)) == cfg


workloads = valid(WorkloadConfig, model=st.sampled_from(["gpt-tiny", "gpt-small", "mlp", "mlp-bn"]),
                  stages=st.integers(1, 4), data_parallel=st.integers(1, 2), nodes=st.sampled_from([1, 2]),
                  microbatches=st.integers(4, 12), microbatch_size=st.integers(1, 8),
                  schedule=st.sampled_from(["gpipe", "1f1b"]), seed=st.integers(0, 2**31), lr=st.floats(1e-5, 1.0),
                  amp=st.sampled_from(["none", "bf16", "fp16"]))
checkpoints = st.builds(
    lambda **kw: CheckpointConfig(keep=kw.pop("keep"), persist_nice=kw.pop("nice"), async_dcp=kw.pop("dcp"),
                                  baft=BaftConfig(**kw)),
    keep=st.integers(1, 4), nice=st.integers(0, 19),
    dcp=st.builds(AsyncDcpConfig, mode=st.sampled_from(["thread", "process"]), stager=st.booleans()),
    writer=st.sampled_from(["process", "thread", "dcp"]), replicate_every=st.integers(1, 4),
    writer_priority=st.sampled_from(["idle", "normal"]), persist_window_ms=st.floats(0, 50),
    planner=st.builds(PlannerConfig, copier=st.sampled_from(["inline", "thread"]), fill=st.floats(0.05, 1.0)),
    replication=st.builds(ReplicationConfig, replicas=st.integers(0, 3), rate=st.floats(0, 1e9),
                          yield_to_training=st.booleans(), priority=st.sampled_from(["adaptive", "idle", "lowest", "normal"])))


@settings(max_examples=60, deadline=None)
@given(valid(BenchConfig, workload=workloads, checkpoint=checkpoints,
             strategies=st.lists(st.sampled_from([e.name for e in registry.BUILTIN]), min_size=1, max_size=5, unique=True),
             cycles=st.integers(1, 100), block=st.sampled_from([2, 6, 10, 12, 60]), warmup=st.integers(0, 5),
             persist_every=st.lists(st.sampled_from([1, 2, 3, 5, 6, 10]), min_size=1, max_size=2, unique=True),
             link_rate=st.sampled_from([None, "50mbit", "1gbit", "12.5MBps"]), link_classes=st.booleans(),
             floor_arm=st.booleans(), restore_repeats=st.integers(1, 5)))
def test_bench_flags_round_trip(cfg: BenchConfig | None) -> None:
    """Any config the bench takes, as flags (its sections' included), gives itself back."""
    assume(cfg is not None)
    assert parsed(BenchConfig, argv_of(cfg)) == cfg
    assert parsed(BenchConfig, argv_of(cfg, changed_only=True)) == cfg


@settings(max_examples=60, deadline=None)
@given(st.builds(Toy, rate=st.floats(allow_nan=False, allow_infinity=False), level=st.sampled_from([1, 2, 3]),
                 label=st.none() | st.text(st.characters(codec="ascii", exclude_characters="\x00"), min_size=1),
                 names=st.lists(st.from_regex(r"[a-z-]{1,5}", fullmatch=True), min_size=1), loud=st.booleans(),
                 sizes=st.lists(st.integers(-5, 10**6), min_size=1),
                 count=st.integers(0, 10**6)))
def test_every_kind_of_flag_round_trips(cfg: Toy) -> None:
    assert parsed(Toy, argv_of(cfg)) == cfg


def test_bench_layouts_inside_a_stage() -> None:
    assert parsed(BenchConfig, ["--workload.dp-shard", "2"]).world_size == 4
    assert parsed(BenchConfig, ["--workload.tp", "2", "--workload.stages", "4", "--workload.nodes", "2"]).world_size == 8
    with pytest.raises(UsageError, match=r"^--workload.tp: expected 1 with model mlp"):
        parsed(BenchConfig, ["--workload.tp", "2", "--workload.model", "mlp"])
    with pytest.raises(UsageError, match=r"^--workload.nodes: expected a divisor of stages\*data_parallel\*dp_shard\*tp = 6"):
        parsed(BenchConfig, ["--workload.stages", "3", "--workload.dp-shard", "2", "--workload.nodes", "4"])


def test_integer_lists_are_parsed_and_refused_with_the_flag() -> None:
    assert parsed(Toy, ["--count", "1", "--sizes", "3, 7"]).sizes == [3, 7]
    with pytest.raises(UsageError, match=r"^--sizes: expected comma-separated integers, found '3,x'"):
        parsed(Toy, ["--count", "1", "--sizes", "3,x"])
    with pytest.raises(UsageError, match=r"^--block: expected a multiple of 10"):
        parsed(BenchConfig, ["--block", "6"])
    assert parsed(BenchConfig, ["--block", "6", "--persist-every", "2,3"]).period == 6
