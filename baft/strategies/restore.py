"""How the strategies that persist restore: the newest checkpoint every rank can verify, shards or DCP.

:func:`restore_shards` (``sync``, ``checkfreq``: one ``torch.save`` file per rank) and :func:`restore_dcp`
(``async-dcp``, ``baft``: DCP, each DTensor as this rank's shard; in a world of another size, from the
record of the old rank that held this rank's place, :func:`meta_rank`). Both agree with every rank on the
step (:func:`baft.strategies.base.restore_agreed`) and journal what they rejected and loaded.
"""
from __future__ import annotations

import time
from typing import Any

from baft import events
from baft.errors import CheckpointCorrupt
from baft.mesh.collective import rank_world
from baft.mesh.topology import holders, restage_source, restaged, stages_of
from baft.persist import commits as persist
from baft.persist import dcpformat
from baft.strategies.base import Strategy, restore_agreed


def place_map(places: list[tuple[str, int]] | None) -> dict[str, Any]:
    """What a checkpoint's manifest records of the world that wrote it (``places``: every rank's pieces of
    state and replica index), for :func:`meta_rank`; nothing when it is not known."""
    return {"places": [[p, r] for p, r in places]} if places is not None else {}


def meta_rank(strategy: Strategy, manifest: dict[str, Any], rank: int) -> int:
    """Whose record of the small state (RNGs, data position, scheduler) and of the tensors' names this
    rank loads: in the world that wrote the checkpoint (its manifest's ``places``), the old rank that held
    the same pieces of state with this rank's replica index (modulo their number), else (the sharding
    changed) one that held a piece of the same stage; ``rank`` itself when the manifest has no map or this
    rank no place. A world of another size numbers its ranks otherwise (stage-major: new rank 2 may hold
    stage 1 where old rank 2 held stage 0), so the number alone can name another stage's record."""
    places, place = manifest.get("places"), strategy.place
    if not places or place is None:
        return rank
    olds = holders(places, place) or holders(places, place, same_stage=True)
    return olds[strategy.topology.replica % len(olds)] if olds else rank


def _announce_load(step: int) -> None:
    """The phases of a persistent checkpoint's load: the restore's step (``restore_load``), then the restore."""
    events.emit("phase", phase="restore_load", step=step, tier="persistent")
    events.emit("phase", phase="restore", step=step, tier="persistent")


def restore_dcp(strategy: Strategy, group: Any) -> int | None:
    """Restore the newest DCP checkpoint under ``config.dir`` whose files all match the manifest, each
    DTensor of the state as this rank's shard of it; in a world of another size, from the record of the
    old rank that held this rank's place (:func:`meta_rank`)."""
    root = strategy.root
    rank, _ = rank_world()
    t0 = time.perf_counter()
    good: dict[int, bool] = {}

    def verify(step: int) -> bool:
        if step not in good:
            try:
                persist.verify_directory(root, step)
                good[step] = True
            except (CheckpointCorrupt, OSError, KeyError, ValueError) as e:
                good[step] = False
                events.emit("checkpoint_rejected", step=step, tier="persistent", reason=str(e))
        return good[step]

    def load(step: int) -> None:
        _announce_load(step)
        manifest = persist.read_manifest(root, step)
        old = manifest.get("places")
        if restaged(old, strategy.places) and strategy.place is not None:
            assert old is not None and strategy.places is not None  # restaged() holds only for two known worlds
            source = restage_source(old, strategy.place, strategy.topology.replica, strategy.places)
            live = strategy.state.capture(only=("model", "optimizer"))
            strategy.state.restore(dcpformat.load_restaged(root, step, source, live, strategy.state.param_names(), group))
            events.emit("checkpoint_restored", step=step, tier="persistent", seconds=time.perf_counter() - t0,
                        path=str(persist.step_dir(root, step)), restaged_from=len(stages_of(old)),
                        stages=len(stages_of(strategy.places)), rng_from=source, not_carried=["rng"],
                        why="a stage draws its dropout from one stream of its own, and the streams cannot be cut "
                            "again: each new stage goes on with the stream of the old stage where it begins")
            return
        source = meta_rank(strategy, manifest, rank)
        strategy.state.restore(dcpformat.load(root, step, source, group, placements=strategy.state.placements()))
        events.emit("checkpoint_restored", step=step, tier="persistent",
                    seconds=time.perf_counter() - t0, path=str(persist.step_dir(root, step)))

    return restore_agreed(persist.committed_steps(root), verify, load, strategy.control)


def restore_shards(strategy: Strategy) -> int | None:
    """Restore the newest shard checkpoint in ``config.dir`` (a directory or a URL) that every rank can verify."""
    root = strategy.root
    rank, world = rank_world()
    t0 = time.perf_counter()
    verified: dict[int, bytes] = {}
    bad: set[int] = set()

    def verify(step: int) -> bool:
        if step not in verified and step not in bad:
            try:
                verified[step] = persist.read_shard(root, step, rank, world)
            except (CheckpointCorrupt, OSError, KeyError, ValueError) as e:
                bad.add(step)
                events.emit("checkpoint_rejected", step=step, tier="persistent", reason=str(e))
        return step in verified

    def load(step: int) -> None:
        _announce_load(step)
        strategy.state.restore(persist.deserialize(verified[step]))
        events.emit("checkpoint_restored", step=step, tier="persistent",
                    seconds=time.perf_counter() - t0, path=str(persist.step_dir(root, step)))

    return restore_agreed(persist.committed_steps(root), verify, load, strategy.control)
