"""A writer process per rank: writes a checkpoint's data file from byte ranges of a shared-memory slot.

The direct persister (:mod:`baft.persist.dcpwrite`) spends its time on bytes: the CRC-32 of each tensor's
archive, the file's checksum, the write and its fsync. In a thread of the training process that
work shares the interpreter lock with training, which waits for it whenever it wants the lock back
(every few operations); in a process of its own it shares only the cores, and at a lower priority
it runs on what training leaves idle (the pipeline bubbles). The training process sends a request
per file: for each tensor a template (:class:`baft.persist.dcpwrite.SaveTemplate`, sent once) and where its
bytes are (a range of the slot file, mapped here read-only, or the bytes themselves); this process
patches the CRCs, writes the file under a temporary name, fsyncs and renames it, and answers with
the file's size and checksum (:func:`crc32_digest`), or the error.

This file runs as a script (``python writer.py``) and imports only the standard library, so the
process starts in milliseconds without torch. It reads requests from stdin and answers on stdout,
each a length-prefixed pickle: the pipe is its parent's alone. At the end of stdin (the parent
closed it, or died) it exits. :class:`WriterProcess` is the parent's handle.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import pickle
import shutil
import struct
import subprocess
import sys
import threading
import zlib
from typing import Any

_FRAME = struct.Struct("<Q")
NAME = b"baft-writer"
#: How a file checksum made by :func:`crc32_digest` begins (a bare hex digest is blake2b's).
CRC32 = "crc32:"
#: What a commit says of a file that is not there, and of one not at its writer's size (``N bytes ... M``).
MISSING_AT_COMMIT = "missing at commit; the checkpoint is not committed"
SHORT_AT_COMMIT = "bytes at commit, its writer wrote"


class Crc32:
    """A file checksum made as a ``hashlib`` hash is (``update``, ``hexdigest``): CRC-32, tagged ``crc32:``. It
    finds a torn or damaged file as blake2b does, at a fifth of the CPU (0.25 ms per 1.26 MB here against
    1.3 ms), and nothing needs more: a checkpoint's files are checked for damage, not against a forger."""

    def __init__(self) -> None:
        self._crc = 0

    def update(self, data: Any) -> None:
        self._crc = zlib.crc32(data, self._crc)

    def hexdigest(self) -> str:
        return f"{CRC32}{self._crc & 0xFFFFFFFF:08x}"


def crc32_digest(parts: Any) -> str:
    """The :class:`Crc32` checksum of the concatenation of ``parts`` (buffers)."""
    h = Crc32()
    for p in parts:
        h.update(p)
    return h.hexdigest()


def _send(stream: Any, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_FRAME.pack(len(data)) + data)
    stream.flush()


