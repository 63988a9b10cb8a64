"""One rank of ``baft bench`` (:mod:`harness.bench.bench`): ``python -m harness.bench.rank SPEC.json``, started by
the launcher. It trains the reference pipeline with every arm's checkpointer attached, runs the arms in their
blocks, times each iteration and what each block left in the background, times the restores, and rank 0 writes
``bench-raw.json`` for :func:`harness.bench.bench.summarize`."""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

import baft.strategies.registry as registry

from harness.bench.bench import FLOOR_ARM, Arm, BenchConfig, BenchSpec, is_floor, is_floor_of_work


def _write_raw(run_dir: Path, times: list[dict[str, Any]], settings: dict[str, Any], mine: dict[str, Any]) -> None:
    """Gather every rank's timings and records; rank 0 writes ``bench-raw.json``: each iteration at the
    pipeline's pace (the slowest rank's time) and the checkpoints committed on every rank by then."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"times": times, **mine})
    if dist.get_rank() != 0:
        return
    iterations = []
    for i, it in enumerate(times):
        it = dict(it)
        it["seconds"] = max(g["times"][i]["seconds"] for g in gathered)
        it["saved"] = min(g["times"][i]["saved"] for g in gathered)
        iterations.append(it)
    raw = {"iterations": iterations, "settings": settings,
           "ranks": [{"baft": g["baft"], "restores": g["restores"], "floor": g["floor"],
                      "floor_slots": g.get("floor_slots", 0)} for g in gathered]}
    (run_dir / "bench-raw.json").write_text(json.dumps(raw))


def _checkpointers(spec: BenchSpec, arms: dict[str, Arm], trainer: Any) -> dict[str, Any]:
    """Each arm's checkpointer, attached to the trainer's stages (collective: every rank calls it). The first
    persistent arm of a strategy with node stores (``baft``) is the one placed on its node's store (with 2+ nodes
    it replicates)."""
    from baft import Checkpointer

    from harness.worker.session import place_on_node

    cfg, run_dir = spec.bench, Path(spec.run_dir)
    ckpts: dict[str, Any] = {}
    placed = False
    for arm in arms.values():
        entry = registry.get(arm.strategy)
        own_snapshot = arm.tier == "snapshot" and entry.snapshot_step is not None  # a step done here, beside `none`
        c = dataclasses.replace(
            cfg.checkpoint, strategy="none" if own_snapshot else arm.strategy, every=arm.every,
            dir=str(run_dir / "checkpoints" / _dirname(arm.name)),
            baft=dataclasses.replace(cfg.checkpoint.baft, shm_dir=str(Path(spec.shm_dir) / _dirname(arm.name))))
        if entry.traits.node_stores and arm.tier == "persistent" and not placed:
            place_on_node(c, spec)  # with 2+ nodes this arm replicates through the node stores
            placed = True
        ckpts[arm.name] = Checkpointer(c, trainer.state)
        trainer.attach(ckpts[arm.name])
    return ckpts


def worker(spec_path: Path) -> int:
    """One rank of the benchmark job."""
    from baft import events
    from baft.strategies.restore import restore_dcp, restore_shards

    from harness.worker.workload import PipelineTrainer, set_determinism

    spec = BenchSpec.load(spec_path)
    cfg = spec.bench
    run_dir = Path(spec.run_dir)
    set_determinism()
    dist.init_process_group("gloo")
    trainer = PipelineTrainer(dataclasses.replace(cfg.workload, steps=cfg.iterations + cfg.period))
    arms = {a.name: a for a in cfg.arms()}
    ckpts = _checkpointers(spec, arms, trainer)
    snapshot_steps = _snapshot_steps(cfg, trainer.state)
    floor, senders = None, []
    if FLOOR_ARM in arms:
        from harness.bench.floorlink import join

        floor = join(cfg.nodes, cfg.checkpoint.baft.replication.priority, spec.stores, Path(spec.shm_dir) / "floor", trainer.state)
        from harness.bench.floorlink import SlotSender

        for name in filter(is_floor, arms):  # floor:replicate, and floor:sync@k+replicate beside a sync checkpointer
            if is_floor_of_work(name):  # baft's own slots, each as it is sealed, instead of a fixed file
                ckpts[name].strategy.snap.store = sender = SlotSender(floor[0])
                senders.append(sender)
            else:
                snapshot_steps[name] = floor[1]

    baft_events: list[dict[str, Any]] = []
    events.subscribe(lambda kind, f: baft_events.append({"event": kind, **f}) if kind in ("snapshot", "bubbles", "replan") else None)
    saved = [0]  # persistent checkpoints this rank has committed so far (any arm: one runs at a time)
    events.subscribe(lambda kind, f: saved.__setitem__(0, saved[0] + 1) if kind == "checkpoint_saved" else None)

    times: list[dict[str, Any]] = []
    step = cfg.period - 1  # every block starts one iteration before a step that every interval persists
    for cycle, name in cfg.order():
        ck, extra = ckpts[name], snapshot_steps.get(name)
        for pos in range(cfg.block):
            t0 = time.perf_counter()
            trainer.iteration(step, ck)
            ck.after_step()
            if extra is not None:
                extra()
            times.append({"cycle": cycle, "strategy": name, "position": pos, "seconds": time.perf_counter() - t0,
                          "saved": saved[0]})
            step += 1
        t0 = time.perf_counter()
        ck.drain()  # timed: what a block left in the background is part of its cost
        times.append({"cycle": cycle, "strategy": name, "position": -1, "seconds": time.perf_counter() - t0,
                      "saved": saved[0]})
        dist.barrier()

    settings = {n: got for n, a in arms.items()  # what only the strategy knows
                if a.tier == "persistent" and (got := ckpts[n].strategy.settings())}
    first: dict[str, Any] = {}  # per strategy, its first persistent arm: the one whose tiers are restored
    for a in arms.values():
        if a.tier == "persistent":
            first.setdefault(a.strategy, ckpts[a.name])
    restores = _time_restores(cfg, first, restore_shards, restore_dcp)
    for ck in ckpts.values():
        ck.drain()
    floor_report = None
    if floor is not None:
        floor[0].close()
        floor_report = floor[0].report
    dist.barrier()

    _write_raw(run_dir, times, settings, {"baft": baft_events, "restores": restores, "floor": floor_report,
                                          "floor_slots": sum(s.sent for s in senders)})
    for ck in ckpts.values():
        ck.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _dirname(arm: str) -> str:
    return arm.replace(":", "-").replace("@", "-every-")


def _snapshot_steps(cfg: BenchConfig, state: Any) -> dict[str, Any]:
    """The snapshot-tier steps run beside a ``none`` checkpointer, after each iteration: each strategy's
    ``snapshot_step`` of the registry (CheckFreq's copy into buffers allocated once, DCP's synchronous staging
    through its ``DefaultStager``)."""
    out: dict[str, Any] = {}
    for name in cfg.strategies:
        entry = registry.get(name)
        factory = entry.snapshot_factory()
        if factory is not None and entry.snapshot_arm_name is not None:
            out[entry.snapshot_arm_name] = factory(state)
    return out


def _time_restores(cfg: BenchConfig, ckpts: dict[str, Any], restore_shards: Any, restore_dcp: Any) -> dict[str, list[float]]:
    """Seconds per restore from each tier this run filled (collective; state is overwritten)."""
    out: dict[str, list[float]] = {}
    tiers: list[tuple[str, Any]] = []
    if "baft" in ckpts:
        strat = ckpts["baft"].strategy
        tiers.append(("shm", lambda: strat.snap.restore()))
        if strat.snap.store is not None and cfg.nodes > 1:
            tiers.append(("peer", lambda: _restore_without_own_memory(strat.snap)))
        tiers.append(("persistent-dcp", lambda: restore_dcp(strat, strat.group)))
    if "sync" in ckpts:
        tiers.append(("persistent-sync", lambda: restore_shards(ckpts["sync"].strategy)))
    for tier, fn in tiers:
        secs = []
        for _ in range(cfg.restore_repeats):
            dist.barrier()
            t = time.perf_counter()
            got = fn()
            secs.append(time.perf_counter() - t)
            if got is None:
                secs = []
                break
        out[tier] = secs
    if "baft" in ckpts:
        ckpts["baft"].strategy.snap.restored_version = None
    return out


def _restore_without_own_memory(snap: Any) -> int | None:
    """Delete this rank's own slots (its memory is gone), then restore: from a peer's replica."""
    from baft.snapshot.slotfile import SLOTS

    snap.buffer.close()
    for k in range(SLOTS):
        snap.buffer.path(k).unlink(missing_ok=True)
    return snap.restore()


if __name__ == "__main__":
    sys.exit(worker(Path(sys.argv[1])))
