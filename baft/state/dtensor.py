"""DTensor state (FSDP2, tensor parallelism): a rank's local shards and how to make them DTensors again."""
from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from baft.errors import BaftError

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch built without distributed
    DTensor = None  # type: ignore[assignment,misc]


def is_dtensor(value: Any) -> bool:
    return DTensor is not None and isinstance(value, DTensor)


def local_view(value: Any) -> Any:
    """A DTensor's local shard (a view of the storage it owns, no copy); anything else as it is."""
    return value.to_local().detach() if is_dtensor(value) else value


def local_tensors(tree: Any) -> Any:
    """``tree`` with every DTensor replaced by its local shard: a checkpoint of one rank holds what that
    rank owns (FSDP's shard, a tensor-parallel slice), the way the rank holds it."""
    if isinstance(tree, Mapping):
        return {k: local_tensors(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [local_tensors(v) for v in tree]
    return local_view(tree)


@dataclass(frozen=True, slots=True)
class TensorPlacement:
    """How a DTensor lies over its mesh: enough to make a local shard that DTensor again."""

    mesh: Any
    placements: tuple[Any, ...]
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    local_shape: tuple[int, ...]

    @classmethod
    def of(cls, value: Any) -> TensorPlacement | None:
        if not is_dtensor(value):
            return None
        return cls(value.device_mesh, tuple(value.placements), tuple(value.shape), tuple(value.stride()),
                   tuple(value.to_local().shape))

    def wrap(self, local: torch.Tensor) -> Any:
        """``local`` (this rank's shard) as the DTensor this placement describes."""
        if tuple(local.shape) != self.local_shape:
            raise BaftError(f"a saved shard of shape {tuple(local.shape)} does not fit this rank's shard "
                            f"{self.local_shape} of {self.shape} ({list(self.placements)}): the checkpoint "
                            "was taken under another sharding")
        return DTensor.from_local(local, self.mesh, self.placements, run_check=False, shape=torch.Size(self.shape),
                                  stride=self.stride)

    def shard(self, local: torch.Tensor) -> HostShard:
        """``local`` (this rank's shard, e.g. a view of a slot) as what a checkpoint file records of the DTensor,
        left where it lies: :meth:`wrap` would make a DTensor of it, which on a CUDA mesh copies a host
        tensor to the device."""
        if tuple(local.shape) != self.local_shape:
            raise BaftError(f"a shard of shape {tuple(local.shape)} does not fit this rank's shard {self.local_shape} "
                            f"of {self.shape} ({list(self.placements)})")
        return HostShard(local, self.shape, _offsets(self))

    def empty(self, dtype: torch.dtype) -> Any:
        """A DTensor of this placement to load into (its local shard uninitialised)."""
        return self.wrap(torch.empty(self.local_shape, dtype=dtype))


def placement_for(placements: Mapping[str, TensorPlacement], name: str, shape: tuple[int, ...], *,
                  local: bool) -> TensorPlacement | None:
    """The placement of the tensor named ``name`` (a :func:`baft.state.layout.split` name) of ``shape`` (its
    local shard's with ``local``, else the whole tensor's), if it is a DTensor's."""
    p = placements.get(name)
    if p is None and name.startswith("optimizer.state."):
        parts = name.split(".")
        p = placements.get(f"optimizer.state.{parts[2]}.*") if len(parts) > 3 else None
        if p is not None and tuple(shape) != (p.local_shape if local else p.shape):
            return None  # a per-parameter tensor not shaped like the parameter (a scalar step)
    return p


@dataclass(frozen=True, slots=True)
class HostShard:
    """A rank's shard of a DTensor where it lies (a slot's host memory), with the whole tensor's size and the
    shard's offsets in it: what a rank's checkpoint file records, without a DTensor (whose ``from_local`` moves
    a host tensor onto a CUDA mesh's device: the whole state copied to the GPU and back to be written)."""

    local: torch.Tensor
    shape: tuple[int, ...]
    offsets: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.local.numel() * self.local.element_size()


@functools.lru_cache(maxsize=4096)
def _offsets(placement: TensorPlacement) -> tuple[int, ...]:
    """Where this rank's shard lies in the whole tensor: DTensor's own answer, asked of a shard on the meta
    device (no memory, and ``from_local`` moves no meta tensor)."""
    meta = torch.empty(placement.local_shape, device="meta")
    probe = DTensor.from_local(meta, placement.mesh, placement.placements, run_check=False,
                               shape=torch.Size(placement.shape), stride=placement.stride)
    chunks = probe.__create_chunk_list__()  # type: ignore[no-untyped-call]
    if len(chunks) != 1:
        raise BaftError(f"a DTensor shard in {len(chunks)} chunks on one rank ({list(placement.placements)}); "
                        "a rank's file holds one")
    return tuple(int(x) for x in chunks[0].offsets)
