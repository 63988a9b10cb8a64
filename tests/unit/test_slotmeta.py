"""baft.slotmeta: a sealed slot's components decode the same each time, the static part once per layout."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from baft import CheckpointConfig, codec, digest_components, slotmeta
from baft.bubble import BubbleSnapshotter
from baft.slotfile import HEADER
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
