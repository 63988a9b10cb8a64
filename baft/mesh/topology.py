"""Where a rank stands in the job: its data-parallel replica and its shard of the stage's state.

A pipeline job's ranks form a mesh. Along ``pp`` the stages differ; along ``dp_replicate`` the ranks hold
identical copies of their stage's state (each snapshots only its share, the shares of one version sum to the
whole); along ``dp_shard`` (FSDP2) and ``tp`` (tensor parallelism) each rank holds a different piece (each
snapshots all of its own, except what the TP ranks hold alike: :mod:`baft.mesh.tpshared`). :func:`from_mesh` reads this from the job's ``DeviceMesh`` by dimension name, in
any order and any subset of those dimensions, never from rank arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baft.errors import BaftConfigError
from baft.mesh.collective import rank_world

#: Dimension names whose ranks hold the same state.
REPLICATE_DIMS = ("dp_replicate", "dp")
#: Dimension names whose ranks hold different pieces of one stage's state.
SHARD_DIMS = ("dp_shard", "tp", "cp", "ep")
PIPELINE_DIMS = ("pp",)


@dataclass(frozen=True, slots=True)
class Topology:
    """This rank's place among the ranks that hold its stage's state."""

    replica: int = 0
    replicas: int = 1
    replica_group: Any = None
    """The process group of the ``replicas`` ranks that hold the same state as this one (None: the world)."""
    shard: int = 0
    """Which piece of the stage's state this rank holds, among ``shards`` (``dp_shard`` x ``tp`` ...)."""
    shards: int = 1
    tp_rank: int = 0
    """This rank's place along ``tp`` (tensor parallelism), among ``tp_size``."""
    tp_size: int = 1
    tp_group: Any = None
    """The process group of the ranks along ``tp`` with this one (None: no tensor parallelism)."""
    stage: int | None = None
    """This rank's place along ``pp`` when the topology came from a mesh (0 if the mesh has no ``pp``:
    one stage); None without a mesh."""

    def __post_init__(self) -> None:
        if not 0 <= self.replica < self.replicas:
            raise BaftConfigError("replica", f"an index from 0 to replicas - 1 ({self.replicas - 1})", self.replica)
        if not 0 <= self.shard < self.shards:
            raise BaftConfigError("shard", f"an index from 0 to shards - 1 ({self.shards - 1})", self.shard)


def from_mesh(mesh: Any) -> Topology:
    """The topology of this rank in ``mesh`` (a ``DeviceMesh`` with named dimensions)."""
    names = tuple(mesh.mesh_dim_names or ())
    if not names:
        raise BaftConfigError("mesh.mesh_dim_names", "named dimensions, e.g. ('pp', 'dp_replicate', 'dp_shard', 'tp')",
                              mesh.mesh_dim_names)
    known = REPLICATE_DIMS + SHARD_DIMS + PIPELINE_DIMS
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BaftConfigError("mesh.mesh_dim_names", f"names among {list(known)}", unknown)
    replicate = [n for n in names if n in REPLICATE_DIMS]
    if len(replicate) > 1:
        raise BaftConfigError("mesh.mesh_dim_names", f"at most one replicate dimension of {list(REPLICATE_DIMS)}", replicate)
    replica, replicas, group = 0, 1, None
    if replicate:
        sub = mesh[replicate[0]]
        replica, replicas, group = sub.get_local_rank(), sub.size(), sub.get_group()
    shard, shards = 0, 1
    for n in (n for n in names if n in SHARD_DIMS):  # row-major over the shard dims, in mesh order
        size = mesh[n].size()
        shard, shards = shard * size + mesh[n].get_local_rank(), shards * size
    stage = mesh["pp"].get_local_rank() if "pp" in names else 0
    tp = mesh["tp"] if "tp" in names and mesh["tp"].size() > 1 else None
    return Topology(replica=replica, replicas=replicas, replica_group=group, shard=shard, shards=shards, stage=stage,
                    tp_rank=tp.get_local_rank() if tp is not None else 0, tp_size=tp.size() if tp is not None else 1,
                    tp_group=tp.get_group() if tp is not None else None)


