"""State that every tensor-parallel rank of a stage holds alike, copied by one of them.

Tensor parallelism splits some of a stage's parameters over the ranks along ``tp`` (DTensor shards) and
leaves the rest (norms, biases, whatever the plan does not parallelize) the same on every one of those
ranks, with the same Adam moments: the ranks compute on the same activations. Without FSDP those are plain
tensors (or DTensors replicated along ``tp``); with FSDP2 applied over the TP shards (torchtitan's order)
they are DTensors of the ``dp_shard`` mesh alone, whose shard each TP peer holds alike. Copying those on
every TP rank would write the same bytes ``tp`` times. Here only TP rank 0 copies them
(:func:`shared_tensors` names them in a snapshot's layout); a restore loads what each rank's slot holds
and then :func:`broadcast_shared` sends rank 0's values to its TP peers. A DTensor is alike on the peers
when its mesh holds none of them, or holds them along a ``tp`` dimension it is replicated on
(:func:`alike_on_peers`). Buffers are left out (each rank copies its own: a buffer may be local state even
under tensor parallelism).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate

from baft.state.dtensor import TensorPlacement, is_dtensor, local_view, placement_for
from baft.state.layout import TensorSpec
from baft.state.train import TrainState


def alike_on_peers(placement: TensorPlacement, peers: set[int]) -> bool:
    """Whether the DTensor of ``placement`` has the same local shard on this rank and its TP ``peers``
    (global ranks): its mesh holds none of them (a mesh of other dimensions: each peer holds its own
    copy of the same coordinate), or varies along them only on a ``tp`` dimension it is replicated on."""
    mesh = placement.mesh
    if not peers & set(mesh.mesh.flatten().tolist()):
        return True
    names = tuple(mesh.mesh_dim_names or ())
    if "tp" not in names or not isinstance(placement.placements[names.index("tp")], Replicate):
        return False
    t, coord = names.index("tp"), mesh.get_coordinate()
    if coord is None:  # a mesh this rank is not on: nothing of it is this rank's to share
        return False
    along = mesh.mesh[tuple(slice(None) if d == t else coord[d] for d in range(mesh.ndim))]
    return peers <= set(along.flatten().tolist())  # the peers differ from this rank only along tp


def shared_tensors(specs: list[TensorSpec], state: TrainState, placements: dict[str, Any],
                   peers: set[int]) -> set[int]:
    """Indices (in layout order) of the bulk tensors every TP rank of the stage holds alike: the model's
    parameters that are plain or alike on the ``peers`` (:func:`alike_on_peers`), and the per-parameter
    optimizer state of such parameters (and the step count of any)."""
    params = {f"model.{n}" for n, _ in state.model.named_parameters()}
    out = set()
    for i, s in enumerate(specs):
        if s.name in params or s.name.startswith("optimizer.state."):
            p = placement_for(placements, s.name, s.shape, local=True)
            if p is None or alike_on_peers(p, peers):
                out.add(i)
    return out


def _live_shared(state: TrainState, peers: set[int]) -> list[torch.Tensor]:
    """The live tensors :func:`shared_tensors` names (a DTensor's local shard), in an order every TP rank
    agrees on."""
    def alike(p: Any) -> bool:
        placement = TensorPlacement.of(p)
        return placement is None or alike_on_peers(placement, peers)

    live = [local_view(p) for _, p in state.model.named_parameters() if alike(p)]
    if state.optimizer is not None:
        params = [p for g in state.optimizer.param_groups for p in g["params"]]
        for p in params:
            per_param = state.optimizer.state.get(p, {})
            for _, t in sorted(per_param.items()):
                if not isinstance(t, torch.Tensor):
                    continue
                if is_dtensor(t) or (is_dtensor(p) and t.dim() > 0 and tuple(t.shape) == tuple(p.to_local().shape)):
                    if alike(p):
                        live.append(local_view(t))
                else:  # a plain per-parameter tensor not shaped like a DTensor parameter's shard, a step count
                    live.append(t)
    return live


def broadcast_shared(state: TrainState, group: Any, peers: set[int]) -> None:
    """After a restore: TP rank 0's values of the shared tensors into every rank of ``group`` (the stage's
    TP ranks; a gloo group, :func:`baft.mesh.control.host_twin`), one broadcast per dtype, through host memory."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = defaultdict(list)
    for t in _live_shared(state, peers):
        by_dtype[t.dtype].append(t)
    for dtype in sorted(by_dtype, key=str):
        tensors = by_dtype[dtype]
        flat = torch.cat([t.detach().reshape(-1) for t in tensors]).cpu()  # gloo's: host memory on every device
        dist.broadcast(flat, group=group, group_src=0)
        offset = 0
        with torch.no_grad():
            for t in tensors:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()
