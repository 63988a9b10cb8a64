"""The components of a training state, in the order a checkpoint holds and a verdict names them.

``model`` and ``optimizer`` are the bulk tensors; ``scheduler``, ``rng`` (every generator the step
reads), ``data`` (the loader's position and generator), ``scaler`` (mixed precision) and ``step`` are
small. Torch-free, so a config can name components without importing torch.
"""
from __future__ import annotations

COMPONENTS = ("model", "optimizer", "scheduler", "rng", "data", "scaler", "step")
