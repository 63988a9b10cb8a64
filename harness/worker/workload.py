"""The reference workload: pipeline-parallel training that the harness launches under torchrun.

P pipeline stages x D data-parallel replicas x F FSDP shards x T tensor-parallel ranks: one
DeviceMesh (world size P*D*F*T) in the order ``workload.layout`` names (:data:`MESH_ORDERS`;
replica-major: rank = ((d*F + f)*T + t)*P + s).
Each replica is a ``torch.distributed.pipelining`` pipeline (GPipe or 1F1B on
gloo). Without FSDP, after the schedule's backward each stage all-reduces its
gradients over its D replicas; with F > 1 each stage is ``fully_shard``-ed over its
F shard ranks (and replicated over D: HSDP), and FSDP2 reduces the gradients. Then Adam
and a warm-up + cosine LR schedule step. All of it is
bitwise deterministic for a fixed world size: deterministic algorithms, one
intra-op thread, seeded init, per-rank dropout seeds, and a data pipeline whose
only state is checkpointed.

Run as ``python -m harness.worker.workload WORKER_SPEC.json`` (by the launcher). Its config,
:class:`~harness.worker.spec.WorkloadConfig`, is part of the worker spec.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import random
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from baft import TrainState
from baft.components import COMPONENTS

from harness.errors import ConfigValueError, ScenarioError
from harness.worker.amp import StageScaler
from harness.worker.shapes import PRESETS
from harness.worker.spec import MULTI_CHUNK, V_SHAPED, WorkloadConfig

__all__ = ["PipelineTrainer", "WorkloadConfig", "announce_compute", "lr_lambda", "main", "seed_everything",
           "set_determinism"]


#: The mesh's dimensions, outermost first, of each ``workload.layout``: replica-major keeps the pipeline
#: innermost (rank = d*P + s without sharding), stage-major puts it outermost (torchtitan's order).
MESH_ORDERS = {
    "replica-major": ("dp_replicate", "dp_shard", "tp", "pp"),
    "stage-major": ("pp", "dp_replicate", "dp_shard", "tp"),
}


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

    Before: ``phase`` (``forward`` / ``backward`` / ``backward_weight``, step, microbatch; the last on the
    zero-bubble schedules, whose backward is split) — where faults keyed
    to those phases fire. After: ``compute`` (kind, step, microbatch, seconds) — what a
    straggler scales. Cheap: ``events.emit`` returns at once when nobody listens.
    """
    from baft import events

    for name, kind in (("forward_one_chunk", "forward"), ("backward_one_chunk", "backward"),
                       ("backward_weight_one_chunk", "backward_weight")):
        fn = getattr(stage, name, None)
        if fn is None:
            continue

        def wrapper(mb: int, *args: Any, _fn: Any = fn, _kind: str = kind, **kwargs: Any) -> Any:
            events.emit("phase", phase=_kind, step=trainer.step, microbatch=mb)
            t = time.perf_counter()
            out = _fn(mb, *args, **kwargs)
            events.emit("compute", phase=_kind, step=trainer.step, microbatch=mb, seconds=time.perf_counter() - t)
            return out

        setattr(stage, name, wrapper)


def chunk_stages(cfg: WorkloadConfig, s: int) -> list[int]:
    """The pipeline stage each of rank ``s``'s model chunks is: s, s+P, s+2P, ... (looped; one chunk without
    virtual stages), or s and 2P-1-s on a V-shaped schedule (ZB-V, DualPipeV: rank 0 holds the first and the
    last stage)."""
    P, V = cfg.stages, cfg.virtual_stages
    if cfg.schedule in V_SHAPED:
        return [s, 2 * P - 1 - s]
    return [s + k * P for k in range(V)]


def _stage_chunks(cfg: WorkloadConfig, shape: Any, s: int, mesh: Any) -> list[Any]:
    """Rank ``s``'s model chunks (:func:`chunk_stages`), tensor-parallel
    first and then FSDP-sharded as the layout asks (as torchtitan does: FSDP then shards the TP shards,
    2-D DTensors), under autocast with ``amp``. Collective: every rank calls it."""
    from harness.worker.models import build_stage

    chunks = [build_stage(shape, cfg.seed, i, cfg.stages * cfg.virtual_stages) for i in chunk_stages(cfg, s)]
    if cfg.tp > 1:
        from harness.worker.models import parallelize_mlps

        for m in chunks:
            parallelize_mlps(m, mesh["tp"])
    if cfg.dp_shard > 1:
        from torch.distributed.fsdp import fully_shard

        shard_mesh = mesh["dp_shard"] if cfg.data_parallel == 1 else mesh["dp_replicate", "dp_shard"]
        for m in chunks:
            fully_shard(m, mesh=shard_mesh)
    if cfg.amp != "none":
        for m in chunks:
            m.autocast = torch.bfloat16 if cfg.amp == "bf16" else torch.float16
    return chunks


