"""A checkpoint directory on durable storage with atomic commits.

Layout under ``root`` (a local directory or an fsspec URL, see :mod:`baft.persist.storage`)::

    step-00000015/rank-00000.pt     one shard per rank (torch.save of plain data)
    step-00000015/manifest.json     written after every shard is durable:
                                    step, world size, per-shard size and checksum (blake2b;
                                    baft's DCP writers' ``crc32:``, :class:`~baft.persist.writer.Crc32`)
    latest                          the newest committed step, moved last

On a local disk each file is written to a temporary name, fsynced, renamed
into place and the directory fsynced, so a crash at any moment leaves either
the old or the new version, never a torn one. On an object store, which has no
rename, each object is written whole and its checksum computed by reading it
back; the manifest is written only after every data file is, and ``latest``
only after the manifest. Either way ``latest`` advances only once the data
is durable. A shard is loaded with ``weights_only=True`` only after its
checksum matches the manifest.
"""
from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from baft.errors import CheckpointCorrupt
from baft.persist import storage
from baft.persist.storage import Root, Storage
from baft.persist.writer import CRC32, MISSING_AT_COMMIT, SHORT_AT_COMMIT, Crc32

MANIFEST = "manifest.json"
LATEST = "latest"


def step_name(step: int) -> str:
    """The directory of checkpoint ``step``, relative to the root."""
    return f"step-{step:08d}"


def step_dir(root: Root, step: int) -> Path | str:
    """Where checkpoint ``step`` lives: a Path under a local root, a URL under a URL root."""
    return storage.at(root).location(step_name(step))


