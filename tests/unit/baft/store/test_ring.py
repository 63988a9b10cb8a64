"""baft.store.ring: a store's ring of slot files, written in place. A copy interrupted anywhere is never taken for a
whole one, a complete file holds exactly its version's bytes, the newest whole copy is always kept, and the files
are rewritten in place (no fresh shared-memory pages per copy)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baft.snapshot.slotfile import (
    COMPLETE,
    HEAD,
    HEADER,
    MAGIC,
    SLOTS,
    WRITING,
    copies,
    replica_slot,
    slot_header,
)
from baft.store.ring import SlotRing

DATA = 3 * 4096 + 100


def payload(version: int) -> bytes:
    """A slot's used bytes for ``version``: its header (COMPLETE), data that says which version it is, no meta."""
    head = HEAD.pack(MAGIC, COMPLETE, version, DATA, 0, 64).ljust(HEADER, b"\0")
    return head + bytes([version % 251]) * DATA


class Cut(Exception):
    pass


def receive(ring: SlotRing, version: int, cut_at: int | None = None) -> None:
    """Write ``version`` through the ring as a socket would fill it; ``cut_at``: the sender dies after so many bytes."""
    data = payload(version)

    def fill(view: memoryview) -> None:
        body = data[HEADER:]
        n = len(body) if cut_at is None else min(cut_at, len(body))
        view[:n] = body[:n]
        if cut_at is not None:
            raise Cut

    ring.receive(version, data[:HEADER], len(data), fill)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 40), st.one_of(st.none(), st.integers(0, DATA))), min_size=1, max_size=25))
def test_no_interrupted_copy_passes_for_a_whole_one_and_the_newest_whole_copy_is_kept(tmp_path: Path, ops) -> None:
    root = tmp_path / f"r{abs(hash(tuple(ops)))}"
    root.mkdir()
    ring = SlotRing([replica_slot(root, 0, k) for k in range(SLOTS)])
    whole: list[int] = []
    try:
        for version, cut in ops:
            try:
                receive(ring, version, cut)
                whole.append(version)
            except Cut:
                pass
            found = dict(copies(root, 0))
            for v, path in found.items():
                assert path.read_bytes()[:HEADER + DATA] == payload(v)  # complete means exactly that version's bytes
            if whole and cut is None:
                assert version in found  # what just landed whole is there
            assert set(found) <= set(whole)
            assert set(found) == {v for v in ring.held if v is not None}  # the ring's memory agrees with the files
    finally:
        ring.close()


def test_an_interrupted_copy_is_left_writing_and_the_ring_reuses_its_file(tmp_path: Path) -> None:
    ring = SlotRing([replica_slot(tmp_path, 2, k) for k in range(SLOTS)])
    for v in (3, 6, 9):
        receive(ring, v)
    inodes = {p: p.stat().st_ino for p in ring.paths}
    with pytest.raises(Cut):
        receive(ring, 12, cut_at=100)
    states = {slot_header(p)[1]: slot_header(p)[0] for p in ring.paths}
    assert WRITING in states.values() and {v for v, _ in copies(tmp_path, 2)} == {6, 9}  # 3 made room, 12 is torn
    receive(ring, 12)
    assert {v for v, _ in copies(tmp_path, 2)} == {6, 9, 12}
    assert {p: p.stat().st_ino for p in ring.paths} == inodes  # the same files, rewritten in place
    assert ring.abandon_newer(6) == [9, 12] and {v for v, _ in copies(tmp_path, 2)} == {6}
    ring.close()


def test_a_file_wiped_behind_the_rings_back_is_made_again(tmp_path: Path) -> None:
    ring = SlotRing([replica_slot(tmp_path, 1, k) for k in range(SLOTS)])
    receive(ring, 1)
    for p in ring.paths:
        if p.exists():
            os.unlink(p)  # a node's memory wiped while the store lived
    ring.rescan()
    receive(ring, 2)
    assert {v for v, _ in copies(tmp_path, 1)} == {2}
    ring.close()


def test_a_kept_copy_never_follows_a_link_put_in_a_slots_place(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(payload(4))
    link = tmp_path / "rank-00001.slot1"
    link.symlink_to(secret)
    ring = SlotRing([tmp_path / f"kept-{k}" for k in range(SLOTS)])
    assert ring.copy_from(link, 4) is None and not any(p.exists() for p in ring.paths)
    ring.close()