class PipelineTrainer:
    """One rank of the reference workload: its stage, schedule, optimizer and data.

    ``iteration`` runs one training step and calls the checkpointer's hooks at
    the right moments: ``begin_iteration`` at the step boundary (before the
    data pipeline moves on), ``before_optimizer_step`` after the last backward.
    """

    def __init__(self, cfg: WorkloadConfig) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleDualPipeV,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
            ScheduleInterleavedZeroBubble,
            ScheduleZBVZeroBubble,
        )

        from harness.worker.data import (
            ResumableBatchSampler,
            make_dataset,
            make_loader,
            mix,
        )
        from harness.worker.models import loss_fn, stage_io

        self.cfg = cfg
        self.rank = dist.get_rank()
        P, D, F, T = cfg.stages, cfg.data_parallel, cfg.dp_shard, cfg.tp
        dims = MESH_ORDERS[cfg.layout]
        sizes = {"pp": P, "dp_replicate": D, "dp_shard": F, "tp": T}
        self.mesh = init_device_mesh("cpu", tuple(sizes[n] for n in dims), mesh_dim_names=dims)
        s, d, f, t = (self.mesh[n].get_local_rank() for n in ("pp", "dp_replicate", "dp_shard", "tp"))
        self.stage_index, self.replica, self.shard = s, d, f
        self.pp_group = self.mesh["pp"].get_group()
        self.replica_group = self.mesh["dp_replicate"].get_group()
        ranks = self.mesh.mesh  # the rank at each coordinate, dimensions in mesh order
        # The ranks of one stage (replicas, shards, tensor-parallel peers), for the loss mean; every rank
        # creates every group in the same order (a collective requirement).
        dp_groups = [dist.new_group(sorted(ranks.select(dims.index("pp"), ss).flatten().tolist())) for ss in range(P)]
        self.dp_group = dp_groups[s]
        # Tensor-parallel peers compute on the same activations: they share the data and the dropout seed.
        at = {"pp": s, "dp_replicate": d, "dp_shard": f, "tp": 0}
        seed_rank = int(ranks[tuple(at[n] for n in dims)])

        shape = PRESETS[cfg.model]
        V = cfg.virtual_stages
        chunks = _stage_chunks(cfg, shape, s, self.mesh)
        self.module = chunks[0] if V == 1 else torch.nn.ModuleList(chunks)
        seed_everything(mix(cfg.seed, 100, seed_rank))  # dropout differs per data-parallel rank, reproducibly
        held = chunk_stages(cfg, s)
        self.first, self.last = 0 in held, P * V - 1 in held  # the rank feeding the data, the one with the loss
        self.stages = [
            PipelineStage(m, i, P * V, torch.device("cpu"), *stage_io(shape, cfg.microbatch_size, i, P * V),
                          group=self.pp_group)
            for i, m in zip(held, chunks)
        ]
        self.step = 0
        for st in self.stages:
            announce_compute(st, self)
        # fp16: the loss scaled (on the last stage) before its backward; every stage's gradients carry the scale
        self.scaler = StageScaler(init_scale=cfg.amp_init_scale,
                                  growth_interval=cfg.amp_growth_interval) if cfg.amp == "fp16" else None
        loss = loss_fn if self.scaler is None else (lambda out, target: self.scaler.scale(loss_fn(out, target)))
        self.schedule: Any
        if cfg.schedule in MULTI_CHUNK:
            multi = {"interleaved-1f1b": ScheduleInterleaved1F1B, "interleaved-zb": ScheduleInterleavedZeroBubble,
                     "zbv": ScheduleZBVZeroBubble, "dualpipev": ScheduleDualPipeV}[cfg.schedule]
            # a list of PipelineStage where torch annotates list[_PipelineStageBase] (a list is invariant)
            self.schedule = multi(self.stages, n_microbatches=cfg.microbatches, loss_fn=loss)  # type: ignore[arg-type]
        else:
            schedule_cls = Schedule1F1B if cfg.schedule == "1f1b" else ScheduleGPipe
            self.schedule = schedule_cls(self.stages[0], n_microbatches=cfg.microbatches, loss_fn=loss)
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=cfg.lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg.warmup, cfg.steps))

        loader_gen = torch.Generator().manual_seed(mix(cfg.seed, 200))
        sampler = ResumableBatchSampler(cfg.dataset_size, cfg.global_batch, loader_gen, d * F + f, D * F)
        loader = make_loader(make_dataset(shape, cfg.seed, cfg.dataset_size), sampler, loader_gen)
        # Creating a DataLoader iterator draws a base seed from the loader's generator;
        # do it before any restore so the restored generator state is what training sees.
        self.batches = iter(loader)
        self.state = (TrainState if not cfg.omit else partial(LeavingOut, omitted=tuple(cfg.omit)))(
            model=self.module, optimizer=self.optimizer, scheduler=self.scheduler, data=sampler,
            scaler=self.scaler, generators={"loader": loader_gen},
        )

    def attach(self, ckpt: Any) -> None:
        stages = self.stages[0] if len(self.stages) == 1 else self.stages
        ckpt.attach(stages, mesh=self.mesh)

    def iteration(self, step: int, ckpt: Any) -> float | None:
        """Train iteration ``step``; returns the (replica-averaged) loss on the last stage, else None."""
        from baft import events

        cfg = self.cfg
        first, last = self.first, self.last
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
        if cfg.data_parallel > 1 and cfg.dp_shard == 1:  # FSDP2 reduces its own gradients
            from baft.state.dtensor import local_view

            for p in self.module.parameters():
                grad = local_view(p.grad)  # a tensor-parallel parameter's gradient: its shard
                dist.all_reduce(grad, group=self.replica_group)
                grad.div_(cfg.data_parallel)
        ckpt.before_optimizer_step()
        events.emit("phase", phase="optimizer", step=step)
        scale = 1.0
        if self.scaler is None:
            self.optimizer.step()
        else:
            scale = float(self.scaler.get_scale())
            self.scaler.agreed_step(self.optimizer, lambda s: events.emit("amp_step_skipped", step=step, scale=s))
        self.scheduler.step()
        loss = None
        if last:
            mean = torch.stack([l.detach() for l in losses]).mean() / scale
            if cfg.world_size > cfg.stages:
                dist.all_reduce(mean, group=self.dp_group)
                mean.div_(cfg.world_size // cfg.stages)
            loss = float(mean)
        self.state.step = step + 1
        return loss


@dataclass(kw_only=True)
class LeavingOut(TrainState):
    """A :class:`~baft.TrainState` whose every capture leaves ``omitted`` out (``workload.omit``)."""

    omitted: tuple[str, ...] = ()

    def capture(self, omit: tuple[str, ...] = (), only: tuple[str, ...] = COMPONENTS, *,
                local: bool = True) -> dict[str, Any]:
        return super().capture(omit=(*omit, *self.omitted), only=only, local=local)


def main(argv: list[str] | None = None) -> int:
    """One worker of a scenario run: build, restore if a checkpoint exists, train, journal every boundary."""
    from harness.worker.preemption import TermSignal, flush_and_leave
    from harness.worker.session import Session
    from harness.worker.spec import SPEC_VARIABLE

    args = argv if argv is not None else sys.argv[1:]
    spec_path = Path(args[0]) if args else Path(os.environ[SPEC_VARIABLE])
    session = Session(spec_path)
    cfg = session.spec.workload
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
        # a preemption's SIGTERM (also one during the restore) is obeyed at a step boundary, together
        term = TermSignal() if session.spec.preemptible else None
        start = ckpt.restore_latest()
        session.restored(start, state)
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            loss = trainer.iteration(step, ckpt)  # announces the iteration phase itself
            session.end(step, loss, state, seconds=time.perf_counter() - t0)
            ckpt.after_step()
            if term is not None and term.agreed():
                return flush_and_leave(ckpt, session, term, state.step)
    finally:
        session.disarm()
    ckpt.close()
    session.close(state.step)
    return 0


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    code: int = record(main)() or 0  # an uncaught exception goes into the error file the agent journals
    if multiprocessing.parent_process() is not None:
        # Forked by torchrun's fork server (harness.run.agent): torchrun waits for the worker's return
        # value, and multiprocessing ends the process without the interpreter's teardown itself.
        sys.exit(code)
    # A fresh interpreter: everything the worker holds is closed by now (checkpointer and its
    # threads, journal, process group), so skip the interpreter's teardown, half a second of
    # torch's own per worker here, which the agent and every restart would wait for.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
