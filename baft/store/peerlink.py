"""A store's kept connection to one peer store, over which its replicas go.

Replicating a version once cost a TCP connection and a handshake, a socket buffer
of 64 KiB and twenty 64 KiB pieces each gated on training traffic: measured in
``baft bench --workload.nodes 2``, the stores spent 12-14 times the CPU of the simplest
program that moves the same bytes (:mod:`harness.bench.floor`). Now a store
keeps one authenticated connection per peer for its life (the handshake once; a
connection that fails is made again, and journaled) and sends a replica one of
two ways, as the link allows (:class:`baft.store.linkmeter.LinkMeter` decides):

* **whole**, where the link is not the bottleneck: one wait for the node's
  pipeline traffic to pause, then one ``send`` of the replica's used bytes (from a mapping of the kept copy)
  through a socket whose buffers the kernel sizes (it grows them to megabytes on
  a fast path), and the peer's answer;
* **paced**, on a slow link (and before the first replica has shown which it is):
  :data:`PIECE`-sized pieces through a :data:`SNDBUF` socket buffer, each after
  the node's pipeline traffic pauses, their average held under the link's pace,
  so a replica never queues megabytes ahead of training's packets.

A whole replica may be sent by a thread that must not wait long (the one that takes the ranks' seal
notices): given a ``patience``, :meth:`PeerLink.send` gives up waiting on the link after that long and
returns what is left (:class:`Unfinished`) for another thread to :meth:`~PeerLink.finish`, on the same
connection, where the bytes stopped.

Switching between the two makes a new connection (a socket buffer set by hand stays
that size). Replica sockets carry the lowest class of traffic (``SO_PRIORITY``
filler, DSCP Lower Effort). Torch-free (the store imports it).
"""
from __future__ import annotations

import json
import mmap
import os
import select
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from baft.store.linkmeter import LinkMeter, PaceChange
from baft.store.traffic import TrafficFlags
from baft.store.wire import connect, recv, set_kernel_timeouts

#: Paced, replicas go in pieces of this size, each gated on training traffic, through a socket send buffer
#: as small: a piece has left the host (not just entered a kernel buffer) when the next one starts.
PIECE = 64 << 10
SNDBUF = 64 << 10
#: Replica sockets are marked as the lowest class of traffic: ``SO_PRIORITY`` filler (Linux's TC_PRIO_FILLER,
#: the last band of a priority queue such as pfifo_fast) and DSCP Lower Effort (RFC 8622) for switches that
#: honour it. Where the bottleneck queue serves by priority, a replica's packets leave only when no training
#: packet waits, so one delays an activation by at most the packet on the wire.
FILLER_PRIORITY = 1
LOWER_EFFORT_TOS = 0x01 << 2
#: The longest a replica (whole) or a piece (paced) waits for the node's pipeline traffic to pause.
MAX_DEFER = 0.02
#: Seconds a send or the peer's answer may stall before the connection is given up.
IO_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Delivery:
    """How one replica went to the peer."""

    seconds: float
    """From the first byte to the peer's answer (deferral included)."""
    deferred: float
    """Seconds spent waiting for the node's pipeline traffic to pause."""
    paced: bool
    """Sent in paced pieces (else whole)."""


@dataclass(slots=True)
class Unfinished:
    """A whole replica its sender stopped waiting for (``patience``), to be finished by another thread."""

    rank: int
    version: int
    fd: int
    nbytes: int
    frame: bytes = b""
    """The put's length and header."""
    sent: int = 0
    """Bytes of the frame and the body that went out (all of them: only the peer's answer is awaited)."""
    t0: float = 0.0
    deferred: float = 0.0

    @property
    def started(self) -> bool:
        """Whether any of it went out (else :meth:`PeerLink.finish` sends it all, as :meth:`PeerLink.send` would)."""
        return bool(self.frame)


