"""Training beside the floor of replication: a plain program moves each rank's replica every iteration.

``baft bench`` with 2+ nodes adds the arm ``floor:replicate``: training with no checkpoint while, after
every iteration, each rank asks its own replicator process (in the stores' CPU class) to move one copy of
the rank's state size to the replicator of the same rank position on the next node, the least a program can
do to move those bytes: ``sendfile`` a source file to a kept TCP connection, and on the other end
``recv_into`` a mapped file. No copy of the source first: nobody rewrites it (until 2026-12-07 the
replicator took one with ``copy_file_range``, as a store keeps a copy of each round's version; that cost it
0.25-0.3 CPU-s per GB more, training's cost moving within the runs' spread). No framing beyond the size, no
acknowledgement, no journal; its socket is marked as filler like a store's (on a link that serves packets by
priority, training goes first), and a request that comes while a replica is still on its way is folded into
the next one (on a slow link it replicates what the link carries, as a store's stride does, instead of
queueing behind it). Its ratio against ``none`` is what moving those bytes costs training on this machine:
the floor under ``baft@k``'s replication cost, measured in the same run.

The connection is authenticated: the first 32 bytes are a token the ranks share (broadcast by rank 0);
the replicator drops a connection that does not begin with it. It listens on its node store's host.

The process side runs as ``python floorlink.py HOST DIR TOKEN_HEX PRIORITY TOS`` (standard library only) and reads
commands on stdin, one per line: ``peer HOST:PORT`` once, then ``go NBYTES`` per replica; the end of
stdin (its rank closed it, or died) ends it. It prints its port first and, at the end, the bytes it sent and
the CPU seconds (both threads) it spent from its first replica on: the floor of the stores' CPU per
replicated GB at the same cadence, beside the same training (``bench.json``
``replication.floor_replicator_cpu_seconds_per_gb``).
"""
from __future__ import annotations

import ctypes
import hmac
import mmap
import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[2]
_SIZE = struct.Struct("<QB")  # the bytes that follow; 1: into the next file of a ring (a sealed slot's replica)
TOKEN_BYTES = 32
#: Seconds a replicator waits for its peer's connection (and a connection for its token).
CONNECT_TIMEOUT = 60.0


