"""The few collectives the checkpointing strategies need, also usable single-process."""
from __future__ import annotations

from typing import Any

import torch.distributed as dist


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank_world() -> tuple[int, int]:
    if initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_gather(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj`` (just ``[obj]`` without a process group)."""
    if not initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def all_min(value: int, group: Any = None) -> int:
    return min(int(v) for v in all_gather(value, group))
