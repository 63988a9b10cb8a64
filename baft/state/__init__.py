"""What a checkpoint holds and how it is read: the training state, DTensor shards, fingerprints, encodings.

:mod:`~baft.state.train` (:class:`TrainState`, the RNGs), :mod:`~baft.state.dtensor` (a rank's local shards
and :class:`TensorPlacement`), :mod:`~baft.state.fingerprint` (digests and norms of every leaf),
:mod:`~baft.state.layout` (the bulk tensors and the skeleton of a state), :mod:`~baft.state.codec` (a
pickle-free encoding). Its names resolve on first use.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from baft._lazy import exports

if TYPE_CHECKING:
    from baft.state.dtensor import (
        TensorPlacement,
        is_dtensor,
        local_tensors,
        local_view,
        placement_for,
    )
    from baft.state.fingerprint import (
        digest_components,
        digest_leaf,
        fingerprint_components,
        fingerprint_leaf,
        flatten,
    )
    from baft.state.train import Stateful, TrainState, rng_state, set_rng_state

__all__ = ["Stateful", "TensorPlacement", "TrainState", "digest_components", "digest_leaf", "fingerprint_components",
           "fingerprint_leaf", "flatten", "is_dtensor", "local_tensors", "local_view", "placement_for", "rng_state",
           "set_rng_state"]
# the module this room replaced (baft/state.py) held all three
__getattr__, __dir__ = exports(__name__, sources=(".train", ".dtensor", ".fingerprint"))