class FloorLink:
    """A rank's handle of its replicator (started at once, in the ``priority`` class: ``idle`` or ``normal``)."""

    def __init__(self, host: str, directory: Path, token: bytes, priority: str) -> None:
        from baft.priority import apply
        from baft.store.peerlink import FILLER_PRIORITY, LOWER_EFFORT_TOS

        directory.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen([sys.executable, "-S", __file__, host, str(directory), token.hex(),
                                       str(FILLER_PRIORITY), str(LOWER_EFFORT_TOS), str(_ROOT)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the floor replicator did not start (exit status {self._proc.wait()})")
        self.address = f"{host}:{int(line)}"
        """Where the previous node's replicator connects."""
        # before ``peer``: the process has one thread until then, and later threads inherit the class
        self.applied = apply(priority, self._proc.pid)
        self.report: tuple[int, float] | None = None
        """After :meth:`close`: (bytes sent, CPU seconds from the first replica on), as the process counted."""

    def connect(self, peer: str) -> None:
        """Send replicas to the replicator at ``peer`` (host:port)."""
        self._command(f"peer {peer}")

    def replicate(self, nbytes: int) -> None:
        """Move one replica of ``nbytes`` (returns at once; the process does the work)."""
        self._command(f"go {nbytes}")

    def send_slot(self, path: Path) -> None:
        """Send the used bytes of the sealed slot file ``path`` into the next file of the peer's ring (returns at
        once; the process reads the slot's header and sends from the file itself)."""
        self._command(f"send {path}")

    def _command(self, line: str) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()
        except OSError as e:
            raise RuntimeError(f"the floor replicator is gone ({e}); exit status {self._proc.poll()}") from e

    def close(self) -> None:
        """End the process: the end of its input, then wait (kill it after 10 s)."""
        from baft.persist.writer import end_child

        if self._proc.stdin is not None and not self._proc.stdin.closed:
            try:
                self._proc.stdin.close()  # the end of its input: it answers with its report and ends
            except OSError:
                pass
            import select

            if self._proc.stdout is not None and select.select([self._proc.stdout], [], [], 10.0)[0]:
                last = self._proc.stdout.readline().split()
                if len(last) == 3 and last[0] == b"done":
                    self.report = (int(last[1]), float(last[2]))
        end_child(self._proc)


class SlotSender:
    """Stands where a rank's store client stands in baft's snapshotter (``snap.store``) in the arm
    ``floor:work@k``: each sealed version's slot goes to the floor replicator, and nothing else happens (no
    rounds, no kept copy, no answers, no restore from peers)."""

    def __init__(self, link: FloorLink) -> None:
        self.link = link
        self.sent = 0
        """Slots handed to the replicator so far."""

    def sealed(self, rank: int, version: int, file: Path, persist_every: int | None = None,
               persisted: int | None = None) -> bool:
        self.link.send_slot(file)
        self.sent += 1
        return True

    def locate(self, rank: int) -> list[tuple[int, int]]:
        return []

    def pull(self, rank: int, version: int, dest: Path) -> None:
        return None

    def discard(self, rank: int, version: int) -> None:
        pass

    def close(self) -> None:
        pass


def join(nodes: int, priority: str, stores: list[str] | None, directory: Path, state: Any) -> tuple[FloorLink, Any]:
    """This rank's replicator (in ``directory``/rank<N>, listening on its node store's host), connected to the one
    of the same rank position on the next node (collective: every rank calls it), and the step that has it move
    one replica of the bytes of ``state``'s bulk tensors (what a snapshot slot holds, less its small metadata)."""
    import secrets

    import torch.distributed as dist

    from baft.state.layout import layout, split, total_bytes

    rank = dist.get_rank()
    node = int(os.environ.get("BAFT_NODE_INDEX", "0"))
    host = stores[node].rsplit(":", 1)[0] if stores else "127.0.0.1"
    token = [secrets.token_bytes(TOKEN_BYTES) if rank == 0 else None]
    dist.broadcast_object_list(token, src=0)
    assert token[0] is not None  # rank 0's, broadcast
    link = FloorLink(host, directory / f"rank{rank}", token[0], priority)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (node, rank, link.address))
    mine = sorted(r for n, r, _ in everyone if n == node).index(rank)
    link.connect(sorted((r, a) for n, r, a in everyone if n == (node + 1) % nodes)[mine][1])
    nbytes = total_bytes(layout(split(state.capture())[1]))  # a snapshot slot's bulk, as baft lays it out
    return link, lambda: link.replicate(nbytes)


# -- the process -------------------------------------------------------------------------------------
def _file(path: Path, nbytes: int, fill: bool) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.ftruncate(fd, nbytes)
    if fill:  # touched once, as the slots and rings are
        os.pwrite(fd, os.urandom(nbytes), 0)
    return fd


class _Landing:
    """Where replicas land: one mapping for the fixed file (``received``), a ring of ``slots`` mappings for
    sealed slots (``received.slot<k>``, the next one each time, as a store's replica ring)."""

    def __init__(self, directory: Path, slots: int) -> None:
        self.directory, self.slots = directory, slots
        self.maps: dict[int, tuple[memoryview, int]] = {}  # -1: the fixed file's; k: the ring's file k
        self.turn = 0

    def view(self, n: int, ring: bool) -> memoryview:
        k = -1
        if ring:
            k, self.turn = self.turn % self.slots, self.turn + 1
        got = self.maps.get(k)
        if got is None or got[1] != n:  # a mapping is made once per size
            if got is not None:
                got[0].release()
            fd = _file(self.directory / ("received" if k < 0 else f"received.slot{k}"), n, fill=False)
            m = mmap.mmap(fd, n)
            os.close(fd)
            m[:] = bytes(n)
            got = self.maps[k] = (memoryview(m), n)
        return got[0]


def _receive(server: socket.socket, token: bytes, directory: Path) -> None:
    server.settimeout(CONNECT_TIMEOUT)
    while True:
        conn, _ = server.accept()
        conn.settimeout(CONNECT_TIMEOUT)
        try:
            got = conn.recv(TOKEN_BYTES, socket.MSG_WAITALL)
        except OSError:
            got = b""
        if hmac.compare_digest(got, token):
            break
        conn.close()  # not our peer
    server.close()
    conn.settimeout(None)
    from baft.snapshot.slotfile import SLOTS

    landing = _Landing(directory, SLOTS)
    with conn:
        while True:
            head = conn.recv(_SIZE.size, socket.MSG_WAITALL)
            if len(head) < _SIZE.size:
                return  # the peer ended
            n, ring = _SIZE.unpack(head)
            view = landing.view(n, bool(ring))
            done = 0
            while done < n:
                k = conn.recv_into(view[done:], n - done, socket.MSG_WAITALL)
                if k == 0:
                    return
                done += k


def _commands(fd: int) -> Any:
    """Lists of the command lines that have arrived on ``fd``: blocks for the first, then takes what else is
    there; ends at the end of input."""
    import select

    pending = b""
    while True:
        data = os.read(fd, 65536)
        while data and select.select([fd], [], [], 0)[0]:
            more = os.read(fd, 65536)
            if not more:
                break
            data += more
        if not data:
            return
        pending += data
        *lines, pending = pending.split(b"\n")
        yield [line.decode().split() for line in lines if line.strip()]


def _serve(host: str, directory: Path, token: bytes, priority: int, tos: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL: gone with the rank that started it
    except (OSError, AttributeError):
        pass
    server = socket.create_server((host, 0))
    print(server.getsockname()[1], flush=True)
    out: socket.socket | None = None
    src = -1
    size = sent_bytes = 0
    cpu0: float | None = None
    slots: dict[str, int] = {}  # a sealed slot file -> its descriptor, opened once
    for batch in _commands(sys.stdin.fileno()):
        gos = [(cmd, arg) for cmd, arg in batch if cmd in ("go", "send")]
        for cmd, arg in batch:
            if cmd == "peer":
                out = _connect(arg, token, priority, tos)
                threading.Thread(target=_receive, args=(server, token, directory), daemon=True).start()
        if not gos or out is None:
            continue
        cmd, arg = gos[-1]  # requests that came while the last replica travelled fold into one
        if cpu0 is None:
            cpu0 = _cpu()
        if cmd == "send":  # a sealed slot: its used bytes, read from its header as a store reads them
            fd = slots.get(arg)
            if fd is None:
                fd = slots[arg] = os.open(arg, os.O_RDONLY)
            n = _used_bytes(fd)
        else:
            n = int(arg)
            if n != size:
                if src >= 0:
                    os.close(src)
                src, size = _file(directory / "source", n, True), n
            fd = src
        out.sendall(_SIZE.pack(n, cmd == "send"))
        sent = 0
        while sent < n:
            sent += os.sendfile(out.fileno(), fd, sent, n - sent)
        sent_bytes += n
    if out is not None:
        out.close()
    print("done", sent_bytes, 0.0 if cpu0 is None else round(_cpu() - cpu0, 6), flush=True)


def _used_bytes(fd: int) -> int:
    """The used bytes (header, data, metadata) of the slot file open at ``fd``."""
    from baft.snapshot.slotfile import HEAD, HEADER

    _, _, _, data_len, meta_len, _ = HEAD.unpack(os.pread(fd, HEAD.size, 0))
    return HEADER + data_len + meta_len


def _cpu() -> float:
    import resource

    u = resource.getrusage(resource.RUSAGE_SELF)  # every thread's: the sender's and the receiver's
    return u.ru_utime + u.ru_stime


def _connect(address: str, token: bytes, priority: int, tos: int) -> socket.socket:
    host, port = address.rsplit(":", 1)
    out = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT)
    out.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)  # filler, as a store's replicas are
    out.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, priority)
    out.settimeout(None)
    out.sendall(token)
    return out


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[6])  # the checkout: baft's slot format (torch-free) for the slots' headers
    _serve(sys.argv[1], Path(sys.argv[2]), bytes.fromhex(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
