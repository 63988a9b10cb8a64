"""The worker spec: everything a worker is told, in one typed object.

The launcher (``harness.run.launcher``) writes it as ``worker-spec.json`` into the run directory
and names the file in ``BAFT_SPEC`` for every worker it starts; on a cluster the ConfigMap of
``baft deploy`` holds the same file. A worker reads nothing else about the run::

    spec = WorkerSpec.load(Path(os.environ[SPEC_VARIABLE]))
    spec.workload.steps, spec.checkpoint.strategy, spec.faults[0].config, spec.stores

The file is the spec's plain form (:meth:`LaunchFacts.plain`): each section is the plain data of
its config dataclass, keys as in the scenario, so a file written before these types existed loads.
The workload's config, :class:`WorkloadConfig`, lives here too: the scenario, the worker and the
runner's reference cache all read it.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from baft import CheckpointConfig
from baft.components import COMPONENTS

from harness.errors import ConfigValueError, ScenarioError, deprecated
from harness.schema import build, found_repr, to_plain
from harness.worker.shapes import PRESETS
from injectors import FAULTS, FaultConfig, FaultConfigError

#: The environment variable naming the worker spec file.
SPEC_VARIABLE = "BAFT_SPEC"

P = TypeVar("P", bound="LaunchFacts")

Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zbv", "dualpipev"]
#: The schedules that give each rank several model chunks (``virtual_stages``).
MULTI_CHUNK: tuple[str, ...] = ("interleaved-1f1b", "interleaved-zb", "zbv", "dualpipev")
#: The schedules whose two chunks per rank sit in a V: rank s holds stages s and 2P-1-s (rank 0 the first
#: and the last).
V_SHAPED: tuple[str, ...] = ("zbv", "dualpipev")
#: The zero-bubble schedules: each backward split into an input-gradient and a weight-gradient pass, the latter
#: filling what were bubbles.
ZERO_BUBBLE: tuple[str, ...] = ("interleaved-zb", "zbv", "dualpipev")


@dataclass(kw_only=True, slots=True)
class WorkloadConfig:
    """The built-in training job."""

    model: Literal["gpt-tiny", "gpt-small", "mlp", "mlp-bn"] = "gpt-tiny"
    """Model preset: a small GPT (dropout, causal attention), an MLP classifier, or the MLP with BatchNorm
    (running statistics that change in every forward)."""
    stages: int = 2
    """Pipeline stages P (1..the model's layer count)."""
    data_parallel: int = 1
    """Data-parallel replicas D of the whole pipeline (identical copies of every stage's state)."""
    dp_shard: int = 1
    """FSDP2 inside each replica: each stage is sharded (``fully_shard``) over this many ranks, each
    training on its own part of the batch. 1: no FSDP."""
    tp: int = 1
    """Tensor parallelism inside each stage (gpt models): every block's MLP split over this many ranks
    (``parallelize_module``, column-wise then row-wise); they see the same data. 1: none."""
    layout: Literal["replica-major", "stage-major"] = "replica-major"
    """The order of the ranks: replica-major (rank = d*P + s without sharding, the default) or stage-major
    (the pipeline dimension outermost, as torchtitan orders its mesh)."""
    resize: Literal["replicas", "stages"] = "replicas"
    """What an elastic restart on fewer (or more) ranks changes: ``replicas``, the data-parallel replicas
    (the stages stay; each replica runs more microbatches so the global batch stays), or ``stages``, the
    pipeline's stage count (the replicas and microbatches stay; each rank holds more or fewer blocks,
    re-cut from the whole model; plain stages only: no FSDP2, TP or virtual stages, and stage counts whose cuts
    of the blocks line up: new stage s begins in old stage s*P/P'). A restore across a
    change of stage count loads the model and the optimizer's moments by name and the rest from the old
    rank that began the new stage; the dropout streams of the blocks that moved are not carried, and the
    verdict says so."""
    microbatches: int = 4
    """Microbatches per iteration and replica (>= stages)."""
    microbatch_size: int = 4
    """Samples per microbatch."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule. ``gpipe``, ``1f1b``: one model chunk per rank. ``interleaved-1f1b`` and the
    zero-bubble ``interleaved-zb`` (torch's ``ScheduleInterleavedZeroBubble``): ``virtual_stages`` chunks per
    rank, looped (rank s holds stages s, s+P, ...). ``zbv`` (ZB-V) and ``dualpipev`` (DeepSeek's DualPipeV): two
    chunks per rank in a V (rank s holds stages s and 2P-1-s). The zero-bubble ones split each backward into an
    input-gradient and a weight-gradient pass and fill the bubbles with the latter."""
    virtual_stages: int = 1
    """Model chunks per rank: ``interleaved-1f1b``, ``interleaved-zb``: >= 2; ``zbv``, ``dualpipev``: 2; the
    others: 1."""
    steps: int = 30
    """Optimizer steps (iterations) to train."""
    seed: int = 0
    """Seed of the model init, the data and every RNG."""
    nodes: int = 1
    """Hosts to spread the ranks over (each its own torchrun agent); must divide P*D."""
    lr: float = 3e-3
    """Peak learning rate of Adam."""
    warmup: int = 10
    """Linear warm-up steps before the cosine decay."""
    dataset_size: int = 512
    """Samples in the synthetic dataset (one epoch)."""
    amp: Literal["none", "bf16", "fp16"] = "none"
    """Mixed precision: each stage's forward under ``torch.autocast`` in bfloat16 or float16 (its
    output back in float32 between stages); ``fp16`` also scales the loss with a ``torch.amp.GradScaler``
    whose overflow check every rank agrees on (a step one stage overflows is skipped by all)."""
    amp_init_scale: float = 65536.0
    """``fp16``: the scaler's first loss scale (large values overflow at first: steps skipped, scale halved)."""
    amp_growth_interval: int = 2000
    """``fp16``: clean steps before the scaler doubles the scale."""
    script: str | None = None
    """A training script to run instead of the built-in pipeline (path relative to the scenario
    file); it reports through ``harness.worker.session.Session``. The built-in's fields are then unused,
    except ``steps`` (how many the script trains), ``seed`` and ``nodes``."""
    command: list[str | int | float] | None = None
    """An unmodified training script and its arguments, ``[SCRIPT, ARG...]`` (the script's path relative
    to the scenario file): run through the harness's boot module (:mod:`harness.worker.boot`), which
    finds its optimizer steps, losses and state without the script's help. ``{run_dir}`` in an argument
    becomes the run's working directory, where the script runs (kept across its restarts, one per
    run). ``steps``: the optimizer steps it is expected to take."""
    nproc: int = 1
    """With ``script`` or ``command``: workers per node."""
    launcher: Literal["torchrun", "python"] = "torchrun"
    """With ``command``: how the script is started. ``torchrun``: as a torchrun worker (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``... in its environment). ``python``: as ``python script.py`` would run it, for a one-process
    script (``nproc: 1``, one node): none of torch.distributed's variables in its environment (a script that
    turns DDP on when ``RANK`` is set takes its single-process path); restarts and faults as with torchrun,
    which still supervises the process."""
    cwd: str | None = None
    """With ``command``: the directory the script runs in (relative to the scenario file), for a script that
    reads relative paths (a config file, ``data/``); null: the run's own working directory. ``{run_dir}`` in an
    argument is the run's directory either way (checkpoints kept apart per run)."""
    adapters: list[str] | None = None
    """With ``command``: the framework adapters to enable, among ``lightning``, ``transformers`` and
    ``accelerate`` (:mod:`harness.worker.adapters`; null: each one whose framework is installed, []: none)."""
    deterministic: bool = False
    """With ``command`` or ``script``: the boot module sets what it can before the script runs:
    ``torch.use_deterministic_algorithms(True)``, one intra-op thread, ``CUBLAS_WORKSPACE_CONFIG``
    (the built-in workload is deterministic by construction)."""
    reproducible: bool | None = None
    """Whether to run the reference twice and compare the two (null: for a ``command`` only). Two
    uninterrupted runs that differ make a bitwise verdict impossible: the faulted run is then judged by
    its loss curve, and the verdict says where the two differed."""
    args: list[str] = field(default_factory=list)
    """With ``script``: its command-line arguments."""
    omit: list[str] = field(default_factory=list)
    """Components the built-in workload's checkpoints deliberately leave out, in every strategy: a
    negative control that makes a broken checkpoint, to show what the verdict says of one."""
    mutant: str | None = None
    """A known checkpoint bug planted in the faulted run's workers (``harness.worker.mutants``), to prove
    the verdict catches it; null: none."""

    def __post_init__(self) -> None:
        layers = PRESETS[self.model].layers
        for name in ("stages", "virtual_stages", "data_parallel", "dp_shard", "tp", "microbatches", "microbatch_size", "steps", "nodes", "dataset_size"):
            value = getattr(self, name)
            if value < 1:
                raise ConfigValueError(name, "an integer >= 1", value)
        if self.schedule in V_SHAPED:
            if self.virtual_stages != 2:
                raise ConfigValueError("virtual_stages", f"2 with schedule {self.schedule} (two model chunks per rank, "
                                       "in a V)", self.virtual_stages)
            if self.schedule == "dualpipev" and self.microbatches < 2 * self.stages:
                raise ConfigValueError("microbatches", f"at least 2*stages ({2 * self.stages}: one per model chunk) "
                                       "with schedule dualpipev", self.microbatches)
        if self.schedule in MULTI_CHUNK:
            if self.virtual_stages < 2:
                raise ConfigValueError("virtual_stages", f"at least 2 with schedule {self.schedule}", self.virtual_stages)
            if self.microbatches % self.stages:
                raise ConfigValueError("microbatches", f"a multiple of stages ({self.stages}) with schedule "
                                       f"{self.schedule}", self.microbatches)
        elif self.virtual_stages != 1:
            raise ConfigValueError("virtual_stages", f"1 with schedule {self.schedule}", self.virtual_stages)
        if self.stages * self.virtual_stages > layers:
            raise ConfigValueError("stages", f"at most {layers // self.virtual_stages} for {self.model} with "
                                   f"{self.virtual_stages} virtual stages", self.stages)
        if self.microbatches < self.stages:
            raise ConfigValueError("microbatches", f"at least stages ({self.stages})", self.microbatches)
        if self.nproc < 1:
            raise ConfigValueError("nproc", "an integer >= 1", self.nproc)
        if self.launcher == "python" and (self.command is None or self.nproc != 1 or self.nodes != 1):
            raise ConfigValueError("launcher", "torchrun, or python for a one-process command (command set, nproc 1, "
                                   "nodes 1)", self.launcher)
        if self.cwd is not None and self.command is None:
            raise ConfigValueError("cwd", "null without command (the directory an unmodified script runs in)", self.cwd)
        if self.world_size % self.nodes:
            raise ConfigValueError("nodes", f"a divisor of stages*data_parallel*dp_shard*tp = {self.world_size}", self.nodes)
        if self.seed < 0:
            raise ConfigValueError("seed", "an integer >= 0", self.seed)
        if self.lr <= 0:
            raise ConfigValueError("lr", "a number > 0", self.lr)
        if self.warmup < 0:
            raise ConfigValueError("warmup", "an integer >= 0", self.warmup)
        if self.tp > 1:
            shape = PRESETS[self.model]
            if shape.kind != "gpt":
                raise ConfigValueError("tp", f"1 with model {self.model} (tensor parallelism splits gpt blocks' MLPs)", self.tp)
            if (4 * shape.width) % self.tp:
                raise ConfigValueError("tp", f"a divisor of the MLP width {4 * shape.width}", self.tp)
        if self.amp_init_scale <= 0:
            raise ConfigValueError("amp_init_scale", "a number > 0", self.amp_init_scale)
        if self.amp_growth_interval < 1:
            raise ConfigValueError("amp_growth_interval", "an integer >= 1", self.amp_growth_interval)
        allowed = [c for c in COMPONENTS if c not in ("model", "step")]
        for name in self.omit:
            if name not in allowed:
                raise ConfigValueError("omit", "components among " + ", ".join(allowed), name)
        if self.command is not None:
            if (not isinstance(self.command, list) or not self.command
                    or not all(isinstance(a, (str, int, float)) for a in self.command)):
                raise ConfigValueError("command", "a list [SCRIPT, ARG...] of strings", self.command)
            self.command = [str(a) for a in self.command]
            if self.script is not None:
                raise ConfigValueError("command", "either command (an unmodified script) or script (one that "
                                       "opens a Session), not both", self.command)
        if self.adapters is not None:
            from harness.worker.adapters import FRAMEWORKS, installed

            for name in self.adapters:
                if name not in FRAMEWORKS:
                    raise ConfigValueError("adapters", "adapters among " + ", ".join(FRAMEWORKS), name)
                if not installed(name):
                    raise ConfigValueError("adapters", f"an adapter whose framework is installed ({FRAMEWORKS[name]} "
                                           "is not: pip install -c constraints.txt 'baft-harness[frameworks]')", name)
        if self.mutant is not None:
            from harness.worker.mutants import MUTANTS

            if self.mutant not in MUTANTS:
                raise ConfigValueError("mutant", "one of " + ", ".join(MUTANTS), self.mutant)
        if self.dataset_size < self.global_batch:
            raise ConfigValueError("dataset_size", f"at least one global batch ({self.global_batch})", self.dataset_size)

    def resized(self, world_size: int) -> WorkloadConfig:
        """The same training on ``world_size`` ranks: the stages stay, the data-parallel replicas
        change, and each replica runs more (or fewer) microbatches so the global batch stays; each
        node keeps its number of ranks."""
        if world_size == self.world_size:
            return self
        if self.user_code:
            raise ConfigValueError("script" if self.script else "command",
                                   "the built-in workload (a script's world size cannot change)", self.script or self.command)
        if self.resize == "stages":
            return self._restaged(world_size)
        per_replica = self.stages * self.dp_shard * self.tp
        if world_size % per_replica:
            raise ConfigValueError("data_parallel", f"a world size divisible by stages*dp_shard ({per_replica})", world_size)
        replicas = world_size // per_replica
        if (self.microbatches * self.data_parallel) % replicas:
            raise ConfigValueError("microbatches", f"microbatches*data_parallel = {self.microbatches * self.data_parallel} "
                                   f"divisible by {replicas} replicas (the global batch must stay)", self.microbatches)
        per_node = self.world_size // self.nodes  # each node keeps its ranks; the lost ones are gone
        return dataclasses.replace(self, data_parallel=replicas,
                                   microbatches=self.microbatches * self.data_parallel // replicas,
                                   nodes=world_size // per_node if world_size % per_node == 0 else self.nodes)

    def _restaged(self, world_size: int) -> WorkloadConfig:
        """``resized`` with ``resize: stages``: the replicas stay, the stage count becomes
        ``world_size / data_parallel``."""
        for name in ("dp_shard", "tp", "virtual_stages"):
            if getattr(self, name) != 1:
                raise ConfigValueError(name, "1 with resize: stages (a restore across stage counts re-cuts plain "
                                       "stages)", getattr(self, name))
        if world_size % self.data_parallel:
            raise ConfigValueError("data_parallel", f"a divisor of the new world size {world_size} (resize: stages "
                                   "keeps the replicas)", self.data_parallel)
        stages = world_size // self.data_parallel
        layers = PRESETS[self.model].layers
        if stages > layers:
            raise ConfigValueError("stages", f"at most {layers} stages for {self.model} after the resize to "
                                   f"{world_size} ranks", stages)
        if self.microbatches < stages:
            raise ConfigValueError("microbatches", f"at least the {stages} stages after the resize to {world_size} "
                                   "ranks", self.microbatches)
        shape = PRESETS[self.model]
        # a new stage takes its RNGs and data position from the old stage its blocks begin in, which the
        # restore finds as stage s*P/P' (baft.mesh.topology.restage_source): true of even cuts, not of every cut
        for s in range(stages):
            first = shape.stage_blocks(s, stages).start
            begins = next(o for o in range(self.stages) if first in shape.stage_blocks(o, self.stages))
            if begins != s * self.stages // stages:
                raise ConfigValueError("stages", f"a stage count whose cut of {self.model}'s {shape.blocks} blocks "
                                       f"lines up with the cut into {stages} after the resize to {world_size} ranks "
                                       "(with resize: stages; both dividing the blocks evenly does)", self.stages)
        per_node = self.world_size // self.nodes
        return dataclasses.replace(self, stages=stages,
                                   nodes=world_size // per_node if world_size % per_node == 0 else self.nodes)

    @property
    def user_code(self) -> bool:
        """Whether the workload is a user's script (``script`` or ``command``), not the built-in one."""
        return self.script is not None or self.command is not None

    @property
    def world_size(self) -> int:
        return (self.nproc * self.nodes if self.user_code
                else self.stages * self.data_parallel * self.dp_shard * self.tp)

    @property
    def global_batch(self) -> int:
        return self.microbatches * self.microbatch_size * self.data_parallel * self.dp_shard


@dataclass(kw_only=True, slots=True)
class ProbeConfig:
    """How often the faulted run fingerprints its state (``probe:`` of a scenario). The reference
    fingerprints every step (it runs once and is cached; the resume point is looked for among its
    steps), the faulted run every ``every`` steps and always at a restore and at the end."""

    every: int = 1
    """Fingerprint the state every this many steps (1: every step)."""

    def __post_init__(self) -> None:
        if not isinstance(self.every, int) or self.every < 1:
            raise ConfigValueError("every", "an integer >= 1", self.every)

    def due(self, step: int, steps: int) -> bool:
        """Whether the boundary after ``step`` completed steps is fingerprinted (a restore is, always)."""
        return step % self.every == 0 or step >= steps


@dataclass(kw_only=True, slots=True)
class FaultSpec:
    """One fault of the run: its kind (the scenario's YAML key) and its config."""

    kind: str
    """The key in ``injectors.FAULTS``: ``kill``, ``node_loss``, ``throttle``, ..."""
    config: FaultConfig
    """Its validated config (the class ``FAULTS[kind]`` names)."""

    def __post_init__(self) -> None:
        if self.kind not in FAULTS:
            raise FaultConfigError("kind", "a fault kind among " + ", ".join(sorted(FAULTS)), self.kind)
        if not isinstance(self.config, FAULTS[self.kind][0]):
            raise FaultConfigError("config", f"a {FAULTS[self.kind][0].__name__}", type(self.config).__name__)


def build_fault(item: Any, file: str, path: str) -> FaultSpec:
    """A :class:`FaultSpec` from its plain form ``{kind: ..., config: {...}}``."""
    if not isinstance(item, dict) or set(item) != {"kind", "config"}:
        raise ScenarioError(file, path, "a mapping with the keys kind and config", found_repr(item))
    kind = item["kind"]
    if not isinstance(kind, str) or kind not in FAULTS:
        raise ScenarioError(file, f"{path}.kind", "a fault kind among " + ", ".join(sorted(FAULTS)), found_repr(kind))
    config_cls, _ = FAULTS[kind]
    return FaultSpec(kind=kind, config=build(config_cls, item["config"], file, f"{path}.config"))


@dataclass(kw_only=True, slots=True)
class LaunchFacts:
    """What the launcher tells every worker it starts, whatever the worker runs: where the run
    lives, when it started, and the node stores. The specs of what workers run derive from it."""

    stores: list[str] | None = None
    """host:port of every node's ``baft`` store, by node index (None: no stores, no peers)."""
    node_memory: str | None = None
    """With stores: the run's shared-memory directory; node i keeps its slots in ``node<i>``."""
    run_dir: str = ""
    """The run directory (absolute): the journal, the fault markers and the logs go there."""
    started_at: float = 0.0
    """``time.time()`` when the launcher started the job: the origin of the faults' time
    triggers, the same for every worker and restart."""
    reference: str | None = None
    """A faulted run of a ``command`` workload: the reference run's directory, whose fingerprints the
    boot module matches a restarted script's first state against (where did it resume?)."""

    def __post_init__(self) -> None:
        if (self.stores is None) != (self.node_memory is None):
            raise ConfigValueError("node_memory", "both stores and node_memory, or neither", self.node_memory)

    def plain(self) -> dict[str, Any]:
        """The spec as plain data (what the file holds): the fields of the subclass first, then
        those of the placement; a field that is None is left out (it is None when read back)."""
        own = {f.name for f in dataclasses.fields(LaunchFacts)}
        names = [f.name for f in dataclasses.fields(self)]
        ordered = [n for n in names if n not in own] + [n for n in names if n in own]
        return {n: to_plain(getattr(self, n)) for n in ordered if getattr(self, n) is not None}

    def __getitem__(self, key: str) -> Any:
        """Deprecated: the spec read as the mapping it once was (``run.spec["workload"]["steps"]``): the
        field as plain data. Read it by attribute (``run.spec.workload.steps``)."""
        deprecated('the worker spec read by key (spec["..."])', "its attributes (spec.workload.steps)")
        return self.plain()[key]

    def get(self, key: str, default: Any = None) -> Any:
        """Deprecated, like :meth:`__getitem__`."""
        deprecated('the worker spec read by key (spec["..."])', "its attributes (spec.workload.steps)")
        return self.plain().get(key, default)

    def __contains__(self, key: object) -> bool:
        """Deprecated, like :meth:`__getitem__` (``"workload" in spec``)."""
        deprecated('the worker spec read by key (spec["..."])', "its attributes (spec.workload.steps)")
        return key in self.plain()

    def __iter__(self) -> Any:
        """Deprecated, like :meth:`__getitem__` (its keys, as the mapping's)."""
        deprecated('the worker spec read by key (spec["..."])', "its attributes (spec.workload.steps)")
        return iter(self.plain())

    def dumps(self) -> str:
        """The file's text."""
        return json.dumps(self.plain(), indent=1)

    @classmethod
    def from_plain(cls: type[P], data: Any, file: str) -> P:
        """Build the spec from plain data; errors name ``file`` and the key path."""
        return build(cls, data, file)

    @classmethod
    def load(cls: type[P], path: Path) -> P:
        """Read a spec file."""
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ScenarioError(str(path), "", "a readable worker spec (JSON)", f"<{e}>") from None
        return cls.from_plain(data, str(path))


@dataclass(kw_only=True, slots=True)
class WorkerSpec(LaunchFacts):
    """Everything a worker of a scenario run is told: the built-in workload or a user's script
    (``harness.worker.session.Session`` reads it), on its node."""

    workload: WorkloadConfig
    """The workload (``workload:`` of the scenario). A script reads ``steps`` and ``seed``."""
    checkpoint: CheckpointConfig
    """The checkpoint policy (``checkpoint:``), its directories pointed into the run."""
    faults: list[FaultSpec] = field(default_factory=list)
    """The faults (``faults:``); a worker arms those whose site is the worker."""
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    """How often the state is fingerprinted (``probe:``; the reference: every step)."""
    flush_on_sigterm: bool = False
    """The built-in workload answers SIGTERM by persisting at the next step boundary (a preemption;
    ``harness.worker.preemption``): set for runs with a ``preempt`` fault, and always on a cluster."""

    @property
    def preemptible(self) -> bool:
        """Whether the built-in workload should answer SIGTERM (``flush_on_sigterm``, or a preempt fault)."""
        return self.flush_on_sigterm or any(f.kind == "preempt" for f in self.faults)

    @classmethod
    def from_plain(cls, data: Any, file: str) -> WorkerSpec:
        if not isinstance(data, dict):
            raise ScenarioError(file, "", "a mapping (a worker spec)", found_repr(data))
        items = data.get("faults") or []
        if not isinstance(items, list):
            raise ScenarioError(file, "faults", "a list of faults", found_repr(items))
        spec = build(cls, {k: v for k, v in data.items() if k != "faults"}, file)
        spec.faults = [build_fault(item, file, f"faults[{i}]") for i, item in enumerate(items)]
        return spec

