"""baft.snapshot.slotmeta: a sealed slot's components decode the same each time, the static part once per layout."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from baft import CheckpointConfig, digest_components
from baft.snapshot import slotmeta
from baft.snapshot.slotfile import HEADER
from baft.state import codec
from baft.strategies.baft.snapshotter import BubbleSnapshotter

from tests.unit.test_bubbles import make_state, step


def test_the_static_part_is_decoded_once_and_what_it_gives_is_not_changed_by_use(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    st = make_state(3)
    snap = BubbleSnapshotter(st, CheckpointConfig(strategy="baft"), tmp_path, rank=0)
    try:
        for _ in range(3):
            step(st, snap)
        slot = snap.buffer.slot_for(2)
        meta, data = slot.meta(), slot.data()
        first, static = slotmeta.components(meta, data)
        snapshot_of_static = codec.encode(static)
        decoded = []
        real = codec.decode
        monkeypatch.setattr(codec, "decode", lambda b: decoded.append(len(b)) or real(b))
        views, _ = slotmeta.components(meta, data, copy=False)
        assert len(decoded) == 1  # the dynamic part only: the static one came from the cache
        assert digest_components(views) == digest_components(first)
        views["optimizer"]["param_groups"][0]["lr"] = 99.0  # a caller changing what it got ...
        views["model"].clear()
        again, static_again = slotmeta.components(meta, data)
        assert codec.encode(static_again) == snapshot_of_static  # ... changes nothing shared
        assert digest_components(again) == digest_components(first)
        assert all(isinstance(t, torch.Tensor) for t in again["model"].values())
    finally:
        snap.close()


def test_a_torn_slots_static_part_reads_as_unknown(tmp_path: Path) -> None:
    st = make_state(4)
    snap = BubbleSnapshotter(st, CheckpointConfig(strategy="baft"), tmp_path, rank=0)
    try:
        step(st, snap)
        slot = snap.buffer.slot_for(0)
        assert slotmeta.static_meta(slot)["replicas"] == 1
        start = HEADER + slot.data_len  # the header, the data, then the metadata: garble its static part
        slot.bytes[start + 8 : start + 24] = 0xFF
        assert slotmeta.static_meta(slot) is None
    finally:
        snap.close()


def test_a_slots_views_are_made_once_follow_its_bytes_and_never_block_its_unmapping(tmp_path: Path) -> None:
    """The persister reads a sealed version as views of its slot every persist: the views of one slot and
    layout are made once (the same tensors each time), show the version the slot holds now, and are
    dropped before the slot's mapping is grown or closed (``torch.frombuffer`` exports no buffer, so
    ``mmap.close`` unmaps under any view: a cached one read later would fault)."""
    st = make_state(5)
    snap = BubbleSnapshotter(st, CheckpointConfig(strategy="baft"), tmp_path, rank=0)
    try:
        for _ in range(2):  # version 0 has no optimizer state yet: version 1 has the layout that stays
            step(st, snap)
        with snap.sealed_version(1) as first:
            w0 = first["model"]["0.weight"]
            held = w0.clone()
        with snap.sealed_version(1) as again:
            assert again["model"]["0.weight"] is w0  # made once for this slot and layout
            assert again["step"] == first["step"] == {"step": 1}
        for _ in range(3):  # versions 2, 3, 4: version 4 goes into version 1's slot
            step(st, snap)
        with snap.sealed_version(4) as later:
            assert later["model"]["0.weight"] is w0  # the same views ...
            assert later["step"] == {"step": 4} and not torch.equal(later["model"]["0.weight"], held)  # ... of what it holds now
        now = later["model"]["0.weight"].clone()
        assert torch.equal(now, snap.read_version(4)["model"]["0.weight"])
        del first, again, later, w0  # views of the mapping grow_meta unmaps: reading one after would fault
        slot = snap.buffer.slot_for(4)
        assert slot.views
        slot.grow_meta(slot.meta_capacity * 2)  # remapped: the views of the old mapping are gone with it
        assert not slot.views  # (a cached view handed out after this would read unmapped memory)
        with snap.sealed_version(4) as after:
            assert torch.equal(after["model"]["0.weight"], now)
    finally:
        snap.close()  # closes every slot, views cached in them or not
    assert all(not s.views for s in snap.buffer.slots.values())
