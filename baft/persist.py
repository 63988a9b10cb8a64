"""A checkpoint directory on durable storage with atomic commits.

Layout under ``root``::

    step-00000015/rank-00000.pt     one shard per rank (torch.save of plain data)
    step-00000015/manifest.json     written after every shard is durable:
                                    step, world size, per-shard size and blake2b checksum
    latest                          the newest committed step, moved last

Each file is written to a temporary name, fsynced, renamed into place and the
directory fsynced, so a crash at any moment leaves either the old or the new
version, never a torn one. A shard is loaded with ``weights_only=True`` only
after its checksum matches the manifest.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointCorrupt

MANIFEST = "manifest.json"
LATEST = "latest"


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def shard_name(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def checksum(data: bytes | memoryview) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` so that readers see all of it or none of it."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def serialize(components: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(components, buf)
    return buf.getvalue()


def deserialize(data: bytes) -> dict[str, Any]:
    return torch.load(io.BytesIO(data), weights_only=True)


@dataclass(frozen=True, slots=True)
class ShardRecord:
    """What the manifest says about one rank's shard."""

    rank: int
    file: str
    size: int
    checksum: str


def write_shard(root: Path, step: int, rank: int, data: bytes) -> ShardRecord:
    """Durably write one rank's serialized shard of checkpoint ``step``."""
    d = step_dir(root, step)
    d.mkdir(parents=True, exist_ok=True)
    name = shard_name(rank)
    atomic_write(d / name, data)
    return ShardRecord(rank=rank, file=name, size=len(data), checksum=checksum(data))


def commit(root: Path, step: int, shards: list[ShardRecord], extra: dict[str, Any] | None = None) -> None:
    """Write the manifest of ``step`` and then move ``latest`` to it (in that order)."""
    manifest = {
        "step": step,
        "world_size": len(shards),
        "shards": {str(s.rank): {"file": s.file, "size": s.size, "checksum": s.checksum} for s in shards},
        **(extra or {}),
    }
    atomic_write(step_dir(root, step) / MANIFEST, json.dumps(manifest, indent=1).encode())
    atomic_write(root / LATEST, f"{step}\n".encode())


def latest(root: Path) -> int | None:
    try:
        return int((root / LATEST).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def committed_steps(root: Path) -> list[int]:
    """Steps with a manifest, newest first, never newer than ``latest``."""
    if not root.is_dir():
        return []
    top = latest(root)
    steps = []
    for d in root.glob("step-*"):
        if (d / MANIFEST).is_file():
            try:
                s = int(d.name.split("-", 1)[1])
            except ValueError:
                continue
            if top is None or s <= top:
                steps.append(s)
    return sorted(steps, reverse=True)


def read_manifest(root: Path, step: int) -> dict[str, Any]:
    return json.loads((step_dir(root, step) / MANIFEST).read_text())


def read_shard(root: Path, step: int, rank: int, world_size: int) -> bytes:
    """The verified bytes of ``rank``'s shard; raises :class:`CheckpointCorrupt`."""
    manifest = read_manifest(root, step)
    if manifest["world_size"] != world_size:
        raise CheckpointCorrupt(f"step {step}: saved by {manifest['world_size']} ranks, restoring with {world_size}")
    rec = manifest["shards"].get(str(rank))
    if rec is None:
        raise CheckpointCorrupt(f"step {step}: manifest has no shard for rank {rank}")
    path = step_dir(root, step) / rec["file"]
    try:
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise CheckpointCorrupt(f"{path}: missing") from e
    if len(data) != rec["size"] or checksum(data) != rec["checksum"]:
        raise CheckpointCorrupt(f"{path}: checksum mismatch (size {len(data)}, manifest {rec['size']})")
    return data


def prune(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` committed checkpoints (and stale partial ones)."""
    steps = committed_steps(root)
    keep_set = set(steps[:keep])
    newest = steps[0] if steps else -1
    for d in root.glob("step-*"):
        try:
            s = int(d.name.split("-", 1)[1])
        except ValueError:
            continue
        if s not in keep_set and s < newest:
            shutil.rmtree(d, ignore_errors=True)
