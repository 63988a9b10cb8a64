"""State that every tensor-parallel rank of a stage holds alike, copied by one of them.

Tensor parallelism splits some of a stage's parameters over the ranks along ``tp`` (DTensor shards) and
leaves the rest (norms, biases, whatever the plan does not parallelize) as the same plain tensor on every
one of those ranks, with the same Adam moments: the ranks compute on the same activations. Copying those
on every TP rank would write the same bytes ``tp`` times. Here only TP rank 0 copies them
(:func:`shared_tensors` names them in a snapshot's layout); a restore loads what each rank's slot holds
and then :func:`broadcast_shared` sends rank 0's values to its TP peers. Buffers are left out (each rank
copies its own: a buffer may be local state even under tensor parallelism), and so is everything of a
rank with FSDP shards too (a plain tensor there may be this shard's own).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist

from .layout import TensorSpec
from .state import TrainState, is_dtensor, placement_for


def shared_tensors(specs: list[TensorSpec], state: TrainState, placements: dict[str, Any]) -> set[int]:
    """Indices (in layout order) of the bulk tensors every TP rank of the stage holds alike: plain
    parameters of the model and the plain per-parameter optimizer state (the moments of a plain
    parameter, the step count of any)."""
    params = {f"model.{n}" for n, p in state.model.named_parameters() if not is_dtensor(p)}
    out = set()
    for i, s in enumerate(specs):
        if s.name in params and s.name not in placements:
            out.add(i)
        elif s.name.startswith("optimizer.state.") and placement_for(placements, s.name, s.shape, local=True) is None:
            out.add(i)
    return out


def _live_shared(state: TrainState) -> list[torch.Tensor]:
    """The live tensors :func:`shared_tensors` names, in an order every TP rank agrees on."""
    live = [p.data for _, p in state.model.named_parameters() if not is_dtensor(p)]
    if state.optimizer is not None:
        params = [p for g in state.optimizer.param_groups for p in g["params"]]
        for p in params:
            per_param = state.optimizer.state.get(p, {})
            live.extend(t for _, t in sorted(per_param.items())
                        if isinstance(t, torch.Tensor) and not is_dtensor(t) and not (is_dtensor(p) and t.dim() > 0))
    return live


def broadcast_shared(state: TrainState, group: Any) -> None:
    """After a restore: TP rank 0's values of the shared tensors into every rank of ``group`` (the stage's
    TP ranks), one broadcast per dtype."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = defaultdict(list)
    for t in _live_shared(state):
        by_dtype[t.dtype].append(t)
    for dtype in sorted(by_dtype, key=str):
        tensors = by_dtype[dtype]
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        dist.broadcast(flat, group=group, group_src=0)
        offset = 0
        with torch.no_grad():
            for t in tensors:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()
