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

    @property
    def blocks(self) -> int:
        """The blocks cut into stages: a gpt's layers; an MLP's layers after its first (its input part)."""
        return self.layers if self.kind == "gpt" else self.layers - 1

    def stage_blocks(self, stage: int, stages: int) -> range:
        """The indices of the blocks ``stage`` of ``stages`` holds: consecutive, the first stages one more
        where they do not divide evenly."""
        per, extra = divmod(self.blocks, stages)
        start = stage * per + min(stage, extra)
        return range(start, start + per + (1 if stage < extra else 0))


PRESETS: dict[str, ModelShape] = {
    "gpt-tiny": ModelShape(kind="gpt", layers=4, width=64, heads=4, vocab=64, seq_len=32),
    "gpt-small": ModelShape(kind="gpt", layers=8, width=256, heads=8, vocab=256, seq_len=64),
    "mlp": ModelShape(kind="mlp", layers=4, width=128, in_dim=32, classes=10),
    "mlp-bn": ModelShape(kind="mlp", layers=4, width=128, in_dim=32, classes=10, batchnorm=True),
}
