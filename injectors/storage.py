"""Storage faults on the persistent checkpoint tier: damaged files, a full disk, slow writes.

The checkpoint library must notice each of them and lose nothing: a damaged
checkpoint fails its checksum and the restore falls back to the last good one;
a write that fails (ENOSPC) is journaled as ``checkpoint_failed`` and ``latest``
keeps naming the last good checkpoint; slow writes only delay persistence.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from .base import RunShape
from .errors import FaultConfigError, HostUnsupported
from .trigger import PointFault, WindowFault
from .worker import InWorkerInjector, WindowInjector

#: Files of a checkpoint directory that are bookkeeping, not checkpoint data.
_BOOKKEEPING = ("manifest.json", ".metadata")


@dataclass(kw_only=True, slots=True)
class CorruptConfig(PointFault):
    """Damage a committed checkpoint right after it was saved (a bit flip on disk, a truncated
    upload, a deleted object). Nothing happens until a restore needs it: a later fault must
    make the job restore, and the restore must reject the damaged copy."""

    kind: ClassVar[str] = "corrupt"
    phases: ClassVar[tuple[str, ...]] = ("saved",)
    tier: Literal["persistent"] = "persistent"
    """The tier whose copy is damaged."""
    phase: str = "saved"
    """``saved``: once the checkpoint of ``at_step`` is committed."""
    how: Literal["flip", "truncate", "delete"] = "flip"
    """``flip``: invert one byte in the middle of a data file; ``truncate``: cut it to half;
    ``delete``: remove it."""
    file: int = 0
    """Which data file of the checkpoint (sorted by name; the shard of that rank for ``sync``)."""

    def check(self, run: RunShape) -> None:
        PointFault.check(self, run)
        if self.file < 0:
            raise FaultConfigError("file", "an index >= 0", self.file)

    def targets(self, rank: int, node: int, local_rank: int) -> bool:
        return rank == 0  # rank 0 commits, so it knows first when the checkpoint is complete


def data_files(step_dir: Path) -> list[Path]:
    """The data files of a committed checkpoint directory, sorted by name."""
    return sorted(p for p in step_dir.iterdir() if p.is_file() and p.name not in _BOOKKEEPING
                  and not p.name.endswith((".tmp", ".json", ".failed")))


class CorruptInjector(InWorkerInjector):
    """Fires on the ``checkpoint_saved`` event of the persistent tier."""

    def _on_event(self, kind: str, fields: dict[str, Any]) -> None:
        if kind == "checkpoint_saved" and fields.get("tier") == "persistent" and fields.get("path"):
            InWorkerInjector._on_event(self, "phase", {"phase": "saved", "step": fields["step"], "path": fields["path"]})

    def inject(self, fields: dict[str, Any]) -> None:
        files = data_files(Path(fields["path"]))
        if not files:
            self.ctx.record("fault_effect", id=self.fault_id, effect="no data file to damage", path=fields["path"])
            return
        victim = files[self.config.file % len(files)]
        size = victim.stat().st_size
        if self.config.how == "flip":
            with open(victim, "r+b") as f:
                f.seek(size // 2)
                byte = f.read(1)
                f.seek(size // 2)
                f.write(bytes([byte[0] ^ 0xFF]))
                f.flush()
                os.fsync(f.fileno())
        elif self.config.how == "truncate":
            os.truncate(victim, size // 2)
        else:
            victim.unlink()
        self.ctx.record("fault_effect", id=self.fault_id, effect=self.config.how, file=str(victim), size=size)


@dataclass(kw_only=True, slots=True)
class DiskFullConfig(WindowFault):
    """The persistent tier's file system is full: every write fails with ENOSPC.

    The harness gives the run's checkpoint directory a file system of its own (a
    tmpfs of ``size_mb``, mounted for the run and unmounted after it, so it needs
    root); when the window opens, a ballast file takes all of its free space,
    and it is deleted when the window closes.
    """

    kind: ClassVar[str] = "disk_full"
    tier: Literal["persistent"] = "persistent"
    """The tier whose storage fills up."""
    size_mb: int = 512
    """Size of the run's checkpoint file system (it must hold ``keep`` checkpoints)."""

    def check(self, run: RunShape) -> None:
        WindowFault.check(self, run)
        if self.size_mb < 1:
            raise FaultConfigError("size_mb", "megabytes >= 1", self.size_mb)

    def preflight(self) -> None:
        if os.geteuid() != 0:
            raise HostUnsupported("disk_full needs root to mount a file system of its own for the checkpoints "
                                  "(run as root, or drop the disk_full fault)")
        if shutil.which("mount") is None or shutil.which("umount") is None:
            raise HostUnsupported("disk_full needs the mount and umount commands (Debian package mount)")

    def targets(self, rank: int, node: int, local_rank: int) -> bool:
        return rank == 0  # one ballast fills the file system every rank writes to


BALLAST = ".baft-ballast"


class DiskFullInjector(WindowInjector):
    def begin(self) -> None:
        root = self.ctx.checkpoint_dir
        if root is None:
            raise HostUnsupported("disk_full needs a local checkpoint directory")
        root.mkdir(parents=True, exist_ok=True)
        st = os.statvfs(root)
        free = st.f_bavail * st.f_frsize
        fd = os.open(root / BALLAST, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            if free:
                os.posix_fallocate(fd, 0, free)
        finally:
            os.close(fd)
        self.ctx.record("fault_effect", id=self.fault_id, effect="ballast", bytes=free)

    def end(self) -> None:
        if self.ctx.checkpoint_dir is not None:
            (self.ctx.checkpoint_dir / BALLAST).unlink(missing_ok=True)


def mount_private(path: Path, size_mb: int) -> None:
    """Mount a tmpfs of ``size_mb`` at ``path`` (the run's checkpoint directory)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "baft-ckpt", str(path)],
                   check=True, capture_output=True, text=True)


def unmount_private(path: Path) -> None:
    """Undo :func:`mount_private` (lazily, so a straggling reader cannot keep it mounted)."""
    subprocess.run(["umount", "-l", str(path)], capture_output=True, text=True)


@dataclass(kw_only=True, slots=True)
class SlowStorageConfig(WindowFault):
    """Writes to the persistent tier take longer: each checkpoint write starts ``delay_ms`` late
    on every rank (a congested object store, a throttled volume)."""

    kind: ClassVar[str] = "slow_storage"
    tier: Literal["persistent"] = "persistent"
    """The tier that is slow."""
    delay_ms: float = 500.0
    """Added to every checkpoint write of every rank."""

    def check(self, run: RunShape) -> None:
        WindowFault.check(self, run)
        if self.delay_ms <= 0:
            raise FaultConfigError("delay_ms", "milliseconds > 0", self.delay_ms)

    def targets(self, rank: int, node: int, local_rank: int) -> bool:
        return True


class SlowStorageInjector(WindowInjector):
    """Sleeps on the ``persist`` phase event, in whichever thread writes the checkpoint."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.writes = 0

    def _on_event(self, kind: str, fields: dict[str, Any]) -> None:
        WindowInjector._on_event(self, kind, fields)
        if self.on and kind == "phase" and fields.get("phase") == "persist":
            time.sleep(self.config.delay_ms / 1e3)
            self.writes += 1

    def end(self) -> None:
        self.ctx.record("slow_storage_summary", id=self.fault_id, writes=self.writes,
                        delay_seconds=round(self.writes * self.config.delay_ms / 1e3, 4))
