"""The reference workload: pipeline-parallel training that the harness launches under torchrun.

P pipeline stages x D data-parallel replicas (world size P*D, rank = d*P + s).
Each replica is a ``torch.distributed.pipelining`` pipeline (GPipe or 1F1B on
gloo); after the schedule's backward, each stage all-reduces its gradients over
its D replicas; then Adam and a warm-up + cosine LR schedule step. All of it is
bitwise deterministic for a fixed world size: deterministic algorithms, one
intra-op thread, seeded init, per-rank dropout seeds, and a data pipeline whose
only state is checkpointed.

Run as ``python -m harness.worker.workload RUN_CONFIG.json`` (by the launcher).
"""
from __future__ import annotations

import dataclasses
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist

from harness.errors import ConfigValueError, ScenarioError
from harness.worker.models import PRESETS

Schedule = Literal["gpipe", "1f1b", "interleaved-1f1b"]


@dataclass(kw_only=True, slots=True)
class WorkloadConfig:
    """The built-in training job."""

    model: Literal["gpt-tiny", "gpt-small", "mlp"] = "gpt-tiny"
    """Model preset: a small GPT (dropout, causal attention) or an MLP classifier."""
    stages: int = 2
    """Pipeline stages P (1..the model's layer count)."""
    data_parallel: int = 1
    """Data-parallel replicas D of the whole pipeline."""
    microbatches: int = 4
    """Microbatches per iteration and replica (>= stages)."""
    microbatch_size: int = 4
    """Samples per microbatch."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule; ``interleaved-1f1b`` gives each rank ``virtual_stages`` model chunks."""
    virtual_stages: int = 1
    """Model chunks per rank (interleaved schedules: >= 2; the others: 1)."""
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
    script: str | None = None
    """A training script to run instead of the built-in pipeline (path relative to the scenario
    file); it reports through ``harness.worker.session.Session``. The built-in's fields are then unused,
    except ``steps`` (how many the script trains), ``seed`` and ``nodes``."""
    nproc: int = 1
    """With ``script``: workers per node."""
    args: list[str] = field(default_factory=list)
    """With ``script``: its command-line arguments."""
    mutant: str | None = None
    """A known checkpoint bug planted in the faulted run's workers (``harness.worker.mutants``), to prove
    the verdict catches it; null: none."""

    def __post_init__(self) -> None:
        layers = PRESETS[self.model].layers
        for name in ("stages", "virtual_stages", "data_parallel", "microbatches", "microbatch_size", "steps", "nodes", "dataset_size"):
            value = getattr(self, name)
            if value < 1:
                raise ConfigValueError(name, "an integer >= 1", value)
        if self.schedule == "interleaved-1f1b":
            if self.virtual_stages < 2:
                raise ConfigValueError("virtual_stages", "at least 2 with schedule interleaved-1f1b", self.virtual_stages)
            if self.microbatches % self.stages:
                raise ConfigValueError("microbatches", f"a multiple of stages ({self.stages}) with an interleaved schedule", self.microbatches)
        elif self.virtual_stages != 1:
            raise ConfigValueError("virtual_stages", f"1 with schedule {self.schedule}", self.virtual_stages)
        if self.stages * self.virtual_stages > layers:
            raise ConfigValueError("stages", f"at most {layers // self.virtual_stages} for {self.model} with "
                                   f"{self.virtual_stages} virtual stages", self.stages)
        if self.microbatches < self.stages:
            raise ConfigValueError("microbatches", f"at least stages ({self.stages})", self.microbatches)
        if self.nproc < 1:
            raise ConfigValueError("nproc", "an integer >= 1", self.nproc)
        if self.world_size % self.nodes:
            raise ConfigValueError("nodes", f"a divisor of stages*data_parallel = {self.world_size}", self.nodes)
        if self.seed < 0:
            raise ConfigValueError("seed", "an integer >= 0", self.seed)
        if self.lr <= 0:
            raise ConfigValueError("lr", "a number > 0", self.lr)
        if self.warmup < 0:
            raise ConfigValueError("warmup", "an integer >= 0", self.warmup)
        if self.mutant is not None:
            from harness.worker.mutants import MUTANTS

            if self.mutant not in MUTANTS:
                raise ConfigValueError("mutant", "one of " + ", ".join(MUTANTS), self.mutant)
        if self.dataset_size < self.global_batch:
            raise ConfigValueError("dataset_size", f"at least one global batch ({self.global_batch})", self.dataset_size)

    def resized(self, world_size: int) -> WorkloadConfig:
        """The same training on ``world_size`` ranks: the stages stay, the data-parallel replicas
        change, and each replica runs more (or fewer) microbatches so the global batch stays."""
        if world_size == self.world_size:
            return self
        if self.script is not None:
            raise ConfigValueError("script", "the built-in workload (a script's world size cannot change)", self.script)
        if world_size % self.stages:
            raise ConfigValueError("data_parallel", f"a world size divisible by stages ({self.stages})", world_size)
        replicas = world_size // self.stages
        if (self.microbatches * self.data_parallel) % replicas:
            raise ConfigValueError("microbatches", f"microbatches*data_parallel = {self.microbatches * self.data_parallel} "
                                   f"divisible by {replicas} replicas (the global batch must stay)", self.microbatches)
        return dataclasses.replace(self, data_parallel=replicas,
                                   microbatches=self.microbatches * self.data_parallel // replicas)

    @property
    def world_size(self) -> int:
        return self.nproc * self.nodes if self.script is not None else self.stages * self.data_parallel

    @property
    def global_batch(self) -> int:
        return self.microbatches * self.microbatch_size * self.data_parallel


def lr_lambda(warmup: int, total: int):
    """Linear warm-up then cosine decay to 10% of the peak."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


def set_determinism() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def announce_compute(stage: Any, trainer: Any) -> None:
    """Wrap a stage's per-microbatch forward and backward so each announces itself.

    Before: ``phase`` (``forward`` / ``backward``, step, microbatch) — where faults keyed
    to those phases fire. After: ``compute`` (kind, step, microbatch, seconds) — what a
    straggler scales. Cheap: ``events.emit`` returns at once when nobody listens.
    """
    from baft import events

    for name, kind in (("forward_one_chunk", "forward"), ("backward_one_chunk", "backward")):
        fn = getattr(stage, name)

        def wrapper(mb: int, *args: Any, _fn: Any = fn, _kind: str = kind, **kwargs: Any) -> Any:
            events.emit("phase", phase=_kind, step=trainer.step, microbatch=mb)
            t = time.perf_counter()
            out = _fn(mb, *args, **kwargs)
            events.emit("compute", phase=_kind, step=trainer.step, microbatch=mb, seconds=time.perf_counter() - t)
            return out

        setattr(stage, name, wrapper)


class PipelineTrainer:
    """One rank of the reference workload: its stage, schedule, optimizer and data.

    ``iteration`` runs one training step and calls the checkpointer's hooks at
    the right moments: ``begin_iteration`` at the step boundary (before the
    data pipeline moves on), ``before_optimizer_step`` after the last backward.
    """

    def __init__(self, cfg: WorkloadConfig) -> None:
        from baft import TrainState
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

        from harness.worker.data import ResumableBatchSampler, make_dataset, make_loader, mix
        from harness.worker.models import build_stage, loss_fn

        self.cfg = cfg
        self.rank = dist.get_rank()
        P, D = cfg.stages, cfg.data_parallel
        self.stage_index, self.replica = self.rank % P, self.rank // P
        s, d = self.stage_index, self.replica
        # Every rank creates every group in the same order (a collective requirement).
        pp_groups = [dist.new_group([dd * P + ss for ss in range(P)]) for dd in range(D)]
        dp_groups = [dist.new_group([dd * P + ss for dd in range(D)]) for ss in range(P)]
        self.pp_group, self.dp_group = pp_groups[d], dp_groups[s]

        shape = PRESETS[cfg.model]
        V = cfg.virtual_stages
        # Rank s holds model chunks s, s+P, s+2P, ... (one chunk without interleaving).
        chunks = [build_stage(shape, cfg.seed, s + k * P, P * V) for k in range(V)]
        self.module = chunks[0] if V == 1 else torch.nn.ModuleList(chunks)
        seed_everything(mix(cfg.seed, 100, self.rank))  # dropout differs per rank, reproducibly
        self.stages = [
            PipelineStage(m, s + k * P, P * V, torch.device("cpu"), group=self.pp_group) for k, m in enumerate(chunks)
        ]
        self.step = 0
        for st in self.stages:
            announce_compute(st, self)
        if cfg.schedule == "interleaved-1f1b":
            self.schedule = ScheduleInterleaved1F1B(self.stages, n_microbatches=cfg.microbatches, loss_fn=loss_fn)
        else:
            schedule_cls = Schedule1F1B if cfg.schedule == "1f1b" else ScheduleGPipe
            self.schedule = schedule_cls(self.stages[0], n_microbatches=cfg.microbatches, loss_fn=loss_fn)
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=cfg.lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg.warmup, cfg.steps))

        loader_gen = torch.Generator().manual_seed(mix(cfg.seed, 200))
        sampler = ResumableBatchSampler(cfg.dataset_size, cfg.global_batch, loader_gen, d, D)
        loader = make_loader(make_dataset(shape, cfg.seed, cfg.dataset_size), sampler, loader_gen)
        # Creating a DataLoader iterator draws a base seed from the loader's generator;
        # do it before any restore so the restored generator state is what training sees.
        self.batches = iter(loader)
        self.state = TrainState(
            model=self.module, optimizer=self.optimizer, scheduler=self.scheduler, data=sampler,
            generators={"loader": loader_gen},
        )

    def attach(self, ckpt: Any) -> None:
        stages = self.stages[0] if len(self.stages) == 1 else self.stages
        ckpt.attach(stages, replica=self.replica, replicas=self.cfg.data_parallel, replica_group=self.dp_group)

    def iteration(self, step: int, ckpt: Any) -> float | None:
        """Train iteration ``step``; returns the (replica-averaged) loss on the last stage, else None."""
        from baft import events

        cfg = self.cfg
        first, last = self.stage_index == 0, self.stage_index == cfg.stages - 1
        self.step = step
        events.emit("phase", phase="iteration", step=step)
        ckpt.begin_iteration()
        events.emit("phase", phase="data", step=step)
        x, y = next(self.batches)
        losses: list[torch.Tensor] = []
        self.optimizer.zero_grad(set_to_none=True)
        if first:
            self.schedule.step(x, target=y if last else None, losses=losses if last else None)
        elif last:
            self.schedule.step(target=y, losses=losses)
        else:
            self.schedule.step()
        if cfg.data_parallel > 1:
            for p in self.module.parameters():
                dist.all_reduce(p.grad, group=self.dp_group)
                p.grad.div_(cfg.data_parallel)
        ckpt.before_optimizer_step()
        events.emit("phase", phase="optimizer", step=step)
        self.optimizer.step()
        self.scheduler.step()
        loss = None
        if last:
            mean = torch.stack([l.detach() for l in losses]).mean()
            if cfg.data_parallel > 1:
                dist.all_reduce(mean, group=self.dp_group)
                mean.div_(cfg.data_parallel)
            loss = float(mean)
        self.state.step = step + 1
        return loss


def main(argv: list[str] | None = None) -> int:
    """One worker of a scenario run: build, restore if a checkpoint exists, train, journal every boundary."""
    from harness.schema import build
    from harness.worker.session import SPEC_VARIABLE, Session

    args = argv if argv is not None else sys.argv[1:]
    spec_path = Path(args[0]) if args else Path(os.environ[SPEC_VARIABLE])
    session = Session(spec_path)
    cfg = build(WorkloadConfig, session.spec["workload"], str(spec_path), "workload")
    if cfg.mutant is not None:
        from harness.worker.mutants import apply

        apply(cfg.mutant)
    set_determinism()
    session.start()
    try:
        cfg = cfg.resized(dist.get_world_size())  # an elastic restart on fewer nodes
    except ConfigValueError as e:
        raise ScenarioError(str(spec_path), f"workload.{e.field}", e.expected, e.found) from None
    try:
        trainer = PipelineTrainer(cfg)
        state = trainer.state
        ckpt = session.checkpointer(state)
        trainer.attach(ckpt)
        start = ckpt.restore_latest()
        session.restored(start, state)
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            loss = trainer.iteration(step, ckpt)  # announces the iteration phase itself
            session.end(step, loss, state, seconds=time.perf_counter() - t0)
            ckpt.after_step()
    finally:
        session.disarm()
    ckpt.close()
    session.close(state.step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
