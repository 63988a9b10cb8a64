"""Flags from config dataclasses (``harness/cliconfig.py``): ``baft bench`` and ``baft deploy`` take their
options, defaults and help from ``BenchConfig`` and ``DeployConfig``, and the flags give the config back."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from harness.bench.bench import ALL, BenchConfig
from harness.cli import _parser
from harness.cli import main as cli_main
from harness.cliconfig import add_config_arguments, config_from_args, field_docs, flag
from harness.cluster.deploy import DeployConfig
from harness.errors import ConfigValueError, UsageError

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


def argv_of(cfg: Any) -> list[str]:
    """The flags that give ``cfg`` (as a user would type them; ``=`` so a value may start with ``-``)."""
    out = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if v is None:
            continue
        if isinstance(v, bool):
            out.append(flag(f.name) if v else "--no-" + flag(f.name)[2:])
        else:
            out.append(f"{flag(f.name)}={','.join(map(str, v)) if isinstance(v, list) else v}")
    return out


def parsed(cls: type, argv: list[str]) -> Any:
    p = argparse.ArgumentParser()
    add_config_arguments(p, cls)
    return config_from_args(cls, p.parse_args(argv))


def test_docstrings_are_read_from_the_source() -> None:
    docs = field_docs(Toy)
    assert docs["rate"] == "Parts per second (100% is 1)." and docs["count"] == "How many (required)."
    assert field_docs(BenchConfig)["baft_copier"] == "baft only: who does the snapshot work inside the waits (see baft.bubbles.copier)."


def test_defaults_live_in_the_config() -> None:
    assert parsed(Toy, ["--count", "3"]) == Toy(count=3)
    assert parsed(BenchConfig, []) == BenchConfig()
    assert parsed(DeployConfig, argv_of(DeployConfig(**REQUIRED))[:3]) == DeployConfig(**REQUIRED)
    assert parsed(Toy, ["--count=1", "--names", " x, y,,", "--loud", "--level", "3", "--rate", "2e-3"]) == \
        Toy(count=1, names=["x", "y"], loud=True, level=3, rate=0.002)


def test_the_flags_existing_scripts_use_still_work() -> None:
    cfg = parsed(BenchConfig, ["--cycles", "3", "--warmup", "1", "--strategies", "sync,baft", "--block", "2",
                               "--persist-every", "2", "--microbatches", "4", "--microbatch-size", "2",
                               "--nodes", "2", "--no-replication-yield", "--replicate-every", "2", "--baft-copier",
                               "thread", "--link-rate", "50mbit"])
    assert (cfg.strategies, cfg.persist_every, cfg.microbatch_size, cfg.replication_yield, cfg.link_rate) == \
        (["none", "sync", "baft"], [2], 2, False, "50mbit")

    dep = parsed(DeployConfig, ["--namespace", "ml", "--image", "i:1", "--claim", "shared", "--harness",
                                "--reference-run", "reference", "--cpu", "500m", "--memory", "1Gi", "--shm", "1Gi"])
    assert dep.harness and dep.reference_run == "reference" and (dep.cpu, dep.memory, dep.shm) == ("500m", "1Gi", "1Gi")


def test_a_refused_value_names_its_flag() -> None:
    with pytest.raises(UsageError, match=r"^--count: expected an integer >= 0, found -1$"):
        parsed(Toy, ["--count=-1"])
    with pytest.raises(UsageError, match=r"^--strategies: expected names among none, sync, .*found 'magic'$"):
        parsed(BenchConfig, ["--strategies", "none,magic"])
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
    for name, doc in field_docs(cls).items():
        assert flag(name) in text and doc.split()[0] in text, name
    assert " ".join(field_docs(cls)["seed" if cls is BenchConfig else "shm"].split()[:6]) in text


def test_other_commands_do_not_build_the_config_flags() -> None:
    """Reading a config imports its component (and torch); ``baft report`` need not wait for it."""
    assert "--persist-every" not in _parser("report").format_help()
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


@settings(max_examples=60, deadline=None)
@given(valid(BenchConfig, model=st.sampled_from(["gpt-tiny", "gpt-small", "mlp"]), stages=st.integers(1, 4),
             nodes=st.sampled_from([1, 2]), microbatches=st.integers(4, 12), microbatch_size=st.integers(1, 8),
             schedule=st.sampled_from(["gpipe", "1f1b"]),
             strategies=st.lists(st.sampled_from(ALL), min_size=1, max_size=5, unique=True),
             cycles=st.integers(1, 100), block=st.sampled_from([2, 6, 10, 12, 60]), warmup=st.integers(0, 5),
             persist_every=st.lists(st.sampled_from([1, 2, 3, 5, 6, 10]), min_size=1, max_size=2, unique=True), replicate_every=st.integers(1, 4),
             dcp_async=st.sampled_from(["thread", "process"]), dcp_stager=st.booleans(),
             link_rate=st.sampled_from([None, "50mbit", "1gbit", "12.5MBps"]), replication_yield=st.booleans(),
             baft_copier=st.sampled_from(["inline", "thread"]), restore_repeats=st.integers(1, 5),
             seed=st.integers(0, 2**31)))
def test_bench_flags_round_trip(cfg: BenchConfig | None) -> None:
    assume(cfg is not None)
    assert parsed(BenchConfig, argv_of(cfg)) == cfg


@settings(max_examples=60, deadline=None)
@given(st.builds(Toy, rate=st.floats(allow_nan=False, allow_infinity=False), level=st.sampled_from([1, 2, 3]),
                 label=st.none() | st.text(st.characters(codec="ascii", exclude_characters="\x00"), min_size=1),
                 names=st.lists(st.from_regex(r"[a-z-]{1,5}", fullmatch=True), min_size=1), loud=st.booleans(),
                 sizes=st.lists(st.integers(-5, 10**6), min_size=1),
                 count=st.integers(0, 10**6)))
def test_every_kind_of_flag_round_trips(cfg: Toy) -> None:
    assert parsed(Toy, argv_of(cfg)) == cfg


def test_bench_layouts_inside_a_stage() -> None:
    assert parsed(BenchConfig, ["--dp-shard", "2"]).world_size == 4
    assert parsed(BenchConfig, ["--tp", "2", "--stages", "4", "--nodes", "2"]).world_size == 8
    with pytest.raises(UsageError, match=r"^--tp: expected 1 with model mlp"):
        parsed(BenchConfig, ["--tp", "2", "--model", "mlp"])
    with pytest.raises(UsageError, match=r"^--nodes: expected a divisor of stages\*dp_shard\*tp \(6\)"):
        parsed(BenchConfig, ["--stages", "3", "--dp-shard", "2", "--nodes", "4"])


def test_integer_lists_are_parsed_and_refused_with_the_flag() -> None:
    assert parsed(Toy, ["--count", "1", "--sizes", "3, 7"]).sizes == [3, 7]
    with pytest.raises(UsageError, match=r"^--sizes: expected comma-separated integers, found '3,x'"):
        parsed(Toy, ["--count", "1", "--sizes", "3,x"])
    with pytest.raises(UsageError, match=r"^--block: expected a multiple of 10"):
        parsed(BenchConfig, ["--block", "6"])
    assert parsed(BenchConfig, ["--block", "6", "--persist-every", "2,3"]).period == 6
