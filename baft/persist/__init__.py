"""The persistent tier: checkpoint directories with atomic commits, on local disk or an fsspec URL.

:mod:`~baft.persist.commits` (the commit protocol: shards, manifest, ``latest``), :mod:`~baft.persist.storage`
(the back ends), :mod:`~baft.persist.dcpformat` and :mod:`~baft.persist.dcpwrite` (the DCP format, written
from a slot's bytes), :mod:`~baft.persist.writer` (the writer process of a rank), :mod:`~baft.persist.background`
(the persister thread), :mod:`~baft.persist.interval` (how often). Its names resolve on first use.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from baft._lazy import exports

if TYPE_CHECKING:
    from baft.persist.commits import (
        commit,
        committed_steps,
        latest,
        read_manifest,
        read_shard,
        verify_directory,
    )

__all__ = ["commit", "committed_steps", "latest", "read_manifest", "read_shard", "verify_directory"]
# the module this room replaced (baft/persist.py) was the commit protocol
__getattr__, __dir__ = exports(__name__, sources=(".commits",))
