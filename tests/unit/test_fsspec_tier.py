"""The persistent tier at an fsspec URL (``file://`` and in-process ``memory://``):
round trips, corruption caught, ``latest`` never ahead of the data, pruning, and the
error when fsspec is missing."""
from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from baft import (
    STRATEGIES,
    BaftConfigError,
    CheckpointConfig,
    CheckpointCorrupt,
    Checkpointer,
    digest_components,
)
from baft.config import BaftConfig
from baft.persist import commits as persist
from baft.persist import dcpformat, storage

from .test_strategies import make_state, train


@pytest.fixture(params=["file", "memory"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty persistent root at a URL."""
    pytest.importorskip("fsspec")
    if request.param == "file":
        yield f"file://{tmp_path}/ckpt"
        return
    root = f"memory://baft-test-{uuid.uuid4().hex}"
    yield root
    fs, path = fs_of(root)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def fs_of(url: str) -> tuple[Any, str]:
    """The fsspec file system and path of ``url``, to reach the stored objects without baft."""
    from fsspec.core import url_to_fs

    return url_to_fs(url)


def flip_byte(location: str, at: int) -> None:
    fs, path = fs_of(location)
    data = bytearray(fs.cat_file(path))
    data[at] ^= 0x01
    fs.pipe_file(path, bytes(data))


def components() -> dict[str, Any]:
    torch.manual_seed(0)
    return {
        "model": {"w": torch.randn(5, 3), "b": torch.arange(4, dtype=torch.float64)},
        "optimizer": {"state": {0: {"exp_avg": torch.randn(7)}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        "step": 3,
        "rng": {"python": [1, 2, 3]},
    }


def save_dcp(url: str, step: int) -> dict[str, torch.Tensor]:
    sd = dcpformat.to_state_dict(components(), 0, "stage0")
    dcpformat.save(url, step, sd)
    return sd


def dcp_data_file(url: str, step: int) -> str:
    st = storage.at(url)
    return next(n for n in st.files(persist.step_name(step)) if n.endswith(".distcp"))


# (1) sync-format shards


def test_shard_round_trip_and_flipped_byte(url: str) -> None:
    rec = persist.write_shard(url, 5, 0, b"hello world")
    assert persist.committed_steps(url) == []  # no manifest yet: not committed
    persist.commit(url, 5, [rec])
    assert persist.latest(url) == 5
    assert persist.read_shard(url, 5, 0, 1) == b"hello world"
    shard = f"{persist.step_dir(url, 5)}/{persist.shard_name(0)}"
    assert shard == f"{url}/step-00000005/rank-00000.pt"
    fs, path = fs_of(shard)
    assert fs.cat_file(path) == b"hello world"  # really stored at the URL

    flip_byte(shard, 3)
    with pytest.raises(CheckpointCorrupt, match="checksum"):
        persist.read_shard(url, 5, 0, 1)


def test_file_url_lands_in_the_local_directory(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/ckpt"
    persist.commit(url, 1, [persist.write_shard(url, 1, 0, b"abc")])
    assert (tmp_path / "ckpt" / "step-00000001" / "rank-00000.pt").read_bytes() == b"abc"
    assert persist.latest(tmp_path / "ckpt") == 1  # the same tier, read as a plain directory
    assert persist.read_shard(tmp_path / "ckpt", 1, 0, 1) == b"abc"


def test_shard_checksum_comes_from_what_was_stored(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    write = storage.FsspecStorage.write

    def lossy(self: storage.FsspecStorage, rel: str, data: bytes | memoryview) -> None:
        write(self, rel, bytes(data)[:-1])  # a store that silently drops the last byte

    monkeypatch.setattr(storage.FsspecStorage, "write", lossy)
    with pytest.raises(CheckpointCorrupt, match="differ"):
        persist.write_shard(url, 1, 0, b"abcdef")


# (2) DCP format


def test_dcp_round_trip_through_url(url: str) -> None:
    sd = save_dcp(url, 2)
    dcpformat.commit(url, 2, 1, {"format": "dcp"})
    assert persist.latest(url) == 2
    persist.verify_directory(url, 2)
    manifest = persist.read_manifest(url, 2)
    assert dcpformat.METADATA in manifest["files"] and any(n.endswith(".distcp") for n in manifest["files"])

    loaded = dcpformat.load(url, 2, 0, "stage0")
    original = components()
    assert digest_components(loaded) == digest_components(original)
    assert torch.equal(loaded["model"]["w"], original["model"]["w"])
    assert loaded["optimizer"]["param_groups"] == original["optimizer"]["param_groups"]

    # Stock DCP, no baft code: FsspecReader into a template built from the metadata.
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    d = str(persist.step_dir(url, 2))
    md = FsspecReader(d).read_metadata().state_dict_metadata
    template = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype) for k, v in md.items()}
    dcp.load(template, storage_reader=FsspecReader(d))
    assert set(template) == set(sd)
    for k, t in sd.items():
        assert torch.equal(template[k], t), k


def test_dcp_flipped_byte_is_detected(url: str) -> None:
    save_dcp(url, 2)
    dcpformat.commit(url, 2, 1)
    flip_byte(f"{persist.step_dir(url, 2)}/{dcp_data_file(url, 2)}", 10)
    with pytest.raises(CheckpointCorrupt, match="checksum"):
        persist.verify_directory(url, 2)


# (3) latest never moves ahead of the data


def committed_at_2(url: str) -> None:
    save_dcp(url, 2)
    dcpformat.commit(url, 2, 1)
    assert persist.committed_steps(url) == [2]


def assert_still_at_2(url: str) -> None:
    assert persist.latest(url) == 2
    assert persist.committed_steps(url) == [2]


def test_missing_dcp_data_file_is_not_committed(url: str) -> None:
    committed_at_2(url)
    save_dcp(url, 4)
    fs, path = fs_of(f"{persist.step_dir(url, 4)}/{dcp_data_file(url, 4)}")
    fs.rm(path)
    with pytest.raises(CheckpointCorrupt, match="missing at commit"):
        dcpformat.commit(url, 4, 1)
    assert_still_at_2(url)
    assert not storage.at(url).is_file(f"{persist.step_name(4)}/{persist.MANIFEST}")


def test_missing_dcp_metadata_is_not_committed(url: str) -> None:
    committed_at_2(url)
    save_dcp(url, 4)
    fs, path = fs_of(f"{persist.step_dir(url, 4)}/{dcpformat.METADATA}")
    fs.rm(path)
    with pytest.raises(CheckpointCorrupt, match="metadata"):
        dcpformat.commit(url, 4, 1)
    assert_still_at_2(url)


def test_truncated_dcp_data_file_is_not_committed(url: str) -> None:
    committed_at_2(url)
    save_dcp(url, 4)
    fs, path = fs_of(f"{persist.step_dir(url, 4)}/{dcp_data_file(url, 4)}")
    fs.pipe_file(path, fs.cat_file(path)[:-100])
    with pytest.raises(CheckpointCorrupt, match="its writer wrote"):
        dcpformat.commit(url, 4, 1)
    assert_still_at_2(url)


def test_missing_shard_is_not_committed(url: str) -> None:
    persist.commit(url, 2, [persist.write_shard(url, 2, 0, b"a")])
    rec0 = persist.write_shard(url, 4, 0, b"b")
    ghost = persist.ShardRecord(rank=1, file=persist.shard_name(1), size=1, checksum=persist.checksum(b"c"))
    with pytest.raises(CheckpointCorrupt, match="missing at commit"):
        persist.commit(url, 4, [rec0, ghost])
    assert persist.latest(url) == 2 and persist.committed_steps(url) == [2]


def test_commit_failing_midway_leaves_latest(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    committed_at_2(url)
    save_dcp(url, 4)
    real = persist.file_checksum
    calls: list[str] = []

    def failing(st: storage.Storage, rel: str, block: int = 8 << 20) -> tuple[int, str]:
        calls.append(rel)
        if len(calls) == 2:
            raise OSError("connection reset while reading back")
        return real(st, rel, block)

    monkeypatch.setattr(persist, "file_checksum", failing)
    with pytest.raises(OSError, match="connection reset"):
        dcpformat.commit(url, 4, 1)
    assert len(calls) == 2
    monkeypatch.undo()
    assert_still_at_2(url)
    assert not storage.at(url).is_file(f"{persist.step_name(4)}/{persist.MANIFEST}")


@pytest.mark.parametrize("fail_on", [persist.MANIFEST, persist.LATEST])
def test_failed_manifest_or_latest_write_leaves_step_uncommitted(
    url: str, monkeypatch: pytest.MonkeyPatch, fail_on: str
) -> None:
    committed_at_2(url)
    save_dcp(url, 4)
    write = storage.FsspecStorage.write

    def failing(self: storage.FsspecStorage, rel: str, data: bytes | memoryview) -> None:
        if rel.endswith(fail_on):
            raise OSError(f"write of {rel} failed")
        write(self, rel, data)

    monkeypatch.setattr(storage.FsspecStorage, "write", failing)
    with pytest.raises(OSError, match="failed"):
        dcpformat.commit(url, 4, 1)
    monkeypatch.undo()
    assert_still_at_2(url)


# (4) committed_steps and prune


def test_committed_steps_and_prune(url: str) -> None:
    assert persist.committed_steps(url) == []  # root not there yet
    for s in range(1, 6):
        persist.commit(url, s, [persist.write_shard(url, s, 0, b"z")])
    persist.write_shard(url, 3, 1, b"stray")  # noise inside a committed step
    persist.write_shard(url, 0, 0, b"partial")  # stale, never committed
    persist.write_shard(url, 7, 0, b"in flight")  # newer than latest: a save in progress
    assert persist.committed_steps(url) == [5, 4, 3, 2, 1]
    persist.prune(url, 2)
    assert persist.committed_steps(url) == [5, 4]
    st = storage.at(url)
    assert st.dirs() == [persist.step_name(s) for s in (4, 5, 7)]
    assert persist.read_shard(url, 5, 0, 1) == b"z"


def test_steps_newer_than_latest_are_ignored(url: str) -> None:
    persist.commit(url, 2, [persist.write_shard(url, 2, 0, b"a")])
    persist.commit(url, 4, [persist.write_shard(url, 4, 0, b"b")])
    fs, path = fs_of(f"{url}/{persist.LATEST}")
    fs.pipe_file(path, b"2\n")  # crash between manifest and latest
    assert persist.committed_steps(url) == [2]


# Every strategy, end to end, at a URL


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "none"])
def test_strategy_restores_from_url(url: str, tmp_path: Path, strategy: str) -> None:
    cfg = CheckpointConfig(strategy=strategy, every=2, dir=url, baft=BaftConfig(shm_dir=str(tmp_path / "shm")))
    st = make_state(0)
    ck = Checkpointer(cfg, st)
    ck.attach(torch.nn.Identity())
    assert ck.restore_latest() == 0
    train(st, ck, 4)
    expected = digest_components(st.capture())
    ck.close()
    assert persist.latest(url) == 4
    shutil.rmtree(tmp_path / "shm", ignore_errors=True)  # only the URL tier is left

    fresh = make_state(1)
    ck2 = Checkpointer(cfg, fresh)
    ck2.attach(torch.nn.Identity())
    assert ck2.restore_latest() == 4
    ck2.close()
    assert digest_components(fresh.capture()) == expected


# (5) fsspec missing, or a URL it cannot open


@pytest.fixture
def no_fsspec(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "fsspec" or m.startswith("fsspec.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "fsspec", None)  # makes `import fsspec...` raise ImportError
    monkeypatch.setitem(sys.modules, "fsspec.core", None)


@pytest.mark.usefixtures("no_fsspec")
def test_missing_fsspec_says_how_to_install() -> None:
    url = "s3://bucket/prefix"
    with pytest.raises(BaftConfigError) as e:
        CheckpointConfig(dir=url)
    assert (e.value.field, e.value.expected, e.value.found) == ("dir", storage.INSTALL_HINT, url)
    assert "pip install 'baft-harness[fsspec]'" in str(e.value)
    with pytest.raises(BaftConfigError, match="baft-harness\\[fsspec\\]"):
        persist.latest("memory://somewhere")


@pytest.mark.usefixtures("no_fsspec")
def test_local_directory_needs_no_fsspec(tmp_path: Path) -> None:
    CheckpointConfig(dir=str(tmp_path))
    persist.commit(tmp_path, 1, [persist.write_shard(tmp_path, 1, 0, b"x")])
    assert persist.read_shard(tmp_path, 1, 0, 1) == b"x"
    assert isinstance(persist.step_dir(tmp_path, 1), Path)


def test_unknown_protocol_fails_at_config() -> None:
    pytest.importorskip("fsspec")
    with pytest.raises(BaftConfigError, match="protocol") as e:
        CheckpointConfig(dir="nosuchproto://bucket/x")
    assert e.value.field == "dir"


def test_missing_backend_fails_at_config() -> None:
    fsspec = pytest.importorskip("fsspec")
    try:
        fsspec.get_filesystem_class("s3")
    except ImportError:
        pass
    else:
        pytest.skip("s3fs is installed")
    with pytest.raises(BaftConfigError, match="backend for 's3'"):
        CheckpointConfig(dir="s3://bucket/x")
