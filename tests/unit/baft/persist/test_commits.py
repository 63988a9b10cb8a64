"""The on-disk checkpoint: atomic commits, checksums, fallback to the last good copy."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from baft import CheckpointConfig, CheckpointCorrupt, Checkpointer, TrainState
from baft.persist import commits as persist


def state_with(value: float) -> TrainState:
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.fill_(value)
    return TrainState(model=model)


def test_commit_then_read(tmp_path: Path) -> None:
    rec = persist.write_shard(tmp_path, 5, 0, b"hello")
    assert persist.committed_steps(tmp_path) == []  # no manifest yet: not committed
    persist.commit(tmp_path, 5, [rec])
    assert persist.latest(tmp_path) == 5
    assert persist.read_shard(tmp_path, 5, 0, 1) == b"hello"


def test_flipped_byte_is_detected(tmp_path: Path) -> None:
    persist.commit(tmp_path, 1, [persist.write_shard(tmp_path, 1, 0, b"abcdef")])
    path = persist.step_dir(tmp_path, 1) / persist.shard_name(0)
    data = bytearray(path.read_bytes())
    data[2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorrupt, match="checksum"):
        persist.read_shard(tmp_path, 1, 0, 1)


def test_world_size_mismatch_is_refused(tmp_path: Path) -> None:
    persist.commit(tmp_path, 1, [persist.write_shard(tmp_path, 1, 0, b"x")])
    with pytest.raises(CheckpointCorrupt, match="ranks"):
        persist.read_shard(tmp_path, 1, 0, 2)


def test_steps_newer_than_latest_are_ignored(tmp_path: Path) -> None:
    persist.commit(tmp_path, 2, [persist.write_shard(tmp_path, 2, 0, b"a")])
    persist.commit(tmp_path, 4, [persist.write_shard(tmp_path, 4, 0, b"b")])
    (tmp_path / persist.LATEST).write_text("2\n")  # crash between manifest and latest
    assert persist.committed_steps(tmp_path) == [2]


def test_checkpointer_falls_back_to_last_good(tmp_path: Path) -> None:
    cfg = CheckpointConfig(strategy="sync", every=1, dir=str(tmp_path), keep=5)
    st = state_with(1.0)
    ck = Checkpointer(cfg, st)
    st.step = 1
    ck.after_step()
    with torch.no_grad():
        st.model.weight.fill_(2.0)
    st.step = 2
    ck.after_step()
    shard = persist.step_dir(tmp_path, 2) / persist.shard_name(0)
    shard.write_bytes(shard.read_bytes()[:-10])  # truncated

    fresh = state_with(0.0)
    seen: list[tuple[str, dict]] = []
    from baft import events

    unsub = events.subscribe(lambda k, f: seen.append((k, f)))
    try:
        step = Checkpointer(cfg, fresh).restore_latest()
    finally:
        unsub()
    assert step == 1
    assert torch.all(fresh.model.weight == 1.0)
    kinds = [k for k, _ in seen]
    assert "checkpoint_rejected" in kinds and "checkpoint_restored" in kinds


def test_prune_keeps_newest(tmp_path: Path) -> None:
    for s in range(1, 6):
        persist.commit(tmp_path, s, [persist.write_shard(tmp_path, s, 0, b"z")])
    persist.prune(tmp_path, 2)
    assert persist.committed_steps(tmp_path) == [5, 4]


def test_none_strategy_never_saves(tmp_path: Path) -> None:
    st = state_with(1.0)
    ck = Checkpointer(CheckpointConfig(strategy="none", dir=str(tmp_path)), st)
    st.step = 1
    assert not ck.after_step()
    assert not any(tmp_path.iterdir())


def test_a_failed_rank_stops_the_committer_waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank that cannot write its shard (ENOSPC) says so; the committer gives up at once: at its first look,
    never sleeping for the record that will not come (not timed: a sleep fails the test)."""
    import time
    from types import SimpleNamespace

    def no_sleep(seconds: float) -> None:
        raise AssertionError("the committer waited for the failed rank's record")

    persist.write_record(tmp_path, 4, persist.write_shard(tmp_path, 4, 0, b"x"))
    persist.write_failure(tmp_path, 4, 1, "No space left on device")
    monkeypatch.setattr(persist, "time", SimpleNamespace(monotonic=time.monotonic, sleep=no_sleep))
    assert persist.wait_records(tmp_path, 4, 2, timeout=30) is None
    monkeypatch.undo()
    assert persist.committed_steps(tmp_path) == []
