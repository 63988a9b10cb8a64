"""Where the persistent tier keeps its files: a local directory or an fsspec URL.

A root is either a local path (``str`` or :class:`~pathlib.Path`), handled with
``os`` calls exactly as before fsspec support existed, or a URL (anything with
``://``, e.g. ``s3://bucket/prefix``, ``file:///abs/path``, ``memory://x``),
handled through ``fsspec``. Both are addressed by names relative to the root
(``step-00000015/manifest.json``), so the commit protocol in
:mod:`baft.persist.commits` is written once.

The two differ in how one file becomes durable:

* a local file is written to a temporary name, fsynced, renamed into place and
  its directory fsynced: a crash leaves the old or the new version;
* an object store has no rename: each object is written whole in one upload and
  is there once the upload returned. What keeps a commit safe is the order the
  caller writes in (every data file, its checksum read back from the store,
  then the manifest, then ``latest``), not a rename.

``fsspec`` is optional: it is imported only when a URL is used, and a missing
one raises :class:`~baft.errors.BaftConfigError` that says how to install it.
"""
from __future__ import annotations

import os
import posixpath
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from baft.errors import BaftConfigError
from baft.persist.writer import fsync_path, write_durably

Root = str | os.PathLike[str]
"""A local directory or an fsspec URL."""

INSTALL_HINT = "fsspec installed (pip install 'baft-harness[fsspec]')"


def is_url(root: Root) -> bool:
    """Whether ``root`` names an fsspec location rather than a local directory."""
    return "://" in os.fspath(root)


def _fsspec_core(url: str) -> Any:
    """``fsspec.core``, or a :class:`BaftConfigError` naming ``url`` that says how to get it."""
    try:
        import fsspec.core
    except ImportError as e:
        raise BaftConfigError("dir", INSTALL_HINT, url) from e
    return fsspec.core


def check_url(url: str) -> None:
    """Fail early on a URL this process cannot open: fsspec or the protocol's backend
    (s3fs, gcsfs, ...) missing, or a protocol fsspec does not know. Instantiates no
    filesystem, so it contacts no server."""
    core = _fsspec_core(url)
    from fsspec.registry import get_filesystem_class

    for part in url.split("::"):  # chained URLs: "simplecache::s3://bucket/x"
        protocol = core.split_protocol(part)[0] or "file"
        try:
            get_filesystem_class(protocol)
        except ImportError as e:
            raise BaftConfigError("dir", f"the fsspec backend for {protocol!r} installed ({e})", url) from e
        except ValueError as e:
            raise BaftConfigError("dir", f"a URL with a protocol fsspec knows ({e})", url) from e


class Storage:
    """Files under one root, addressed by ``/``-separated names relative to it."""

    needs_fsync: bool = True
    """Whether a written file is durable only after fsync (a local disk), rather than once
    its write returned (an object store). DCP's writer is told to fsync accordingly."""
    read_back: bool = False
    """Whether a freshly written file's checksum must be computed by reading it back:
    for an object store nothing else proves what was stored; a local file that was
    fsynced from the bytes just hashed would only be re-read from the page cache."""

    def location(self, rel: str = "") -> Path | str:
        """What another library (DCP) or a person opens for ``rel``: a Path or a URL."""
        raise NotImplementedError

    def write(self, rel: str, data: bytes | memoryview) -> None:
        """Write all of ``data`` to ``rel``, durably, creating parent directories."""
        raise NotImplementedError

    def write_parts(self, rel: str, parts: Sequence[bytes | memoryview], sync_dir: bool = True) -> None:
        """:meth:`write` of the concatenation of ``parts`` (here joined first). Without ``sync_dir`` the
        caller makes the directory entry durable later (a later write into the same directory does)."""
        self.write(rel, b"".join(parts))

    def read(self, rel: str) -> bytes:
        """The bytes of ``rel``; :class:`FileNotFoundError` if it is not there."""
        raise NotImplementedError

    def open(self, rel: str) -> IO[bytes]:
        """``rel`` opened for reading in binary mode."""
        raise NotImplementedError

    def size(self, rel: str) -> int:
        """Size in bytes of ``rel``; :class:`FileNotFoundError` if it is not there."""
        raise NotImplementedError

    def is_file(self, rel: str) -> bool:
        raise NotImplementedError

    def files(self, rel: str) -> list[str]:
        """Sorted names of the plain files directly in directory ``rel`` ([] if it is missing)."""
        raise NotImplementedError

    def dirs(self, rel: str = "") -> list[str]:
        """Sorted names of the directories directly in ``rel`` ([] if it is missing)."""
        raise NotImplementedError

    def makedirs(self, rel: str) -> None:
        raise NotImplementedError

    def sync(self, rel: str, names: list[str]) -> None:
        """Make files ``names`` of directory ``rel``, written by someone else, durable."""
        raise NotImplementedError

    def remove_tree(self, rel: str) -> None:
        """Delete directory ``rel`` and everything in it, ignoring errors (like ``rmtree``)."""
        raise NotImplementedError