def of(mesh: Any = None, *, replica: int = 0, replicas: int = 1, replica_group: Any = None) -> Topology:
    """The topology given either as a mesh or as explicit replica coordinates, not both."""
    if mesh is not None:
        if (replica, replicas, replica_group) != (0, 1, None):
            raise BaftConfigError("attach", "the mesh or replica/replicas/replica_group, not both",
                                  {"replica": replica, "replicas": replicas, "replica_group": replica_group})
        return from_mesh(mesh)
    return Topology(replica=replica, replicas=replicas, replica_group=replica_group)


def stage_key(stage: Any, rank: int, topology: Topology) -> str:
    """Key prefix of a stage's tensors in the persistent tier, shared by the ranks that hold it:
    ``stage<S>`` for pipeline stage(s) S, or for a module attached with a mesh (S its ``pp``
    coordinate); ``rank<R>`` for a module attached without one (each rank its own)."""
    stages = stage if isinstance(stage, (list, tuple)) else [stage]
    indices = [getattr(st, "stage_index", None) for st in stages]
    if indices and all(i is not None for i in indices):
        return "stage" + "-".join(str(i) for i in indices)
    return f"stage{topology.stage}" if topology.stage is not None else f"rank{rank}"


def shard_key(key: str, topology: Topology) -> str:
    """Key prefix of the plain tensors of a rank that holds one piece of a sharded stage (its DTensors
    go under ``key``, whole: DCP assembles them from the pieces)."""
    return f"{key}.shard{topology.shard}" if topology.shards > 1 else key


def holders(world: list[Any], place: str, *, same_stage: bool = False) -> list[int]:
    """The ranks of a recorded world (each rank's ``[place, replica index]``, as an elastic restore reads it)
    that held ``place``, ordered by replica index; ``same_stage``: that held any shard of its stage (the
    sharding changed between the worlds)."""
    def held(p: str) -> bool:
        return p.split(".shard", 1)[0] == place.split(".shard", 1)[0] if same_stage else p == place

    return [i for _, i in sorted((int(r), i) for i, (p, r) in enumerate(world) if held(str(p)))]


def stages_of(world: list[Any]) -> list[str]:
    """The pipeline stages of a recorded world (each rank's ``[place, replica index]``), their shards merged."""
    return sorted({str(p).split(".shard", 1)[0] for p, _ in world})


def restaged(old: list[Any] | None, new: list[Any] | None) -> bool:
    """Whether two recorded worlds cut the pipeline into other stages (another stage count): a stage of the
    new world then holds other tensors than any rank of the old one did. False when either is unknown."""
    return bool(old) and bool(new) and stages_of(old) != stages_of(new)  # type: ignore[arg-type]


def restage_source(old: list[Any], place: str, replica: int, new: list[Any]) -> int:
    """The old rank whose small state (RNGs, data position, scheduler) a rank of a restaged world takes: of the
    old stage where this rank's new stage begins (stage s of S' begins where old stage s*S/S' did, the blocks
    being cut evenly), the holder with this rank's replica index (modulo their number)."""
    olds, news = stages_of(old), stages_of(new)
    index = {n: i for i, n in enumerate(sorted(news, key=_stage_number))}
    ordered = sorted(olds, key=_stage_number)
    mine = place.split(".shard", 1)[0]
    source = ordered[index[mine] * len(ordered) // len(news)] if mine in index else ordered[0]
    holding = holders(old, source, same_stage=True)
    return holding[replica % len(holding)]


def _stage_number(name: str) -> int:
    head = name.removeprefix("stage").split("-", 1)[0]
    return int(head) if head.isdigit() else 0


def old_ranks(rank: int, replica: int, replicas: int, saved: int, world: list[tuple[str, int]] | None,
              old_world: list[list[Any]] | None) -> list[int]:
    """The ranks that held ``rank``'s stage among ``saved`` replicas before the world changed, by their replica
    index; [] when the old world's map shows another number of them. Without maps (a version from before
    they were recorded): replica-major order."""
    if world is not None and old_world is not None:
        olds = holders(old_world, world[rank][0])
        return olds if [int(old_world[i][1]) for i in olds] == list(range(saved)) else []
    _, size = rank_world()
    stages = size // replicas
    return [d * stages + rank - replica * stages for d in range(saved)]
