"""The few collectives the checkpointing strategies need, also usable single-process."""
from __future__ import annotations

import pickle
import struct
from typing import Any

import torch
import torch.distributed as dist


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank_world() -> tuple[int, int]:
    if initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


#: Objects whose pickle fits in this many bytes on every rank are gathered in one collective of a fixed-size
#: buffer; a larger one anywhere takes torch's ``all_gather_object`` (two: the sizes, then the padded bytes).
SMALL_OBJECT = 16 << 10


def all_gather(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj`` (just ``[obj]`` without a process group). Small objects (the strategies' reports
    and outcomes) cost one collective."""
    if not initialized():
        return [obj]
    if dist.get_backend(group) != "gloo":  # NCCL takes device tensors only: torch's own path moves them there
        out: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(out, obj, group=group)
        return out
    raw = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    buf = bytearray(SMALL_OBJECT + 8)
    fits = len(raw) <= SMALL_OBJECT
    struct.pack_into("<q", buf, 0, len(raw) if fits else -1)
    if fits:
        buf[8:8 + len(raw)] = raw
    mine = torch.frombuffer(buf, dtype=torch.uint8)
    got = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(got, mine, group=group)
    sizes = [struct.unpack("<q", t[:8].numpy().tobytes())[0] for t in got]
    if min(sizes) < 0:  # some rank's is larger: every rank sees that and takes the general path together
        out = [None] * len(got)
        dist.all_gather_object(out, obj, group=group)
        return out
    return [pickle.loads(t[8:8 + n].numpy().tobytes()) for t, n in zip(got, sizes)]


def all_min(value: int, group: Any = None) -> int:
    return min(int(v) for v in all_gather(value, group))


def all_max(values: list[float], group: Any = None) -> list[float]:
    """The element-wise largest of every rank's ``values`` (the same length on all): one all-reduce."""
    if not initialized():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [float(x) for x in t.tolist()]


def all_gather_ints(values: list[int], width: int, group: Any = None) -> list[list[int]]:
    """Every rank's ``values`` (at most ``width`` non-negative ints): one collective of a fixed-size
    tensor, where :func:`all_gather` of objects takes two and pickles."""
    if len(values) > width or any(v < 0 for v in values):
        raise ValueError(f"{values}: at most {width} non-negative ints")
    if not initialized():
        return [list(values)]
    mine = torch.full((width,), -1, dtype=torch.int64)
    mine[: len(values)] = torch.tensor(values, dtype=torch.int64)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, mine, group=group)
    return [[v for v in t.tolist() if v >= 0] for t in out]