class PeerLink:
    """The connection to the store at ``address``. ``meter``: the store's view of the link (shared by its
    peers); ``flags``: the node's training traffic (None: do not wait for it); ``log(event, **fields)``."""

    def __init__(self, address: str, secret: str, meter: LinkMeter, flags: TrafficFlags | None,
                 log: Callable[..., None]) -> None:
        self.address = address
        self.secret = secret
        self.meter = meter
        self.flags = flags
        self.log = log
        self._sock: socket.socket | None = None
        self._maps: dict[int, tuple[int, mmap.mmap]] = {}  # a kept file's descriptor -> (its inode, a read-only map)
        self._paced = False  # how the open connection's send buffer is set
        self._timeout = IO_TIMEOUT  # the open connection's kernel timeouts (a patient send shortens them)
        self.connections = 0
        """Connections made so far (one for the store's life, unless one failed or the mode changed)."""

    def _connect(self, paced: bool, why: str) -> socket.socket:
        self.close()
        s = connect(self.address, self.secret, timeout=IO_TIMEOUT)
        try:
            if paced:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, LOWER_EFFORT_TOS)  # sets a priority from the TOS: first
            s.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, FILLER_PRIORITY)
            set_kernel_timeouts(s, IO_TIMEOUT)
            self._timeout = IO_TIMEOUT
        except BaseException:
            s.close()
            raise
        self._sock, self._paced = s, paced
        self.connections += 1
        self.log("peer_connected", peer=self.address, paced=paced, reason=why)
        return s

    def send(self, rank: int, version: int, fd: int, nbytes: int, patience: float | None = None) -> Delivery | Unfinished:
        """Send the first ``nbytes`` of the file ``fd`` (a slot's used bytes) as ``rank``'s replica of
        ``version`` and wait for the peer's answer; ``OSError`` if the peer cannot be reached or refused it
        (after one new connection: a kept one may have died with its peer's last store).

        With a ``patience`` (seconds), only a whole replica over the connection already made is sent, and
        the link is waited on about that long at most: what is left then, or all of it (paced, no
        connection, a failed one), comes back :class:`Unfinished` for :meth:`finish`."""
        paced = self.meter.paced()
        if patience is not None:
            s = self._sock
            if paced or s is None or self._paced:
                return Unfinished(rank, version, fd, nbytes)
            try:
                return self._whole(s, rank, version, fd, nbytes, patience)
            except OSError as e:
                self._dropped(e)
                return Unfinished(rank, version, fd, nbytes)  # tried again by finish, on a new connection
        for attempt in (0, 1):
            s = self._sock
            try:
                if s is None or self._paced != paced:
                    why = ("the first replica" if s is None and not self.connections else
                           "a failed connection" if s is None else
                           "the link is the bottleneck: paced pieces" if paced else "the link keeps up: whole replicas")
                    s = self._connect(paced, why)
                self._timeouts(s, IO_TIMEOUT)
                return self._send(s, paced, rank, version, fd, nbytes)
            except OSError as e:
                if attempt:
                    self.close()
                    raise
                self._dropped(e)
        raise AssertionError("unreachable")

    def finish(self, rest: Unfinished) -> Delivery:
        """Send what ``rest`` left (on the same connection, from where it stopped; all of it, with the retry
        :meth:`send` makes, if it never started or its connection failed) and wait for the peer's answer."""
        s = self._sock
        if not rest.started or s is None:
            got = self.send(rest.rank, rest.version, rest.fd, rest.nbytes)
            assert isinstance(got, Delivery)  # no patience: delivered or raised
            return got
        try:
            self._timeouts(s, IO_TIMEOUT)
            view = self._view(rest.fd, rest.nbytes)
            try:
                self._push(s, rest.frame, view, rest.sent, None)
            finally:
                view.release()
            reply, _ = recv(s, max_payload=0)
            return self._answered(reply, False, rest.nbytes, rest.t0, rest.deferred)
        except OSError as e:
            self._dropped(e)
            return self.finish(Unfinished(rest.rank, rest.version, rest.fd, rest.nbytes))

    def _dropped(self, e: OSError) -> None:
        """Close the connection that failed and journal why (the next send makes a new one)."""
        self.close()
        self.log("peer_connection_failed", peer=self.address, reason=str(e) or type(e).__name__)

    def _timeouts(self, s: socket.socket, seconds: float) -> None:
        if self._timeout != seconds:
            set_kernel_timeouts(s, seconds)
            self._timeout = seconds

    @staticmethod
    def _frame(rank: int, version: int, nbytes: int, paced: bool) -> bytes:
        """A put's length and JSON header."""
        raw = json.dumps({"op": "put", "rank": rank, "version": version, "nbytes": nbytes, "paced": paced}).encode()
        return struct.pack(">I", len(raw)) + raw

    def _whole(self, s: socket.socket, rank: int, version: int, fd: int, nbytes: int,
               patience: float | None) -> Delivery | Unfinished:
        """A whole replica; with a ``patience``, the link waited on for about that long at most (each blocked
        send, the answer), and what is left then :class:`Unfinished`."""
        if patience is not None:
            self._timeouts(s, patience)
        frame = self._frame(rank, version, nbytes, False)
        t0 = time.perf_counter()
        deferred = self.flags.wait_idle(MAX_DEFER) if self.flags is not None else 0.0
        view = self._view(fd, nbytes)
        try:
            sent = self._push(s, frame, view, 0, None if patience is None else time.perf_counter() + patience)
        finally:
            view.release()
        if patience is not None:
            rest = Unfinished(rank, version, fd, nbytes, frame, sent, t0, deferred)
            if sent < len(frame) + nbytes:
                return rest
            poll = select.poll()
            poll.register(s, select.POLLIN)
            if not poll.poll(max(1, int(patience * 1000))):
                return rest  # the answer is late: another thread waits for it
        reply, _ = recv(s, max_payload=0)
        return self._answered(reply, False, nbytes, t0, deferred)

    @staticmethod
    def _push(s: socket.socket, frame: bytes, body: memoryview, sent: int, deadline: float | None) -> int:
        """Send ``frame`` then ``body`` from byte ``sent`` of the two; with a ``deadline``, stop at a send the link
        held up (it blocks for the socket's timeout at most) once the deadline passed. The bytes sent by then."""
        total = len(frame) + len(body)
        while sent < total:
            want = total - sent
            try:
                n = s.sendmsg([frame[sent:], body] if sent < len(frame) else [body[sent - len(frame):]])
            except BlockingIOError:  # nothing went out within the socket's timeout
                if deadline is None:
                    raise
                n = 0
            sent += n
            if deadline is not None and n < want and time.perf_counter() >= deadline:
                break
        return sent

    def _answered(self, reply: dict[str, Any], paced: bool, nbytes: int, t0: float, deferred: float) -> Delivery:
        seconds = time.perf_counter() - t0
        if not reply.get("ok"):
            raise ConnectionError(f"the peer refused the replica: {reply.get('error')}")
        if not paced:
            self._changed(self.meter.measure_whole(nbytes, seconds - deferred))
        return Delivery(seconds, deferred, paced)

    def _send(self, s: socket.socket, paced: bool, rank: int, version: int, fd: int, nbytes: int) -> Delivery:
        if not paced:
            got = self._whole(s, rank, version, fd, nbytes, None)
            assert isinstance(got, Delivery)  # no patience: delivered or raised
            return got
        t0 = time.perf_counter()
        s.sendall(self._frame(rank, version, nbytes, True))
        deferred = self._pieces(s, fd, nbytes)
        reply, _ = recv(s, max_payload=0)
        return self._answered(reply, True, nbytes, t0, deferred)

    def _view(self, fd: int, nbytes: int) -> memoryview:
        """The first ``nbytes`` of the file ``fd`` (a kept copy the store wrote itself, only ever grown),
        through a read-only mapping kept for its life. A whole replica goes out with one ``send`` from it:
        measured here, 0.67 ms of the store's CPU per 1.26 MB replica against 0.9 with ``sendfile``, whose
        loopback transmit takes each tmpfs page by reference and costs more per page than the copy saves
        (issue 33)."""
        st = os.fstat(fd)
        known = self._maps.get(fd)
        if known is None or known[0] != st.st_ino or len(known[1]) < nbytes:
            if known is not None:
                known[1].close()
            if st.st_size < nbytes:
                raise ConnectionError(f"the replica's file holds {st.st_size} bytes, not {nbytes}")
            known = self._maps[fd] = (st.st_ino, mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ))
        return memoryview(known[1])[:nbytes]

    def _pieces(self, s: socket.socket, fd: int, nbytes: int) -> float:
        """Send in pieces, each after the node's training traffic pauses (up to ``MAX_DEFER``), their average
        under the link's pace; the seconds spent deferring."""
        deferred, start, sent = 0.0, time.perf_counter(), 0
        while sent < nbytes:
            if self.flags is not None:
                deferred += self.flags.wait_idle(MAX_DEFER)
            piece = min(PIECE, nbytes - sent)
            t = time.perf_counter()
            n = os.sendfile(s.fileno(), fd, sent, piece)
            if n <= 0:
                raise ConnectionError(f"the replica's file ended before byte {nbytes} (at {sent})")
            self._changed(self.meter.measure(n, time.perf_counter() - t))
            sent += n
            rate = self.meter.pace()
            if rate > 0:
                ahead = sent / rate - (time.perf_counter() - start)
                if ahead > 0:
                    time.sleep(ahead)
        return deferred

    def _changed(self, change: PaceChange | None) -> None:
        if change is not None:
            self.log("replication_paced", link_mbytes_per_s=round(change.link_bytes_per_s / 1e6, 3),
                     pace_mbytes_per_s=round(change.pace_bytes_per_s / 1e6, 3), limited_by_link=change.limited_by_link)

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
