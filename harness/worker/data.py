"""A deterministic, learnable synthetic dataset and a sampler that resumes mid-epoch.

Samples are pure functions of ``(seed, index)``; the light augmentation noise is
a pure function of ``(seed, epoch, index)``. The only state of the data pipeline
is therefore the sampler's position and the loader's ``torch.Generator``, which
draws each epoch's permutation; both are checkpointed.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from harness.worker.shapes import ModelShape


def mix(*parts: int) -> int:
    """A 63-bit seed derived from integers, stable across processes and platforms."""
    h = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 1


class MarkovTokens(Dataset):
    """Token sequences from a sparse random Markov chain: each token has four likely successors."""

    def __init__(self, shape: ModelShape, seed: int, size: int, noise: float = 0.05) -> None:
        self.shape, self.seed, self.size, self.noise = shape, seed, size, noise
        g = torch.Generator().manual_seed(mix(seed, 1))
        self.successors = torch.stack([torch.randperm(shape.vocab, generator=g)[:4] for _ in range(shape.vocab)])
        self.probs = torch.tensor([0.6, 0.25, 0.1, 0.05])

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, index = key
        g = torch.Generator().manual_seed(mix(self.seed, 2, index))
        n = self.shape.seq_len + 1
        choice = torch.multinomial(self.probs, n - 1, replacement=True, generator=g).tolist()
        toks = [int(torch.randint(self.shape.vocab, (1,), generator=g))]
        for c in choice:
            toks.append(int(self.successors[toks[-1], c]))
        seq = torch.tensor(toks)
        x, y = seq[:-1].clone(), seq[1:]
        aug = torch.Generator().manual_seed(mix(self.seed, 3, epoch, index))
        flip = torch.rand(x.shape, generator=aug) < self.noise
        x[flip] = torch.randint(self.shape.vocab, x.shape, generator=aug)[flip]
        return x, y


class TeacherClasses(Dataset):
    """Gaussian inputs labelled by a fixed random two-layer teacher network."""

    def __init__(self, shape: ModelShape, seed: int, size: int, noise: float = 0.05) -> None:
        self.shape, self.seed, self.size, self.noise = shape, seed, size, noise
        g = torch.Generator().manual_seed(mix(seed, 1))
        self.w1 = torch.randn(shape.in_dim, 64, generator=g)
        self.w2 = torch.randn(64, shape.classes, generator=g)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, index = key
        g = torch.Generator().manual_seed(mix(self.seed, 2, index))
        x = torch.randn(self.shape.in_dim, generator=g)
        y = torch.argmax(torch.tanh(x @ self.w1) @ self.w2)
        aug = torch.Generator().manual_seed(mix(self.seed, 3, epoch, index))
        return x + self.noise * torch.randn(x.shape, generator=aug), y


def make_dataset(shape: ModelShape, seed: int, size: int) -> Dataset:
    return MarkovTokens(shape, seed, size) if shape.kind == "gpt" else TeacherClasses(shape, seed, size)


class ResumableBatchSampler:
    """Yields this replica's share of each global batch, forever, epoch after epoch.

    Each epoch's order is a permutation drawn from ``generator``; the state
    (epoch, batch within the epoch, the generator's state before this epoch's
    draw) is enough to continue at exactly the next batch after a restart.
    Items are ``(epoch, index)`` keys so the dataset can derive per-epoch
    augmentation from them.
    """

    def __init__(self, size: int, global_batch: int, generator: torch.Generator, replica: int, replicas: int) -> None:
        if global_batch % replicas:
            raise ValueError("global batch must divide evenly among replicas")
        if size < global_batch:
            raise ValueError("dataset smaller than one global batch")
        self.size, self.global_batch, self.generator = size, global_batch, generator
        self.replica, self.replicas = replica, replicas
        self.epoch = 0
        self.batch = 0
        self._epoch_generator_state: torch.Tensor | None = None
        self._perm: torch.Tensor | None = None

    @property
    def batches_per_epoch(self) -> int:
        return self.size // self.global_batch

    def _draw(self) -> torch.Tensor:
        if self._epoch_generator_state is None:
            self._epoch_generator_state = self.generator.get_state()
        else:
            self.generator.set_state(self._epoch_generator_state)
        return torch.randperm(self.size, generator=self.generator)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        while True:
            if self.batch >= self.batches_per_epoch:
                self.epoch, self.batch = self.epoch + 1, 0
                self._perm, self._epoch_generator_state = None, None
            if self._perm is None:
                self._perm = self._draw()
            lo = self.batch * self.global_batch
            chunk = self._perm[lo : lo + self.global_batch][self.replica :: self.replicas]
            self.batch += 1
            yield [(self.epoch, int(i)) for i in chunk]

    def state_dict(self) -> dict[str, Any]:
        drawn = self._epoch_generator_state is not None
        gen = self._epoch_generator_state if self._epoch_generator_state is not None else self.generator.get_state()
        return {"epoch": self.epoch, "batch": self.batch, "epoch_generator": gen.clone(), "drawn": drawn}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
        if bool(state.get("drawn", True)):
            self._epoch_generator_state = state["epoch_generator"].clone()
            # Replay this epoch's draw now, so the generator is where an uninterrupted
            # run's would be even if the next batch starts a new epoch.
            self._perm = self._draw()
        else:
            # Saved before the epoch's permutation was drawn (the very first boundary): the
            # generator is left where it was then, and the first batch draws, as it did.
            self._epoch_generator_state, self._perm = None, None
            self.generator.set_state(state["epoch_generator"].clone())


def make_loader(dataset: Dataset, sampler: ResumableBatchSampler, generator: torch.Generator) -> DataLoader:
    """In-process loading keeps the sampler's position equal to what training consumed."""
    return DataLoader(dataset, batch_sampler=sampler, num_workers=0, generator=generator)