class LocalStorage(Storage):
    """A directory on a local (or mounted) file system, written with fsync and atomic renames."""

    def __init__(self, root: Root) -> None:
        self.root = Path(root)

    def location(self, rel: str = "") -> Path:
        return self.root / rel if rel else self.root

    def write(self, rel: str, data: bytes | memoryview) -> None:
        self.write_parts(rel, (data,))

    def write_parts(self, rel: str, parts: Sequence[bytes | memoryview], sync_dir: bool = True) -> None:
        """Straight from ``parts`` (no joined copy): to a temporary name, fsynced, renamed into place."""
        path = self.location(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_durably(str(path), parts)
        if sync_dir:
            fsync_path(path.parent)

    def read(self, rel: str) -> bytes:
        return self.location(rel).read_bytes()

    def open(self, rel: str) -> IO[bytes]:
        return open(self.location(rel), "rb")

    def size(self, rel: str) -> int:
        return self.location(rel).stat().st_size

    def is_file(self, rel: str) -> bool:
        return self.location(rel).is_file()

    def files(self, rel: str) -> list[str]:
        return self._entries(rel, Path.is_file)

    def dirs(self, rel: str = "") -> list[str]:
        return self._entries(rel, Path.is_dir)

    def _entries(self, rel: str, keep: Any) -> list[str]:
        try:
            return sorted(p.name for p in self.location(rel).iterdir() if keep(p))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def makedirs(self, rel: str) -> None:
        self.location(rel).mkdir(parents=True, exist_ok=True)

    def sync(self, rel: str, names: list[str]) -> None:
        d = self.location(rel)
        for name in names:
            fsync_path(d / name)
        fsync_path(d)

    def remove_tree(self, rel: str) -> None:
        shutil.rmtree(self.location(rel), ignore_errors=True)


class FsspecStorage(Storage):
    """A prefix of any fsspec file system: object stores, ``file://``, ``memory://``."""

    read_back = True

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.fs, self.path = _fsspec_core(url).url_to_fs(url)
        protocols = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        self.needs_fsync = "file" in protocols

    def _full(self, rel: str) -> str:
        return posixpath.join(self.path, rel) if rel else self.path

    def _fresh(self, rel: str) -> str:
        """The full path of ``rel``, with fsspec's listing cache for it dropped: other ranks
        write here too, and a stale cached listing would hide their files."""
        full = self._full(rel)
        self.fs.invalidate_cache(full)
        return full

    def location(self, rel: str = "") -> str:
        return f"{self.url}/{rel}" if rel else self.url

    def write(self, rel: str, data: bytes | memoryview) -> None:
        full = self._full(rel)
        self.fs.makedirs(posixpath.dirname(full), exist_ok=True)
        with self.fs.open(full, "wb") as f:
            f.write(data)
            f.flush()
            if self.needs_fsync:
                os.fsync(f.fileno())
        # An object store uploads on close: the write is durable once the block above returned.

    def read(self, rel: str) -> bytes:
        data: bytes = self.fs.cat_file(self._full(rel))
        return data

    def open(self, rel: str) -> IO[bytes]:
        f: IO[bytes] = self.fs.open(self._full(rel), "rb")
        return f

    def size(self, rel: str) -> int:
        return int(self.fs.size(self._fresh(rel)))

    def is_file(self, rel: str) -> bool:
        return bool(self.fs.isfile(self._fresh(rel)))

    def files(self, rel: str) -> list[str]:
        return self._entries(rel, "file")

    def dirs(self, rel: str = "") -> list[str]:
        return self._entries(rel, "directory")

    def _entries(self, rel: str, kind: str) -> list[str]:
        try:
            entries = self.fs.ls(self._fresh(rel), detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(posixpath.basename(e["name"].rstrip("/")) for e in entries if e.get("type") == kind)

    def makedirs(self, rel: str) -> None:
        self.fs.makedirs(self._full(rel), exist_ok=True)

    def sync(self, rel: str, names: list[str]) -> None:
        pass  # writers closed their files; fsspec offers no fsync of someone else's file

    def remove_tree(self, rel: str) -> None:
        try:
            self.fs.rm(self._full(rel), recursive=True)
        except OSError:
            pass


def at(root: Root) -> Storage:
    """The storage of ``root``: fsspec for a URL, plain ``os`` calls for a local directory."""
    return FsspecStorage(os.fspath(root)) if is_url(root) else LocalStorage(root)
