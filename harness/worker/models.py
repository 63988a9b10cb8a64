"""Reference models of the built-in workload, built whole and cut into pipeline stages.

Both models are built on every rank from the same seed and then cut, so every
stage count starts from the same weights and data-parallel replicas of a stage
are identical. Both use dropout, so a checkpoint that forgets the RNG shows.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from harness.worker.shapes import ModelShape


class CausalSelfAttention(nn.Module):
    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        self.heads = s.heads
        self.qkv = nn.Linear(s.width, 3 * s.width)
        self.proj = nn.Linear(s.width, s.width)
        self.attn_drop = nn.Dropout(s.dropout)
        self.resid_drop = nn.Dropout(s.dropout)
        self.register_buffer("mask", torch.tril(torch.ones(s.seq_len, s.seq_len, dtype=torch.bool)), persistent=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        mask: torch.Tensor = self.mask  # type: ignore[assignment]  # a registered buffer
        att = att.masked_fill(~mask[:t, :t], float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(s.width)
        self.attn = CausalSelfAttention(s)
        self.ln2 = nn.LayerNorm(s.width)
        self.mlp = nn.Sequential(
            nn.Linear(s.width, 4 * s.width), nn.GELU(), nn.Linear(4 * s.width, s.width), nn.Dropout(s.dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPTEmbed(nn.Module):
    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        self.tok = nn.Embedding(s.vocab, s.width)
        self.pos = nn.Embedding(s.seq_len, s.width)
        self.drop = nn.Dropout(s.dropout)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        return self.drop(self.tok(idx) + self.pos(pos))


class GPTHead(nn.Module):
    def __init__(self, s: ModelShape) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(s.width)
        self.out = nn.Linear(s.width, s.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


class MLPBlock(nn.Module):
    def __init__(self, width_in: int, width: int, dropout: float, batchnorm: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(width_in, width)
        self.norm = nn.BatchNorm1d(width) if batchnorm else nn.Identity()
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(F.gelu(self.norm(self.fc(x))))


class Stage(nn.Module):
    """One pipeline stage: an optional input part, some blocks, an optional output part. Its tensors
    keep the whole model's names (``blocks.<i>`` with i the block's index in the whole model, as
    torchtitan keeps a stage's layers), so every stage's checkpoint keys are distinct and load into
    the same model split into any number of stages."""

    def __init__(self, embed: nn.Module | None, blocks: dict[int, nn.Module], head: nn.Module | None) -> None:
        super().__init__()
        self.embed = embed
        self.blocks = nn.ModuleDict({str(i): b for i, b in blocks.items()})
        self.head = head
        self.autocast: torch.dtype | None = None
        """Mixed precision: the forward under ``torch.autocast`` in this dtype, its output in float32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.autocast is None:
            return self._layers(x)
        with torch.autocast("cpu", dtype=self.autocast):
            y = self._layers(x)
        return y.float()  # what the next stage (and the loss) receive, as the stage's metadata says

    def _layers(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for b in self.blocks.values():
            x = b(x)
        if self.head is not None:
            x = self.head(x)
        return x


def build_stage(shape: ModelShape, seed: int, stage: int, stages: int) -> Stage:
    """Build the whole model from ``seed`` and keep the part that belongs to ``stage``."""
    if not 1 <= stages <= shape.layers:
        raise ValueError(f"stages must be 1..{shape.layers} for this model, got {stages}")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if shape.kind == "gpt":
            embed: nn.Module = GPTEmbed(shape)
            blocks: list[nn.Module] = [Block(shape) for _ in range(shape.layers)]
            head: nn.Module = GPTHead(shape)
        else:
            embed = MLPBlock(shape.in_dim, shape.width, shape.dropout, shape.batchnorm)
            blocks = [MLPBlock(shape.width, shape.width, shape.dropout, shape.batchnorm) for _ in range(shape.layers - 1)]
            head = nn.Linear(shape.width, shape.classes)
    return Stage(embed if stage == 0 else None, {i: blocks[i] for i in shape.stage_blocks(stage, stages)},
                 head if stage == stages - 1 else None)


def parallelize_mlps(stage: Stage, mesh: Any) -> None:
    """Tensor parallelism on the MLP of every block of ``stage``: its first Linear column-wise, its
    second row-wise over ``mesh`` (the hidden layer sharded, the block's output whole again). The
    attention and the norms stay replicated: every tensor-parallel rank holds them whole."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    for block in stage.blocks.values():
        if not isinstance(block, Block):
            raise ValueError("tensor parallelism needs a gpt model")
        parallelize_module(block.mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def stage_io(shape: ModelShape, microbatch: int, stage: int, stages: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Example input and output of one microbatch through ``stage`` (shapes and dtypes only).

    Given to ``PipelineStage``, they spare it the metadata inference that torch 2.13 runs otherwise on
    the first step: an extra forward of a microbatch through every stage, in training mode, which moves
    BatchNorm's running statistics and so makes a job restarted from a checkpoint diverge from one
    that was not (the restarted job infers again at its first step)."""
    # Activations carry gradients (without requires_grad a stage would neither send nor expect them);
    # the first stage's input is data.
    if shape.kind == "gpt":
        x = (torch.empty(microbatch, shape.seq_len, dtype=torch.long) if stage == 0
             else torch.empty(microbatch, shape.seq_len, shape.width, requires_grad=True))
        y = torch.empty(microbatch, shape.seq_len, shape.vocab if stage == stages - 1 else shape.width, requires_grad=True)
    else:
        x = (torch.empty(microbatch, shape.in_dim) if stage == 0
             else torch.empty(microbatch, shape.width, requires_grad=True))
        y = torch.empty(microbatch, shape.classes if stage == stages - 1 else shape.width, requires_grad=True)
    return x, y


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross entropy for both presets (token logits or class logits)."""
    return F.cross_entropy(output.reshape(-1, output.size(-1)), target.reshape(-1))
