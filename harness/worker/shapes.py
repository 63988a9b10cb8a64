"""The model presets' sizes (torch-free: a scenario is validated against them before anything runs)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Sizes of one model preset."""

    kind: str
    layers: int
    width: int
    heads: int = 0
    vocab: int = 0
    seq_len: int = 0
    in_dim: int = 0
    classes: int = 0
    dropout: float = 0.1
    batchnorm: bool = False
    """MLP blocks normalise with BatchNorm, whose running statistics change in every forward."""


PRESETS: dict[str, ModelShape] = {
    "gpt-tiny": ModelShape(kind="gpt", layers=4, width=64, heads=4, vocab=64, seq_len=32),
    "gpt-small": ModelShape(kind="gpt", layers=8, width=256, heads=8, vocab=256, seq_len=64),
    "mlp": ModelShape(kind="mlp", layers=4, width=128, in_dim=32, classes=10),
    "mlp-bn": ModelShape(kind="mlp", layers=4, width=128, in_dim=32, classes=10, batchnorm=True),
}
