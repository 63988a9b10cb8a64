"""The scenario file: a public contract, loaded and validated before anything runs.

    name: kill-rank1-step17
    workload: {model: gpt-tiny, stages: 2, data_parallel: 1, microbatches: 4, schedule: 1f1b, steps: 30, seed: 0, nodes: 1}
    checkpoint: {strategy: sync, every: 5}
    faults:
      - kill: {rank: 1, at_step: 17}
    expect: {bitwise: true, max_lost_steps: 5}

Each section maps one to one onto a component's config dataclass
(``WorkloadConfig``, ``baft.CheckpointConfig``, the fault configs registered in
``injectors.FAULTS``, ``analysis.verdict.ExpectConfig``, :class:`RunConfig`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from baft import CheckpointConfig
from baft.strategies.registry import CHECKPOINT_PHASES, TRAITS

from analysis.verdict import ExpectConfig
from harness.errors import ConfigValueError, ScenarioError
from harness.schema import build, found_repr
from harness.worker.spec import ZERO_BUBBLE, FaultSpec, ProbeConfig, WorkloadConfig
from injectors import FAULTS, FaultConfig, HostUnsupported, PointFault, RunShape

#: Seconds a worker may take to exit once every rank journaled its last step (``run.exit_timeout``).
EXIT_TIMEOUT = 30.0


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """How the harness runs the scenario."""

    max_restarts: int = 3
    """torchrun ``--max-restarts`` of every agent."""
    timeout: float = 600.0
    """Seconds before a run is killed and judged failed."""
    network: Literal["loopback", "netns"] = "loopback"
    """``loopback``: every node on the host's loopback. ``netns``: each node (its torchrun agent,
    workers and store) in its own network namespace on a bridge, so links can be throttled or cut;
    implied by link faults; needs root."""
    hang_timeout: float | None = 60.0
    """Seconds without progress in the journal after which the watchdog declares a hang, kills
    the stuck workers and lets torchrun restart the job (null: no watchdog)."""
    startup_timeout: float = 60.0
    """Seconds the job may take from its launch (or a restart) to its first step: imports, rendezvous,
    a restore. A script that takes no optimizer step in that time is stopped (the watchdog's; for an
    unmodified script also in its reference run)."""
    exit_timeout: float = EXIT_TIMEOUT
    """Seconds a worker may take to exit once every rank journaled its last step; one still alive then is
    stuck in its teardown: the harness says where (``teardown_hang``), ends the job and counts the run as
    completed (a finding about the job's stack, not a fault nor a lost step)."""
    last_call: float = 10.0
    """Seconds an elastic rendezvous (a node lost for good) waits for more nodes once the minimum
    has joined; a node that restarts later than this is left out (torchrun's default is 30)."""

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ConfigValueError("max_restarts", "an integer >= 0", self.max_restarts)
        if self.timeout <= 0:
            raise ConfigValueError("timeout", "a number > 0", self.timeout)
        if self.hang_timeout is not None and self.hang_timeout <= 0:
            raise ConfigValueError("hang_timeout", "a number > 0 (or null)", self.hang_timeout)
        if self.last_call <= 0:
            raise ConfigValueError("last_call", "a number of seconds > 0", self.last_call)
        if self.startup_timeout <= 0:
            raise ConfigValueError("startup_timeout", "a number of seconds > 0", self.startup_timeout)
        if self.exit_timeout <= 0:
            raise ConfigValueError("exit_timeout", "a number of seconds > 0", self.exit_timeout)


@dataclass(kw_only=True, slots=True)
class Scenario:
    """A validated scenario."""

    name: str
    description: str = ""
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    faults: list[FaultSpec] = field(default_factory=list)
    expect: ExpectConfig = field(default_factory=ExpectConfig)
    run: RunConfig = field(default_factory=RunConfig)
    marks: list[str] = field(default_factory=list)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    """pytest marks of the scenario's test item (``pytest scenarios/``), e.g. ``[slow, netns]``."""
    source: str = ""
    """The file it was loaded from (not a YAML key)."""

    @property
    def uses_netns(self) -> bool:
        """Whether the nodes run in network namespaces (link faults, or asked for)."""
        return self.run.network == "netns" or any(f.config.site == "harness" for f in self.faults)

    def harness_faults(self) -> list[tuple[int, FaultConfig]]:
        """(fault id, config) of the faults the harness drives."""
        return [(i, f.config) for i, f in enumerate(self.faults) if f.config.site == "harness"]

    @property
    def lost_nodes(self) -> list[int]:
        """Nodes a fault takes away for good (no replacement comes)."""
        return sorted({getattr(f.config, "node") for f in self.faults if getattr(f.config, "replacement", True) is False})

    @property
    def joined_nodes(self) -> list[int]:
        """Nodes a ``node_join`` fault brings back (after a fault took them away for good)."""
        return sorted({getattr(f.config, "node") for f in self.faults if f.kind == "node_join"})

    @property
    def lost_for_good(self) -> list[int]:
        """Nodes gone at the end of the run: lost for good and never joining again."""
        return [n for n in self.lost_nodes if n not in self.joined_nodes]


_SECTIONS = {"name", "description", "workload", "checkpoint", "faults", "expect", "run", "marks", "probe"}


def parse(data: Any, file: str, host: bool = True, files: bool = True) -> Scenario:
    """Build a :class:`Scenario` from parsed YAML, raising :class:`ScenarioError` on any problem.

    ``host``: also check that this machine can inject the faults (root, ``tc``, netem); a run on a
    cluster (``--target k8s``) passes False, Chaos Mesh injects them there. ``files``: the workload's
    script is here, beside the scenario file: resolve its path and check it exists (the harness Job of
    a cluster run passes False: the script is in the training pods' image, not beside its copy of the
    scenario)."""
    if not isinstance(data, dict):
        raise ScenarioError(file, "", "a mapping with name, workload, checkpoint, faults, expect", found_repr(data))
    for key in data:
        if key not in _SECTIONS:
            raise ScenarioError(file, str(key), "one of the keys " + ", ".join(sorted(_SECTIONS)), "<an unknown key>")
    if "name" not in data:
        raise ScenarioError(file, "name", "a string", "<nothing: the key is required>")
    name = data["name"]
    if not isinstance(name, str) or not name.strip():
        raise ScenarioError(file, "name", "a non-empty string", found_repr(name))
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ScenarioError(file, "description", "a string", found_repr(description))
    marks = data.get("marks") or []
    if not isinstance(marks, list) or not all(isinstance(m, str) and m.isidentifier() for m in marks):
        raise ScenarioError(file, "marks", "a list of pytest mark names", found_repr(marks))
    workload = build(WorkloadConfig, data.get("workload"), file, "workload")
    if workload.script is not None and files:
        script = (Path(file).parent / workload.script).resolve()
        if not script.is_file():
            raise ScenarioError(file, "workload.script", "an existing training script (relative to the scenario file)",
                                str(script))
        workload.script = str(script)
    if workload.command is not None and files:
        script = (Path(file).parent / str(workload.command[0])).resolve()
        if not script.is_file():
            raise ScenarioError(file, "workload.command[0]", "an existing training script (relative to the scenario "
                                "file)", str(script))
        workload.command = [str(script), *workload.command[1:]]
    if workload.cwd is not None and files:
        cwd = (Path(file).parent / workload.cwd).resolve()
        if not cwd.is_dir():
            raise ScenarioError(file, "workload.cwd", "an existing directory (relative to the scenario file)", str(cwd))
        workload.cwd = str(cwd)
    checkpoint = build(CheckpointConfig, data.get("checkpoint"), file, "checkpoint")
    expect = build(ExpectConfig, data.get("expect"), file, "expect")
    run = build(RunConfig, data.get("run"), file, "run")
    probe = build(ProbeConfig, data.get("probe"), file, "probe")
    shape = RunShape(world_size=workload.world_size, steps=workload.steps, nodes=workload.nodes)
    faults = parse_faults(data.get("faults") or [], file, shape, host)
    check_phases(faults, checkpoint, file, workload.nodes, command=workload.command is not None,
                 split_backward=workload.schedule in ZERO_BUBBLE)
    check_restarts(faults, run, file, workload.steps)
    check_elastic(faults, workload, checkpoint, expect, file)
    if expect.caught is not None and workload.mutant is None:
        raise ScenarioError(file, "workload.mutant", "a planted bug (expect.caught says how it must be caught)", None)
    if any(f.config.site == "harness" for f in faults) and workload.nodes < 2 and run.network != "netns":
        raise ScenarioError(file, "workload.nodes", "at least 2 nodes for link faults", workload.nodes)
    if host and (any(f.config.site == "harness" for f in faults) or run.network == "netns"):
        from injectors.network import require_network_privileges

        try:
            require_network_privileges()
        except HostUnsupported as e:
            raise ScenarioError(file, "run.network", "a host that can create network namespaces", f"<{e}>") from None
    return Scenario(name=name, description=description, workload=workload, checkpoint=checkpoint,
                    faults=faults, expect=expect, run=run, marks=marks, source=file, probe=probe)


def parse_faults(items: Any, file: str, shape: RunShape, host: bool = True) -> list[FaultSpec]:
    if not isinstance(items, list):
        raise ScenarioError(file, "faults", "a list of faults", found_repr(items))
    kinds = ", ".join(sorted(FAULTS))
    out = []
    for i, item in enumerate(items):
        path = f"faults[{i}]"
        if not isinstance(item, dict) or len(item) != 1:
            raise ScenarioError(file, path, f"a mapping with exactly one key, the fault kind ({kinds})", found_repr(item))
        ((kind, body),) = item.items()
        if kind not in FAULTS:
            raise ScenarioError(file, f"{path}.{kind}", f"a fault kind among {kinds}", "<an unknown fault>")
        config_cls, _ = FAULTS[kind]
        config = build(config_cls, body, file, f"{path}.{kind}")
        try:
            config.check(shape)
        except ValueError as e:
            raise ScenarioError(file, f"{path}.{kind}.{e.field}", e.expected, e.found) from None  # type: ignore[attr-defined]
        try:
            if host:
                config.preflight()
        except HostUnsupported as e:
            raise ScenarioError(file, f"{path}.{kind}", "a host that can inject this fault", f"<{e}>") from None
        out.append(FaultSpec(kind=kind, config=config))
    return out


#: Phases the storage faults derive from a strategy's: ``saved`` follows each ``persist``.
_FOLLOWS = {"saved": "persist"}


#: The phases the boot module announces in an unmodified script (``workload.command``).
COMMAND_PHASES = ("iteration", "data", "save", "restore")


def check_phases(faults: list[FaultSpec], checkpoint: CheckpointConfig, file: str, nodes: int,
                 command: bool = False, split_backward: bool = False) -> None:
    """A fault keyed to a strategy's phase must be able to fire under this scenario's strategy
    (each strategy declares the phases it announces, ``baft.strategies.Strategy.phases``); in an
    unmodified script (``command``) only :data:`COMMAND_PHASES` are announced; ``backward_weight`` only where
    the schedule splits the backward (``split_backward``: a zero-bubble one)."""
    strategy = TRAITS[checkpoint.strategy]
    for i, f in enumerate(faults):
        phase = getattr(f.config, "phase", "iteration")
        at = getattr(f.config, "at_step", None)
        path = f"faults[{i}].{f.kind}"
        if command and hasattr(f.config, "phase") and phase not in COMMAND_PHASES:
            raise ScenarioError(file, f"{path}.phase", "a phase the harness sees in an unmodified script: "
                                + ", ".join(COMMAND_PHASES) + " (the optimizer's pre-step hook, the DataLoader's "
                                "next batch, torch.save, a restarted process's first load)", phase)
        if command and phase == "restore" and getattr(f.config, "at_restore", None) is None:
            raise ScenarioError(file, f"{path}.phase", "restore with the trigger at_restore (a restarted process's "
                                "first load, in an unmodified script)", phase)
        if not command and phase == "save":
            raise ScenarioError(file, f"{path}.phase", "a phase of this workload (save is torch.save in an unmodified "
                                "script, workload.command; a strategy's write is persist)", phase)
        if not command and phase == "backward_weight" and not split_backward:
            raise ScenarioError(file, f"{path}.phase", "a phase of this workload (backward_weight, the weight-gradient "
                                "half of a split backward, comes only on a zero-bubble schedule: "
                                + ", ".join(ZERO_BUBBLE) + ")", phase)
        announced = _FOLLOWS.get(phase, phase)
        if command and phase == "restore":
            continue  # the script's own load announces it (harness.worker.hooks), whatever the strategy
        if announced in CHECKPOINT_PHASES and announced not in strategy.phases:
            names = " or ".join(n for n, t in TRAITS.items() if announced in t.phases)
            raise ScenarioError(file, f"{path}.phase", f"a phase checkpoint strategy {checkpoint.strategy!r} announces "
                                f"({phase} needs {names})", phase)
        if announced == "persist" and at is not None and checkpoint.mtbf_hours is not None:
            raise ScenarioError(file, f"{path}.at_step", "no step (checkpoint.mtbf_hours makes the persist interval adapt: "
                                "which steps persist is known only while the job runs; use at_time or every)", at)
        if announced == "persist" and at is not None and (at == 0 or at % checkpoint.every):
            raise ScenarioError(file, f"{path}.at_step", f"a step baft persists (a multiple of checkpoint.every = {checkpoint.every})", at)
        if announced == "replicate" and (checkpoint.baft.replication.replicas < 1 or nodes < 2):
            raise ScenarioError(file, f"{path}.phase", "replication, which needs workload.nodes >= 2 and "
                                "checkpoint.baft.replication.replicas >= 1", phase)


def check_restarts(faults: list[FaultSpec], run: RunConfig, file: str, steps: int) -> None:
    """Every restart the faults will certainly cause needs one of torchrun's ``max_restarts``;
    a hang also needs the watchdog."""
    needed = 0
    for i, f in enumerate(faults):
        if f.kind == "hang" and run.hang_timeout is None:
            raise ScenarioError(file, "run.hang_timeout", "a number of seconds (a hang fault needs the watchdog)", None)
        if f.config.fatal and isinstance(f.config, PointFault):
            needed += f.config.expected_occurrences(steps) or 0
    # a fault in the N-th restart's restore needs N restarts the other faults certainly cause, and one of its own
    during = [(i, f.config.at_restore) for i, f in enumerate(faults)
              if isinstance(f.config, PointFault) and f.config.at_restore is not None]
    needed += sum(1 for j, _ in during if faults[j].config.fatal)
    for i, n in during:
        others = needed - int(faults[i].config.fatal)
        if n > others:
            raise ScenarioError(file, f"faults[{i}].{faults[i].kind}.at_restore", f"at most {others}, the restarts the "
                                "other faults certainly cause (a restore happens only after one)", n)
    if needed > run.max_restarts:
        raise ScenarioError(file, "run.max_restarts", f"at least {needed} (the restarts the faults cause)", run.max_restarts)


def check_elastic(faults: list[FaultSpec], workload: WorkloadConfig, checkpoint: CheckpointConfig,
                  expect: ExpectConfig, file: str) -> None:
    """A node lost for good must leave a job that can go on: a world the stages divide, the
    same global batch, a strategy that restores across replica counts, a loss-curve verdict."""
    lost = [(i, f) for i, f in enumerate(faults) if getattr(f.config, "replacement", True) is False]
    check_joins(faults, lost, file)
    if not lost:
        return
    i, f = lost[0]
    path = f"faults[{i}].{f.kind}"
    nodes = workload.nodes - len({getattr(g.config, "node") for _, g in lost})
    if nodes < 1:
        raise ScenarioError(file, f"{path}.node", "at least one node left after the permanent losses", nodes)
    try:
        workload.resized(nodes * (workload.world_size // workload.nodes))
    except ConfigValueError as e:
        raise ScenarioError(file, f"workload.{e.field}", f"{e.expected} after losing {path}.node for good",
                            e.found) from None
    if not TRAITS[checkpoint.strategy].elastic:
        elastic = ", ".join(n for n, t in TRAITS.items() if t.elastic)
        raise ScenarioError(file, "checkpoint.strategy", f"a strategy that restores on fewer replicas ({elastic}) "
                            "when a node is lost for good", checkpoint.strategy)
    if expect.loss is None:
        raise ScenarioError(file, "expect.loss", "a loss-curve tolerance (bitwise equality cannot hold across "
                            "world sizes once a node is lost for good)", None)


def check_joins(faults: list[FaultSpec], lost: list[tuple[int, FaultSpec]], file: str) -> None:
    """A node joins once, after an earlier fault took it away for good (at an earlier step, where both
    fire at steps)."""
    seen: set[int] = set()
    for i, f in enumerate(faults):
        if f.kind != "node_join":
            continue
        node = f.config.node  # type: ignore[attr-defined]
        path = f"faults[{i}].node_join"
        if node in seen:
            raise ScenarioError(file, f"{path}.node", "a node that joins once (one node_join per node)", node)
        seen.add(node)
        losses = [(j, g) for j, g in lost if getattr(g.config, "node") == node]
        if not losses:
            raise ScenarioError(file, f"{path}.node", "a node an earlier fault takes away for good (node_loss with "
                                "replacement: false, or preempt with restart: false)", node)
        j, g = losses[0]
        for key in ("at_step", "at_time"):  # both on the same clock: the loss first (on two clocks: not known here)
            before, when = getattr(g.config, key, None), getattr(f.config, key, None)
            if when is not None and before is not None and before >= when:
                raise ScenarioError(file, f"{path}.{key}", f"a {'step' if key == 'at_step' else 'time'} after "
                                    f"faults[{j}].{g.kind}.{key} ({before}), when the node is gone", when)


def load(path: str | Path, host: bool = True, files: bool = True) -> Scenario:
    """Read and validate a scenario file (``host``, ``files``: see :func:`parse`)."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioError(file, "", "a readable scenario file", f"<{e.strerror or e}>") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ScenarioError(file, "", "valid YAML", f"<{problem}{where}>") from None
    return parse(data, file, host, files)
