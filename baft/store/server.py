"""The per-node checkpoint store: replicates snapshots to peer nodes and serves restores.

One store process runs on each node, started next to the node's torchrun
agent (``python -m baft.store ...``) and outliving its workers. The workers'
snapshot slots are files in the node's shared-memory directory; the store

* learns from each worker when a version is sealed (``sealed``) and copies
  that slot to the stores of its ``replicas`` peers (``put``; ring or group placement, :mod:`baft.store.placement`),
  under a rate limit, newest version first: when a rank seals faster than the
  link carries its replicas, older pending versions are dropped and the drop
  is journaled (the replication frequency degrades instead of the training),
  and when a replica could no longer land before the persistent tier has a
  newer version, replication stops and says why (:mod:`baft.store.stride`);
* sends each replica over one kept connection per peer (:mod:`baft.store.peerlink`): whole, in one
  ``send``, where the link keeps up, from the thread that took the rank's seal notice, at once (no hand-off
  to another thread: one wake-up fewer per replica); in pieces paced to a share of the link, each only while
  no worker of the node has pipeline traffic in flight (``baft.store.traffic``), where the link is the
  bottleneck (:mod:`baft.store.linkmeter`), from the store's replicate thread, so a notice is never stuck
  behind a slow link; one send at a time, whichever thread makes it;
* keeps the replicas it receives as slot files of the same format
  (``replica-rank-R.slotK``), a ring of three per rank written in place (:mod:`baft.store.ring`);
* runs in the idle CPU and I/O classes (``ReplicationConfig.priority``, :mod:`baft.priority`): on cores the
  ranks keep busy it works while they wait in their bubbles; under ``adaptive`` its session's scheduling
  group is at the lowest weight while its replicas keep up (:mod:`baft.store.governor`);
* answers restores (:mod:`baft.store.restores`): ``locate`` lists every complete copy of a rank's state on
  every node, ``pull`` brings a copy into the asking worker's own slot file;
* forgets a timeline the job left: after a restore at version v, ``discard``
  removes every copy of the rank newer than v, on every node (a version is only
  a step number: the abandoned timeline's v+1 must never pass for the new one's).

Every connection, the workers' and the peers', starts with a mutual proof of
the run's secret (:mod:`baft.store.wire`; the secret comes from
``BAFT_STORE_SECRET``, never the command line); then a 4-byte big-endian
length, a JSON header and ``nbytes`` of payload when the header says so. A
peer that cannot prove the secret, a malformed, truncated or oversized frame,
a path outside the store's root or a rank outside the world is refused and
journaled (``store_refused``, with the reason), and the store keeps serving.
It binds one address, its own (never a wildcard).
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from baft.priority import ADAPTIVE, joined_cpu_group, leads_group, set_group_nice
from baft.snapshot.slotfile import (
    HEADER,
    SLOTS,
    held_slot,
    kept_slot,
    own_slot,
    replica_slot,
    slot_of,
)
from baft.store.config import StoreConfig
from baft.store.governor import GroupGovernor
from baft.store.linkmeter import LinkMeter
from baft.store.peerlink import Delivery, PeerLink, Unfinished
from baft.store.peerrounds import PeerRounds
from baft.store.placement import targets
from baft.store.restores import ANSWERS as RESTORE_ANSWERS
from baft.store.ring import SlotRing
from baft.store.stride import Stride
from baft.store.traffic import TRAFFIC_FILE, TrafficFlags
from baft.store.wire import (
    Refused,
    recv_exact_into,
    request,
)

#: A round waits at most this long for a rank to seal its version (a dead rank never will).
ROUND_TIMEOUT = 10.0
#: Seconds a rank's notice thread waits on the link for a whole replica it sends (the link keeps up: ~1 ms per MB)
#: before it leaves the rest to the replicate thread, so the rank's next notices are not stuck behind a stalled peer.
INLINE_PATIENCE = 0.05
#: The longest the replicate thread sleeps: while the link keeps up the ranks' notice threads send the replicas and
#: open the rounds without waking it, so it looks again this often for a round's deadline or the stride's probe.
LOOK_AGAIN = 1.0
#: A ``replication_skipped`` line lists at most this many of the versions it counts.
SKIPPED_LISTED = 64
#: A rank's seal time older than this (seconds) is not its node's clock: the store's own time of the notice counts.
SEAL_CLOCK_SKEW = 60.0


_Job = tuple[int, int, tuple[int, int]]  # (rank, version, (file of the kept ring, bytes))


# -- the server ---------------------------------------------------------------------------------------
class Store:
    """State and logic of one node's store (the TCP server calls :meth:`handle`)."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.root.mkdir(parents=True, exist_ok=True)
        self.flags = TrafficFlags(self.root / TRAFFIC_FILE) if config.replication.yield_to_training else None
        journal = config.journal
        if journal:  # on a fresh volume (a pod's first start) nothing has made the journal directory yet
            journal.parent.mkdir(parents=True, exist_ok=True)
        self._journal = open(journal, "a", buffering=1) if journal else None
        self._jlock = threading.Lock()
        lock = threading.RLock()
        self._cond = threading.Condition(lock)  # the store's state; the replicate thread waits on it for its work
        self._landed = threading.Condition(lock)  # notified as a send ends (a discard waits for one in flight)
        self._sealed: dict[int, dict[int, str]] = {}  # rank -> recent sealed versions -> slot file
        self._sealed_at: dict[tuple[int, int], float] = {}  # (rank, recent version) -> when the rank sealed it
        self._done = -1  # the last round finished (every local rank's copy sent)
        self._unreplicated: set[int] = set()  # versions sealed since the last round started, no round's yet
        self._opened = -1  # the newest round's version: one sealed at or below it was a round's or was counted
        self._current: int | None = None  # the round in progress
        self._captured: dict[int, tuple[int, int]] = {}  # rank -> its kept copy of the round's version: file, bytes
        self._sent: set[int] = set()  # ranks whose copy of the current round is sent
        self._lost: set[int] = set()  # ranks whose copy of the current round could not be taken
        self._round_t0, self._peers_rounds = 0.0, PeerRounds()  # the versions of peers' rounds to keep copies of
        self._kept: dict[int, int] = {}  # rank -> copies kept so far (a ring of SLOTS)
        self._inflight: tuple[int, int] | None = None  # (rank, version) of the replica being sent
        self._handed: tuple[_Job, Unfinished, list[str]] | None = None  # a notice thread's send left to finish
        self._busy = False  # a replica was sent since the last sealed notification
        self.governor = (GroupGovernor(self.log, set_group_nice) if config.replication.priority == ADAPTIVE
                         and (leads_group() or joined_cpu_group()) else None)
        """Lowers the store's scheduling group while its replicas keep up (:mod:`baft.store.governor`; None:
        the group stays as the priority set it)."""
        self.stride = Stride(self.log, config.replication.max_slowdown)
        """Which versions are replicated (:mod:`baft.store.stride`): every stride-th, or none while the link
        is too slow for a replica to beat the persistent tier."""
        self.link = LinkMeter(config.replication.rate, self.flags is not None)
        """The link's measured capacity and the pace of the sends (:mod:`baft.store.linkmeter`)."""
        self._peers: dict[str, PeerLink] = {}  # one kept connection per target (the sender in flight's alone)
        self._rings: dict[tuple[str, int], SlotRing] = {}  # ("replica" | "kept" | "held", rank) -> its slot files
        self._rings_lock = threading.Lock()
        self._own: dict[tuple[int, int, str], Path] = {}  # (rank, slot, path as named) -> the checked slot file
        self._closed = False
        threading.Thread(target=self._replicate_loop, name="store-replicate", daemon=True).start()

    @property
    def root(self) -> Path:
        return self.config.root

    @property
    def node(self) -> int:
        return self.config.node

    @property
    def addresses(self) -> list[str]:
        return self.config.addresses

    def log(self, event: str, **fields: Any) -> None:
        if self._journal is None:
            return
        line = json.dumps({"t": time.time(), "event": event, "node": f"node{self.node}", **fields}) + "\n"
        with self._jlock:
            self._journal.write(line)

    @property
    def targets(self) -> list[str]:
        r = self.config.replication
        n = len(self.addresses)
        return [self.addresses[i] for i in targets(self.node, n, r.replicas, r.placement, r.domain_nodes)]

    def own_slot_path(self, rank: Any, version: Any, path: Any) -> Path:
        """The slot file a worker names in a request, if it is ``rank``'s own slot for ``version`` in
        this store's root or a directory below it (an elastic restore pulls into one); anything else
        (another directory, ``..`` out, a symlink, another name) raises ``ValueError``: a request
        never makes the store read or write outside its own root."""
        self.checked(rank, version)
        key = (rank, slot_of(version), str(path))
        known = self._own.get(key)
        if known is not None and not known.is_symlink():  # its directory was checked before; a link is not
            return known
        given = Path(str(path))
        root, parent = self.root.resolve(), given.parent.resolve()
        if (given.name != own_slot(root, rank, slot_of(version)).name or given.is_symlink()
                or (parent != root and root not in parent.parents)):
            raise ValueError(f"{str(path)!r} is not rank {rank}'s slot for version {version} in {self.root}")
        self._own[key] = parent / given.name
        return parent / given.name

    def checked(self, rank: Any, version: Any) -> tuple[int, int]:
        """``rank`` and ``version`` as a request gives them: integers >= 0, the rank one of the job's."""
        if type(rank) is not int or type(version) is not int or rank < 0 or version < 0:
            raise ValueError(f"rank and version must be integers >= 0, got {rank!r} and {version!r}")
        if self.config.world_size and rank >= self.config.world_size:
            raise ValueError(f"rank {rank} is not a rank of this job (world size {self.config.world_size})")
        return rank, version

    def refused(self, reason: str, **fields: Any) -> None:
        self.log("store_refused", reason=reason, **fields)

    def handle(self, header: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """One request without a payload (a ``put`` is streamed by :meth:`receive_put`): the reply and its payload."""
        try:
            return self._handle(header)
        except ValueError as e:
            self.refused(str(e), op=str(header.get("op")))
            return {"ok": False, "error": str(e)}, b""

    def request(self, address: str, header: dict[str, Any], timeout: float = 30.0) -> tuple[dict[str, Any], bytes]:
        """A request to a peer store, authenticated with the run's secret."""
        return request(address, header, timeout=timeout, secret=self.config.secret)

    def payload_limit(self) -> int:
        """The largest replica this store takes now: ``max_payload``, and what its filesystem has free."""
        st = os.statvfs(self.root)
        free = st.f_bavail * st.f_frsize
        return min(free, self.config.max_payload) if self.config.max_payload else free

    def ring(self, kind: str, rank: int) -> SlotRing:
        """``rank``'s ring of replicas received (``replica``), of copies kept at this node's round versions
        (``kept``) or at its peers' (``held``) on this node."""
        with self._rings_lock:
            ring = self._rings.get((kind, rank))
            if ring is None:
                name = {"replica": replica_slot, "kept": kept_slot, "held": held_slot}[kind]
                ring = self._rings[(kind, rank)] = SlotRing([name(self.root, rank, k) for k in range(SLOTS)])
            return ring

    def receive_put(self, header: dict[str, Any], sock: socket.socket) -> tuple[dict[str, Any], bytes]:
        """A peer's replica, read from the socket straight into a file of the rank's replica ring, in place
        (no copy of it in memory); refused unread when it is larger than :meth:`payload_limit`."""
        rank, version = self.checked(header.get("rank"), header.get("version"))
        nbytes = header.get("nbytes", 0)
        limit = self.payload_limit()
        if nbytes > limit:
            raise Refused(f"a replica of {nbytes} bytes (at most {limit} here)")
        self._hold(rank, version)  # before the body: on a paced link it takes a while, and the slots move on
        t0 = time.monotonic()
        head = bytearray(min(nbytes, HEADER))
        recv_exact_into(sock, memoryview(head))
        ring = self.ring("replica", rank)
        with ring.lock:  # one writer per ring: two peers may send the same rank's replicas (placement)
            ring.receive(version, bytes(head), nbytes, lambda view: recv_exact_into(sock, view))
        with self._cond:
            self._peers_rounds.landed(rank, version)
        period = self.stride.period  # this node's ranks' pace: the job's
        if self.governor is not None and period and not header.get("paced"):
            self.governor.landed((time.monotonic() - t0) / period, "received from a peer", counts=False)
        return {"ok": True}, b""

    def _handle(self, header: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        op = str(header.get("op"))
        if op in RESTORE_ANSWERS:  # query, fetch, locate, pull
            return RESTORE_ANSWERS[op](self, header)
        handler = {"ping": self._ping, "sealed": self._sealed_op, "discard": self._discard_op}.get(op)
        if handler is None:
            raise ValueError(f"unknown op {str(header.get('op'))[:40]!r}")
        return handler(header)

    def _ping(self, header: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """Alive, and which node."""
        return {"ok": True, "node": self.node}, b""

    def _sealed_op(self, header: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """A local rank sealed a version: note it, take it into the round if it is the round's."""
        file = self.own_slot_path(header.get("rank"), header.get("version"), header.get("file"))
        with self._cond:
            versions = self._sealed.setdefault(header["rank"], {})
            versions[header["version"]] = str(file)
            at = header.get("sealed_at")
            now = time.monotonic()  # a rank on this node sends its CLOCK_MONOTONIC; anything else: now
            self._sealed_at[(header["rank"], header["version"])] = (
                at if type(at) is float and now - SEAL_CLOCK_SKEW <= at <= now else now)
            if header["version"] > self._opened:  # not the open round's (another rank sealed it first)
                self._unreplicated.add(header["version"])
            for old in sorted(versions)[:-(SLOTS - 1)]:
                del versions[old]  # its slot is being reused for the next version by now
                self._sealed_at.pop((header["rank"], old), None)
            every = header.get("persist_every")
            busy = self._busy or self._inflight is not None  # replica data went out since the last seal
            self._busy = False
            persisted = header.get("persisted")
            self.stride.sealed(header["version"], every if type(every) is int and every > 0 else None, busy,
                               persisted if type(persisted) is int else None)
            if self.governor is not None and self._current is not None and header["version"] > self._current:
                self._still_unsent(now)
            if self._current is None:
                self._start_round()  # at once: a peer's round of it then finds the kept copy
            if header["version"] == self._current:
                self._capture(header["rank"])  # now, before the slot is reused
            if header["version"] in self._peers_rounds.needed():
                self._hold_rank(header["rank"], header["version"])
            inline = not self.link.paced()
            if not inline:
                self._cond.notify()  # paced pieces take long: the replicate thread's, not the notice's
        if inline:
            self._drain()
        return {"ok": True}, b""

    def _discard_op(self, header: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """Forget a rank's copies newer than a version, here and (forwarded) on every node."""
        version = header.get("version")
        if type(version) is not int or version < -1:
            raise ValueError(f"version must be an integer >= -1 (-1: every version), got {version!r}")
        rank, _ = self.checked(header.get("rank"), 0)
        dropped = self.discard(rank, version)
        if header.get("forward", True):
            for i, addr in enumerate(self.addresses):
                if i != self.node:
                    try:
                        self.request(addr, {"op": "discard", "rank": rank, "version": version, "forward": False})
                    except OSError:
                        continue  # that node is down: its copies are gone with it
        return {"ok": True, "dropped": dropped}, b""

    def discard(self, rank: int, version: int) -> list[int]:
        """Forget every copy of ``rank`` newer than ``version`` on this node: sealed versions not yet
        replicated, the round in progress if it is newer, replicas and kept copies. A replica of a
        newer version being sent from here finishes first, so none lands after the discard."""
        with self._cond:
            versions = self._sealed.get(rank, {})
            for v in [v for v in versions if v > version]:
                del versions[v]
                self._sealed_at.pop((rank, v), None)  # a newer seal of the new timeline's v is its own
            if self._current is not None and self._current > version:
                self._current, self._captured, self._sent, self._lost = None, {}, set(), set()
            self._done, self._opened = min(self._done, version), min(self._opened, version)
            self._unreplicated = {u for u in self._unreplicated if u <= version}  # the new timeline seals them again
            self._peers_rounds.discard(version)
            while self._inflight is not None and self._inflight[0] == rank and self._inflight[1] > version:
                self._landed.wait(0.1)
            dropped = []
            for kind in ("replica", "kept", "held"):
                ring = self.ring(kind, rank)
                with ring.lock:
                    dropped += ring.abandon_newer(version)
            dropped.sort()
        if dropped:
            self.log("discarded", rank=rank, after=version, versions=dropped)
        return dropped

    # -- replication in rounds -------------------------------------------------------------
    # A round is one version v (on the stride) replicated for every rank of the node, so the
    # copies of all ranks line up on common versions: a restore needs one every rank can get.
    # Each rank's copy of v is captured from its slot the moment the rank seals v (a slot is
    # reused three versions later, long before a slow link has sent the others), then sent at
    # the pace the link allows. The next round takes the newest version sealed by then.

    def _start_round(self) -> None:
        """Open a round at the newest version on the stride that any local rank has sealed."""
        if not self.stride.may_start():
            return
        fresh = set().union(*({v for v in vs if self.stride.wants(v) and v > self._done} for vs in self._sealed.values()))
        if not fresh:
            return
        v = max(fresh)
        # Versions sealed since the last round that no round took (a job may seal only some: the bench's arms)
        skipped = sorted(u for u in self._unreplicated if u < v)
        self._unreplicated = {u for u in self._unreplicated if u > v}
        if self._opened >= 0 and skipped:  # each version counted once, by the round that passed it
            self.log("replication_skipped", version=v, skipped=len(skipped), versions=skipped[:SKIPPED_LISTED],
                     stride=self.stride.value,
                     reason=f"{len(skipped)} version(s) sealed since the last round were not replicated")
        self._opened = v
        self._current, self._captured, self._sent, self._lost = v, {}, set(), set()
        self._round_t0 = time.monotonic()
        for rank in self._sealed:
            self._capture(rank)

    def _still_unsent(self, now: float) -> None:
        """A rank sealed a version newer than the round in flight: tell the governor how long the round's oldest
        copy the store has yet to deliver has waited since its seal (a starved store would learn of its lateness
        only once its replicas land; a rank that has not sealed the round's version yet is not the store's wait).
        Under the lock."""
        current, period = self._current, self.stride.period
        if current is None:
            return
        waiting = {r for r in self._sealed if r not in self._sent and r not in self._lost}
        if self._inflight is not None and self._inflight[1] == current:
            waiting.add(self._inflight[0])
        first = min((at for r in waiting if (at := self._sealed_at.get((r, current))) is not None), default=None)
        if self.governor is not None and first is not None and period:
            self.governor.landed((now - first) / period, "still unsent when the next version was sealed", counts=False)

    def _capture(self, rank: int) -> None:
        """Copy ``rank``'s slot of the round's version into the node's kept ring (file to file, in the
        kernel) if it is sealed and not yet taken; the replica is sent from that copy."""
        v = self._current
        if v is None or rank in self._captured or rank in self._sent or rank in self._lost:
            return
        versions = self._sealed.get(rank, {})
        if v not in versions:
            if versions and max(versions) > v:  # it moved past v without sealing it (a restart)
                self._lose(rank, "never sealed by this rank")
            return
        # Keep the node's own copy of every round's version (a ring like the slots'): the replica is sent
        # from it, and a peer that lost its node restores at a round's version, which this node's ranks need
        # too. It is rewritten only SLOTS rounds later, after this round's sends (a round ends with them).
        k = self._kept.get(rank, 0)
        ring, held = self.ring("kept", rank), self.ring("held", rank)  # (the rings' lock is not taken under a ring's)
        with ring.lock:
            old = ring.held[k % SLOTS]
            if old is not None and old in self._peers_rounds.needed():  # still a restore's match
                with held.lock:
                    if old not in held.held:
                        held.copy_from(ring.paths[k % SLOTS], old)
            got = ring.copy_from(Path(versions[v]), v, k % SLOTS)
        if got is None:
            self._lose(rank, "slot rewritten before it was read")
            if self.governor is not None:
                self.governor.missed(f"rank {rank}'s slot of version {v} was rewritten before the store read it")
            return
        self._captured[rank] = got
        self._kept[rank] = k + 1

    # Once a peer is lost, its ranks restore at versions replicated here (:mod:`baft.store.peerrounds`): this node
    # holds its own ranks' copies of them too (``held``; from the slots as a peer's replica begins to arrive,
    # or as a rank seals it if the peer is ahead), whatever its own rounds took; a kept copy of the same
    # version serves until the kept ring reuses it.

    def _hold(self, rank: int, version: int) -> None:
        """A peer's replica of ``rank`` at ``version`` begins to arrive: hold every local rank's copy of it."""
        with self._cond:
            if self._peers_rounds.arriving(rank, version):
                for local in self._sealed:
                    self._hold_rank(local, version)

    def _hold_rank(self, rank: int, version: int) -> None:
        """Copy ``rank``'s slot of ``version`` into a file of its held ring no longer needed. Under the lock."""
        versions = self._sealed.get(rank, {})
        if version not in versions:
            if versions and max(versions) > version:  # it moved on: its slot of the version is reused or never was
                self.log("hold_skipped", rank=rank, version=version, reason="the rank's slot no longer holds it")
            return  # else the rank seals it later: held then
        if version in self.ring("kept", rank).held:
            return  # this node's own round took it too: copied to the held ring only if the kept one is reused
        ring, needed = self.ring("held", rank), self._peers_rounds.needed()
        with ring.lock:
            if version in ring.held:
                return
            free = sorted((k for k, v in enumerate(ring.held) if v not in needed), key=lambda k: ring.held[k] or -1)
            if not free:  # more peers' rounds in flight than the ring holds: the oldest goes
                self.log("hold_evicted", rank=rank, version=min(v for v in ring.held if v is not None), reason="more peer rounds than held slots")
            if ring.copy_from(Path(versions[version]), version, free[0] if free else ring.choose(version)) is None:
                self.log("hold_skipped", rank=rank, version=version, reason="slot rewritten before it was read")
                if self.governor is not None:
                    self.governor.missed(f"rank {rank}'s slot of version {version} was rewritten before the store "
                                         "held it")

    def _lose(self, rank: int, reason: str) -> None:
        self._lost.add(rank)
        self.log("replication_skipped", rank=rank, version=self._current, reason=reason)

    def _next_send(self) -> tuple[int, int, tuple[int, int]] | None:
        """(rank, version, (file of the kept ring, bytes)) to send next; None while waiting. Under the lock."""
        if self._current is None:
            self._start_round()
        if self._current is None:
            return None
        for rank in self._sealed:
            self._capture(rank)
        if time.monotonic() - self._round_t0 > ROUND_TIMEOUT:  # a rank died and never sealed v
            for rank in self._sealed:
                if rank not in self._sent and rank not in self._captured and rank not in self._lost:
                    self._lose(rank, f"not sealed within {ROUND_TIMEOUT:.0f} s")
        for rank, copy in self._captured.items():
            if rank not in self._sent:
                return rank, self._current, copy
        if all(r in self._sent or r in self._lost for r in self._sealed):
            self._done, self._current = self._current, None
            self._captured = {}
            if self._sent:  # a round whose every copy was lost measured nothing about the link
                self.stride.round_done(time.monotonic() - self._round_t0)
            return self._next_send()
        return None

    def _wake_in(self) -> float:
        """Seconds until the replicate thread must look again with nothing notified: the open round's deadline
        for a rank that never seals, the stride's next probe, at most :data:`LOOK_AGAIN` (a round opened by a
        notice thread does not wake it)."""
        now = time.monotonic()
        if self._current is not None:
            return min(LOOK_AGAIN, max(0.0, self._round_t0 + ROUND_TIMEOUT - now) + 0.01)
        if self.stride.degraded:
            return min(LOOK_AGAIN, max(0.0, self.stride.probe_at - self.stride.clock()) + 0.01)
        return LOOK_AGAIN

    def _take(self) -> _Job | None:
        """The next replica to send, marked in flight; None while one is in flight or none is due. Under the lock."""
        if self._closed or self._inflight is not None:
            return None
        job = self._next_send()
        if job is not None:
            self._sent.add(job[0])
            self._inflight = (job[0], job[1])
            self._busy = True
        return job

    def _send_job(self, job: _Job, patience: float | None = None,
                  rest: tuple[Unfinished, list[str]] | None = None) -> tuple[Unfinished, list[str]] | None:
        """Send ``job`` to every target (``rest``: what a notice thread left: its unfinished send, the targets
        from it on); with a ``patience``, what is left once a send waited that long (the job stays in flight)."""
        handed = None
        try:
            handed = self._send_all(job, patience, rest)
            return handed
        finally:
            if handed is None:
                with self._cond:
                    self._inflight = None
                    self._landed.notify_all()

    def _drain(self) -> None:
        """Send what is due from the calling thread (a rank's notice thread, while the link keeps up: no hand-off
        per replica); a send the link holds up longer than :data:`INLINE_PATIENCE` goes to the replicate thread."""
        while True:
            with self._cond:
                paced = self.link.paced()
                job = None if paced else self._take()
                if job is None:
                    if paced:
                        self._cond.notify()
                    return
            handed = self._send_job(job, INLINE_PATIENCE)
            if handed is not None:
                with self._cond:
                    self._handed = (job, *handed)
                    self._cond.notify()
                return

    def _replicate_loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and self._handed is None and (job := self._take()) is None:
                    self._cond.wait(self._wake_in())  # a paced seal, a hand-over, a discard or the close notifies
                if self._closed:
                    return
                handed, self._handed = self._handed, None
            if handed is not None:
                self._send_job(handed[0], rest=handed[1:])
            else:
                assert job is not None  # the loop ends with one unless closed or handed one
                self._send_job(job)

    def _send_all(self, job: _Job, patience: float | None,
                  rest: tuple[Unfinished, list[str]] | None) -> tuple[Unfinished, list[str]] | None:
        """Send one replica (the used bytes of a file of the rank's kept ring) to every target node (see
        :meth:`_send_job`)."""
        rank, version, (k, nbytes) = job
        fd = self.ring("kept", rank).fd(k)
        targets = rest[1] if rest is not None else self.targets
        for i, target in enumerate(targets):
            link = self._peers.get(target)
            if link is None:
                link = self._peers[target] = PeerLink(target, self.config.secret, self.link, self.flags, self.log)
            try:
                sent = (link.finish(rest[0]) if rest is not None and i == 0 else
                        link.send(rank, version, fd, nbytes, patience))
            except OSError as e:
                self.log("replication_failed", rank=rank, version=version, peer=target, reason=str(e))
                continue
            if isinstance(sent, Unfinished):
                return sent, targets[i:]
            self._delivered(rank, version, target, nbytes, sent)
        return None

    def _delivered(self, rank: int, version: int, target: str, nbytes: int, sent: Delivery) -> None:
        """Journal a replica the peer at ``target`` has (and tell the governor how late it landed)."""
        with self._cond:  # staleness: how many newer versions the rank sealed while this one travelled
            behind = max(self._sealed.get(rank) or {version: ""}) - version
            sealed_at = self._sealed_at.get((rank, version))
        period = self.stride.period
        # versions from the seal to the peer's answer, the wait for training traffic to pause left out
        age = (time.monotonic() - sealed_at - sent.deferred) / period if sealed_at is not None and period else None
        if self.governor is not None and not sent.paced and age is not None:
            self.governor.landed(age, f"sent to {target}")
        # cpu_seconds: the store's CPU so far (all threads), so a reader can price the replicas between two
        self.log("replicated", rank=rank, version=version, peer=target, bytes=nbytes, seconds=round(sent.seconds, 6),
                 deferred_seconds=round(sent.deferred, 6), behind=behind, paced=sent.paced,
                 blocked_share=round(self.link.blocked_share(), 3), cpu_seconds=round(time.process_time(), 4),
                 age_versions=None if age is None else round(age, 3))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for link in list(self._peers.values()):
            link.close()
        with self._rings_lock:
            for ring in self._rings.values():
                with ring.lock:  # a receive in progress finishes first
                    ring.close()
            self._rings.clear()