def _receive(stream: Any) -> Any:
    head = stream.read(_FRAME.size)
    if len(head) < _FRAME.size:
        raise EOFError
    (n,) = _FRAME.unpack(head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


class WriterProcess:
    """The parent's handle of one writer process (started at once; one request at a time)."""

    def __init__(self, nice: int = 0, priority: str = "normal") -> None:
        """``nice``: how much lower than the parent's the process's CPU priority is (0-19); ``priority``:
        ``idle`` puts it in the idle CPU and I/O classes (:mod:`baft.priority`; :attr:`applied` says what the
        kernel accepted), ``normal`` leaves it in the parent's."""
        from baft.priority import (
            apply,  # here, not at the top: the process side runs as a script, stdlib only
        )

        self._proc = subprocess.Popen([sys.executable, "-S", __file__, str(nice)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, close_fds=True)
        # Set from here before the first request: the process is one thread, and it waits on its input.
        self.applied = apply(priority, self._proc.pid)
        self._ids: dict[tuple[bytes, bytes, int, int], int] = {}  # the templates the process holds, by value
        self._lock = threading.Lock()

    def write(self, path: str, slot: str, records: list[tuple[tuple[bytes, bytes, int, int], Any]]) -> tuple[int, str]:
        """Write ``records`` into file ``path`` durably (a temporary name, fsynced, renamed; the directory
        entry left to the caller) and return its size and checksum (:func:`crc32_digest`). Each record is (its
        template's ``(head, tail, head_crc, tail_crc)``, its data: ``(offset, nbytes)`` in the slot file
        ``slot``, or bytes). Raises :class:`OSError` as the write did, or when the process is gone."""
        with self._lock:
            templates: dict[tuple[bytes, bytes, int, int], int] = {}
            out: list[Any] = []
            for template, data in records:
                key = self._ids.get(template, templates.get(template))
                if key is None:  # not sent before, nor yet in this request
                    key = templates[template] = len(self._ids) + len(templates)
                out.append((key, data))
            try:
                _send(self._proc.stdin, ("write", path, slot, {k: t for t, k in templates.items()}, out))
                answer = _receive(self._proc.stdout)
            except (OSError, EOFError, ValueError) as e:
                raise OSError(f"the writer process is gone ({e}); its exit status {self._proc.poll()}") from e
            self._ids.update(templates)
            if answer[0] == "error":
                raise OSError(answer[1], answer[2])
            return answer[1], answer[2]

    def run(self, ops: list[tuple[str, str, int, bytes, bool]]) -> None:
        """Run a commit's file operations in order (:class:`baft.persist.commits.FileOp`, each as ``(kind, absolute
        path, size, data, sync_dir)``): the system calls of a commit leave the training process. Raises
        :class:`baft.errors.CheckpointCorrupt` for a file not as expected (nothing after it runs), :class:`OSError`
        as an operation did, or when the process is gone."""
        with self._lock:
            try:
                _send(self._proc.stdin, ("run", ops))
                answer = _receive(self._proc.stdout)
            except (OSError, EOFError, ValueError) as e:
                raise OSError(f"the writer process is gone ({e}); its exit status {self._proc.poll()}") from e
        if answer[0] == "corrupt":
            from baft.errors import CheckpointCorrupt

            raise CheckpointCorrupt(answer[1])
        if answer[0] == "error":
            raise OSError(answer[1], answer[2])

    def cpu_seconds(self) -> float:
        """CPU time (user and system) the process has used so far (:func:`process_cpu_seconds`)."""
        return process_cpu_seconds(self._proc.pid)

    def close(self) -> None:
        """Stop the process: the end of its input, then wait (kill it after 10 s)."""
        end_child(self._proc)

    @property
    def pid(self) -> int:
        return self._proc.pid


def process_cpu_seconds(pid: int) -> float:
    """CPU time (user and system, all threads) process ``pid`` has used so far, from ``/proc`` (0 where there is
    none); in clock ticks (10 ms here): a sum over many operations is what is meaningful."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def end_child(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """End a child that serves its stdin until it ends: close its pipes, wait, kill it after ``timeout`` s."""
    for stream in (proc.stdin, proc.stdout):
        if stream is not None and not stream.closed:
            try:
                stream.close()
            except OSError:
                pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- the process -------------------------------------------------------------------------------------
def _patched(template: tuple[bytes, bytes, int, int], data: memoryview) -> tuple[bytes, memoryview, bytes]:
    head, tail, head_crc, tail_crc = template
    crc = struct.pack("<I", zlib.crc32(data) & 0xFFFFFFFF)
    return head[:head_crc] + crc + head[head_crc + 4 :], data, tail[:tail_crc] + crc + tail[tail_crc + 4 :]


#: The slot files mapped so far, by path: (device, inode, size) when mapped, the mapping. A rank's few slots are
#: mapped once, not at every persist (a new mapping faults in every page of the slot again).
_MAPS: dict[str, tuple[tuple[int, int, int], memoryview]] = {}


def _mapped(slot: str) -> memoryview:
    """A read-only view of the slot file ``slot`` as it is now (mapped again if it was replaced or resized)."""
    st = os.stat(slot)
    key = (st.st_dev, st.st_ino, st.st_size)
    known = _MAPS.get(slot)
    if known is not None and known[0] == key:
        return known[1]
    _MAPS.pop(slot, None)  # unmapped when the last view of it goes (an explicit close fails while one lives)
    fd = os.open(slot, os.O_RDONLY)
    try:
        view = memoryview(mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ))
    finally:
        os.close(fd)
    _MAPS[slot] = (key, view)
    return view


def _write(path: str, slot: str, templates: dict[int, Any], records: list[tuple[int, Any]]) -> tuple[int, str]:
    view = _mapped(slot) if slot else memoryview(b"")
    parts: list[Any] = []
    for key, data in records:
        source = view[data[0] : data[0] + data[1]] if isinstance(data, tuple) else memoryview(data)
        parts.extend(_patched(templates[key], source))
    digest = crc32_digest(parts)
    write_durably(path, parts)
    return sum(memoryview(p).nbytes for p in parts), digest


def write_durably(path: str, parts: Any) -> None:
    """Write the concatenation of ``parts`` (buffers) to ``path``: to a temporary name beside it,
    fsynced, renamed into place (the directory entry is the caller's to make durable). Here, not in
    :mod:`baft.persist.storage`, so this process needs nothing but the standard library."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.writelines(parts)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)  # a partial temporary file would hold space the next attempt needs
        except OSError:
            pass
        raise


class _Corrupt(Exception):
    """A file a commit expects is not as its writer said."""


def _run(ops: list[tuple[str, str, int, bytes, bool]]) -> None:
    for kind, path, size, data, sync_dir in ops:
        if kind == "expect":
            try:
                found = os.stat(path).st_size
            except FileNotFoundError:
                raise _Corrupt(f"{path}: {MISSING_AT_COMMIT}") from None
            if found != size:
                raise _Corrupt(f"{path}: {found} {SHORT_AT_COMMIT} {size}")
        elif kind == "write":
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_durably(path, (data,))
            if sync_dir:
                fsync_path(os.path.dirname(path))
        elif kind == "remove":
            shutil.rmtree(path, ignore_errors=True)
        else:
            raise ValueError(f"a file operation {kind!r}")


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a directory (a directory's entry list is durable only after its own fsync)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _serve(nice: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(NAME), 0, 0, 0)  # PR_SET_NAME: how a person tells it in ps
        libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL: gone with the rank that started it
    except (OSError, AttributeError):
        pass
    if nice:
        os.nice(nice)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    templates: dict[int, Any] = {}
    while True:
        try:
            request = _receive(stdin)
        except EOFError:
            return
        try:
            if request[0] == "run":
                _run(request[1])
                answer: tuple[Any, ...] = ("ok",)
            else:
                _, path, slot, new, records = request
                templates.update(new)
                answer = ("ok", *_write(path, slot, templates, records))
        except _Corrupt as e:
            answer = ("corrupt", str(e))
        except OSError as e:
            answer = ("error", e.errno or 0, f"{e.strerror or e}: {e.filename or path}")
        except Exception as e:  # noqa: BLE001 - said to the parent, which journals it; the next file may do
            answer = ("error", 0, f"{type(e).__name__}: {e}")
        _send(stdout, answer)


if __name__ == "__main__":
    _serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