def shard_name(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def _hash(like: str | None) -> Any:
    """The hash a manifest's checksum was made with: CRC-32 when ``like`` (the recorded one) is tagged so
    (baft's writers, :class:`baft.persist.writer.Crc32`), else blake2b (every other writer, older manifests)."""
    return Crc32() if like is not None and like.startswith(CRC32) else hashlib.blake2b(digest_size=16)


def checksum(data: bytes | memoryview, like: str | None = None) -> str:
    """The checksum of ``data`` to record in a manifest (blake2b), or to compare with ``like``, a recorded one."""
    h = _hash(like)
    h.update(data)
    digest: str = h.hexdigest()
    return digest


def file_checksum(st: Storage, rel: str, block: int = 8 << 20, like: str | None = None) -> tuple[int, str]:
    """Size and checksum of a stored file, read back in blocks (made as ``like`` was: :func:`checksum`)."""
    h = _hash(like)
    size = 0
    with st.open(rel) as f:
        while chunk := f.read(block):
            h.update(chunk)
            size += len(chunk)
    digest: str = h.hexdigest()
    return size, digest


def serialize(components: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(components, buf)
    return buf.getvalue()


def deserialize(data: bytes) -> dict[str, Any]:
    components: dict[str, Any] = torch.load(io.BytesIO(data), weights_only=True)
    return components


@dataclass(frozen=True, slots=True)
class ShardRecord:
    """What the manifest says about one rank's shard."""

    rank: int
    file: str
    size: int
    checksum: str


def write_shard(root: Root, step: int, rank: int, data: bytes) -> ShardRecord:
    """Durably write one rank's serialized shard of checkpoint ``step``.

    On storage that cannot be fsynced the stored object is read back, and a
    :class:`CheckpointCorrupt` raised unless it is exactly ``data``."""
    st = storage.at(root)
    rel = f"{step_name(step)}/{shard_name(rank)}"
    st.write(rel, data)
    record = ShardRecord(rank=rank, file=shard_name(rank), size=len(data), checksum=checksum(data))
    if st.read_back:
        size, digest = file_checksum(st, rel)
        if (size, digest) != (record.size, record.checksum):
            raise CheckpointCorrupt(f"{st.location(rel)}: stored {size} bytes that differ from the {record.size} written")
    return record


def write_record(root: Root, step: int, record: ShardRecord) -> None:
    """Publish a durable shard's record as a file, for a committer that cannot use collectives."""
    rec = {"rank": record.rank, "file": record.file, "size": record.size, "checksum": record.checksum}
    storage.at(root).write(f"{step_name(step)}/rank-{record.rank:05d}.record.json", json.dumps(rec).encode())


def wait_records(root: Root, step: int, world_size: int, timeout: float) -> list[ShardRecord] | None:
    """Every rank's record of ``step`` once all are there; None after ``timeout`` seconds or as
    soon as a rank reported that it cannot deliver (:func:`write_failure`)."""
    st = storage.at(root)
    d = step_name(step)
    deadline = time.monotonic() + timeout
    while True:
        names = st.files(d)
        if any(fnmatch.fnmatch(n, "rank-*.failed") for n in names):
            return None
        found = [n for n in names if fnmatch.fnmatch(n, "rank-*.record.json")]
        if len(found) >= world_size:
            try:
                return [ShardRecord(**json.loads(st.read(f"{d}/{n}"))) for n in found[:world_size]]
            except ValueError:
                pass  # a record still being written where writes are not atomic (file://): poll again
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)


def _publish(st: Storage, step: int, manifest: dict[str, Any]) -> None:
    """Write the manifest of ``step``, then move ``latest`` to it: the two steps of every commit."""
    _run_on(st, _publish_ops(step, manifest))


def _publish_ops(step: int, manifest: dict[str, Any]) -> list[FileOp]:
    """:func:`_publish` as file operations."""
    return [FileOp("write", f"{step_name(step)}/{MANIFEST}", data=json.dumps(manifest, indent=1).encode()),
            FileOp("write", LATEST, data=f"{step}\n".encode())]


def commit(root: Root, step: int, shards: list[ShardRecord], extra: dict[str, Any] | None = None) -> None:
    """Write the manifest of ``step`` and then move ``latest`` to it (in that order).

    Raises :class:`CheckpointCorrupt`, committing nothing, when a shard file is
    missing or not the size its record says."""
    st = storage.at(root)
    for s in shards:
        rel = f"{step_name(step)}/{s.file}"
        try:
            size = st.size(rel)
        except FileNotFoundError as e:
            raise CheckpointCorrupt(f"{st.location(rel)}: missing at commit; step {step} not committed") from e
        if size != s.size:
            raise CheckpointCorrupt(f"{st.location(rel)}: {size} bytes at commit, record says {s.size}")
    _publish(st, step, {
        "step": step,
        "world_size": len(shards),
        "shards": {str(s.rank): {"file": s.file, "size": s.size, "checksum": s.checksum} for s in shards},
        **(extra or {}),
    })


def commit_directory(root: Root, step: int, world_size: int, extra: dict[str, Any] | None = None,
                     required: Mapping[str, int] | None = None) -> None:
    """Commit a checkpoint directory written by another library (DCP): make every file in
    it durable, checksum it as stored, write the manifest, then move ``latest``.

    ``required``: files that must be there, each with its least acceptable size
    (what the writer's own metadata says it wrote). A missing or short one
    raises :class:`CheckpointCorrupt` and nothing is committed."""
    st = storage.at(root)
    d = step_name(step)
    names = [n for n in st.files(d) if n != MANIFEST and not n.endswith(".tmp")]
    missing = sorted(set(required or {}) - set(names)) or ([] if names else ["every file"])
    if missing:
        raise CheckpointCorrupt(f"{st.location(d)}: {', '.join(missing)} missing at commit; step {step} not committed")
    st.sync(d, names)
    files = {}
    for name in names:
        size, digest = file_checksum(st, f"{d}/{name}")
        least = (required or {}).get(name, 0)
        if size < least:
            raise CheckpointCorrupt(f"{st.location(d)}/{name}: {size} bytes at commit, its writer wrote {least}")
        files[name] = {"size": size, "checksum": digest}
    _publish(st, step, {"step": step, "world_size": world_size, "files": files, **(extra or {})})


@dataclass(frozen=True, slots=True)
class FileOp:
    """One step of a commit on storage (:func:`commit_file_ops`), run in order by :func:`run_ops` or by baft's
    writer process (:meth:`baft.persist.writer.WriterProcess.run`): ``expect`` a file at ``size`` bytes (and,
    on storage read back, at ``checksum``), ``write`` ``data`` durably (``sync_dir``: its directory entry too),
    ``remove`` a directory tree."""

    kind: str
    rel: str
    size: int = 0
    checksum: str = ""
    data: bytes = b""
    sync_dir: bool = True


def commit_file_ops(step: int, world_size: int, files: Mapping[str, tuple[int, str]],
                    extra: dict[str, Any] | None = None) -> list[FileOp]:
    """How to commit a checkpoint directory whose writers made each of ``files`` durable and report its size
    and checksum (name -> (size, checksum)): check each is there at that size, write the manifest (its write
    into the directory makes the writers' renames durable), then move ``latest``."""
    d = step_name(step)
    manifest = {"step": step, "world_size": world_size,
                "files": {n: {"size": size, "checksum": digest} for n, (size, digest) in files.items()}, **(extra or {})}
    return [*(FileOp("expect", f"{d}/{name}", size, digest) for name, (size, digest) in files.items()),
            *_publish_ops(step, manifest)]


def run_ops(root: Root, ops: Sequence[FileOp]) -> None:
    """Run ``ops`` in order on ``root``'s storage; a file not as expected raises :class:`CheckpointCorrupt`
    and runs nothing after it."""
    _run_on(storage.at(root), ops)


def _run_on(st: Storage, ops: Sequence[FileOp]) -> None:
    for op in ops:
        if op.kind == "expect":
            try:
                found = st.size(op.rel)
            except FileNotFoundError as e:
                raise CheckpointCorrupt(f"{st.location(op.rel)}: {MISSING_AT_COMMIT}") from e
            if found != op.size or (st.read_back and file_checksum(st, op.rel, like=op.checksum) != (op.size, op.checksum)):
                raise CheckpointCorrupt(f"{st.location(op.rel)}: {found} {SHORT_AT_COMMIT} {op.size}")
        elif op.kind == "write":
            st.write_parts(op.rel, (op.data,), sync_dir=op.sync_dir)
        elif op.kind == "remove":
            st.remove_tree(op.rel)
        else:
            raise ValueError(f"a file operation {op.kind!r}")


def commit_files(root: Root, step: int, world_size: int, files: Mapping[str, tuple[int, str]],
                 extra: dict[str, Any] | None = None) -> None:
    """Commit a checkpoint directory whose writers made each of ``files`` durable and report its
    size and checksum (:func:`commit_file_ops`; on storage that cannot be fsynced each is read back and
    checksummed). A missing or short file raises :class:`CheckpointCorrupt` and nothing is committed."""
    run_ops(root, commit_file_ops(step, world_size, files, extra))


def verify_directory(root: Root, step: int) -> None:
    """Raise :class:`CheckpointCorrupt` unless every file the manifest lists matches it."""
    st = storage.at(root)
    d = step_name(step)
    for name, rec in read_manifest(root, step).get("files", {}).items():
        rel = f"{d}/{name}"
        try:
            size, digest = file_checksum(st, rel, like=rec["checksum"])
        except FileNotFoundError as e:
            raise CheckpointCorrupt(f"{st.location(rel)}: missing") from e
        if size != rec["size"] or digest != rec["checksum"]:
            raise CheckpointCorrupt(f"{st.location(rel)}: checksum mismatch (size {size}, manifest {rec['size']})")


def latest(root: Root) -> int | None:
    st = storage.at(root)  # outside the try: a BaftConfigError is a ValueError too
    try:
        return int(st.read(LATEST).decode().strip())
    except (FileNotFoundError, ValueError):
        return None


def _step_dirs(st: Storage) -> dict[int, str]:
    """Step number -> directory name of every ``step-*`` directory under the root."""
    steps = {}
    for name in st.dirs():
        if name.startswith("step-"):
            try:
                steps[int(name.split("-", 1)[1])] = name
            except ValueError:
                continue
    return steps


def committed_steps(root: Root) -> list[int]:
    """Steps with a manifest, newest first, never newer than ``latest``."""
    st = storage.at(root)
    top = latest(root)
    return sorted((s for s, name in _step_dirs(st).items()
                   if (top is None or s <= top) and st.is_file(f"{name}/{MANIFEST}")), reverse=True)


def read_manifest(root: Root, step: int) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(storage.at(root).read(f"{step_name(step)}/{MANIFEST}"))
    return manifest


def read_shard(root: Root, step: int, rank: int, world_size: int) -> bytes:
    """The verified bytes of ``rank``'s shard; raises :class:`CheckpointCorrupt`."""
    manifest = read_manifest(root, step)
    if manifest["world_size"] != world_size:
        raise CheckpointCorrupt(f"step {step}: saved by {manifest['world_size']} ranks, restoring with {world_size}")
    rec = manifest["shards"].get(str(rank))
    if rec is None:
        raise CheckpointCorrupt(f"step {step}: manifest has no shard for rank {rank}")
    st = storage.at(root)
    rel = f"{step_name(step)}/{rec['file']}"
    try:
        data = st.read(rel)
    except FileNotFoundError as e:
        raise CheckpointCorrupt(f"{st.location(rel)}: missing") from e
    if len(data) != rec["size"] or checksum(data, like=rec["checksum"]) != rec["checksum"]:
        raise CheckpointCorrupt(f"{st.location(rel)}: checksum mismatch (size {len(data)}, manifest {rec['size']})")
    return data


def prune(root: Root, keep: int) -> None:
    """Delete all but the newest ``keep`` committed checkpoints (and stale partial ones)."""
    run_ops(root, prune_ops(root, keep))


def prune_ops(root: Root, keep: int, committing: int | None = None) -> list[FileOp]:
    """The removals of :func:`prune`, as if ``committing`` (a step whose commit runs first) were committed too."""
    st = storage.at(root)
    steps = sorted({*committed_steps(root), *([] if committing is None else [committing])}, reverse=True)
    keep_set = set(steps[:keep])
    newest = steps[0] if steps else -1
    return [FileOp("remove", name) for s, name in _step_dirs(st).items() if s not in keep_set and s < newest]


COMMIT_FAILED = "commit.failed"
"""The marker rank 0 leaves in a step's directory when it could not commit it (the reason inside)."""


def write_commit_failure(root: Root, step: int, reason: str) -> None:
    """Tell every rank waiting in :func:`wait_commit` that ``step`` will not be committed (best effort)."""
    try:
        storage.at(root).write(f"{step_name(step)}/{COMMIT_FAILED}", reason.encode())
    except OSError:
        pass


def commit_outcome(root: Root, step: int) -> tuple[bool, str | None]:
    """What became of ``step``'s commit: (True, None) committed; (True, why) it will not be (rank 0 said
    its commit failed, or a rank that it cannot deliver its shard); (False, None) not decided yet."""
    st = storage.at(root)
    d = step_name(step)
    if st.is_file(f"{d}/{MANIFEST}") and (latest(root) or -1) >= step:
        return True, None
    names = st.files(d)  # [] while the directory is missing
    if COMMIT_FAILED in names:
        try:
            return True, st.read(f"{d}/{COMMIT_FAILED}").decode(errors="replace") or "rank 0 could not commit"
        except OSError:
            return True, "rank 0 could not commit"
    failed = sorted(n for n in names if fnmatch.fnmatch(n, "rank-*.failed"))
    if failed:
        return True, f"{failed[0].removesuffix('.failed')} could not deliver its shard"
    return False, None


def wait_commit(root: Root, step: int, timeout: float) -> str | None:
    """Wait until :func:`commit_outcome` decides: None once committed, else why not (also after
    ``timeout`` seconds), for the journal."""
    deadline = time.monotonic() + timeout
    while True:
        decided, reason = commit_outcome(root, step)
        if decided:
            return reason
        if time.monotonic() > deadline:
            return f"rank 0 did not commit step {step} within {timeout:.0f} s"
        time.sleep(0.01)


def write_failure(root: Root, step: int, rank: int, reason: str) -> None:
    """Tell the committer that ``rank`` cannot deliver its shard of ``step`` (best effort: an
    empty marker needs no data blocks, so it usually fits on a full disk)."""
    try:
        storage.at(root).write(f"{step_name(step)}/rank-{rank:05d}.failed", b"")
    except OSError:
        pass
