"""The snapshot slots: three files per rank in shared memory that outlive the process that wrote them.

:mod:`~baft.snapshot.slots` (:class:`SnapshotBuffer`, :class:`Slot`: mapped as tensors),
:mod:`~baft.snapshot.slotfile` (the file format and paths, torch-free: the store reads it),
:mod:`~baft.snapshot.slotmeta` (a slot's metadata). Its names resolve on first use.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from baft._lazy import exports

if TYPE_CHECKING:
    from baft.snapshot.slots import Slot, SnapshotBuffer

__all__ = ["Slot", "SnapshotBuffer"]
# the module this room replaced (baft/snapshot.py) was the slots'
__getattr__, __dir__ = exports(__name__, sources=(".slots",))
