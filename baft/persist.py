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
import time
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


def write_record(root: Path, step: int, record: ShardRecord) -> None:
    """Publish a durable shard's record as a file, for a committer that cannot use collectives."""
    rec = {"rank": record.rank, "file": record.file, "size": record.size, "checksum": record.checksum}
    atomic_write(step_dir(root, step) / f"rank-{record.rank:05d}.record.json", json.dumps(rec).encode())


def wait_records(root: Path, step: int, world_size: int, timeout: float) -> list[ShardRecord] | None:
    """Every rank's record of ``step`` once all are there; None after ``timeout`` seconds."""
    d = step_dir(root, step)
    deadline = time.monotonic() + timeout
    while True:
        found = sorted(d.glob("rank-*.record.json"))
        if len(found) >= world_size:
            return [ShardRecord(**json.loads(p.read_text())) for p in found[:world_size]]
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)


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


def file_checksum(path: Path, block: int = 8 << 20) -> tuple[int, str]:
    """Size and blake2b checksum of a file, read in blocks."""
    h = hashlib.blake2b(digest_size=16)
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def commit_directory(root: Path, step: int, world_size: int, extra: dict[str, Any] | None = None) -> None:
    """Commit a checkpoint directory written by another library (DCP): checksum every
    file in it, fsync them, write the manifest, then move ``latest``."""
    d = step_dir(root, step)
    files = {}
    for f in sorted(p for p in d.iterdir() if p.is_file() and p.name != MANIFEST and not p.name.endswith(".tmp")):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        size, digest = file_checksum(f)
        files[f.name] = {"size": size, "checksum": digest}
    fsync_dir(d)
    manifest = {"step": step, "world_size": world_size, "files": files, **(extra or {})}
    atomic_write(d / MANIFEST, json.dumps(manifest, indent=1).encode())
    atomic_write(root / LATEST, f"{step}\n".encode())


def verify_directory(root: Path, step: int) -> None:
    """Raise :class:`CheckpointCorrupt` unless every file the manifest lists matches it."""
    d = step_dir(root, step)
    manifest = read_manifest(root, step)
    for name, rec in manifest.get("files", {}).items():
        try:
            size, digest = file_checksum(d / name)
        except FileNotFoundError as e:
            raise CheckpointCorrupt(f"{d / name}: missing") from e
        if size != rec["size"] or digest != rec["checksum"]:
            raise CheckpointCorrupt(f"{d / name}: checksum mismatch (size {size}, manifest {rec['size']})")


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
