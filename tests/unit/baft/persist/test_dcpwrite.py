"""baft.persist.dcpwrite: a DCP checkpoint written from tensors' bytes reads back with stock DCP as if
``dcp.save`` had written it."""
from __future__ import annotations

import io
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint import FileSystemReader

from baft.errors import CheckpointCorrupt
from baft.persist import commits as persist
from baft.persist import dcpwrite

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8,
          torch.bool, torch.int8]


def _tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 100).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), shape=st.lists(st.integers(0, 9), max_size=3).map(tuple),
       seed=st.integers(0, 2**16))
def test_a_patched_archive_is_a_valid_zip_that_loads_as_the_tensor(dtype: torch.dtype, shape: tuple[int, ...],
                                                                     seed: int) -> None:
    t = _tensor(dtype, shape, seed)
    archive = b"".join(dcpwrite.save_template(dtype, shape).parts(dcpwrite.tensor_bytes(t)))
    assert zipfile.ZipFile(io.BytesIO(archive)).testzip() is None  # every entry's CRC-32 matches its bytes
    back = torch.load(io.BytesIO(archive), weights_only=True)
    assert back.dtype == dtype and back.shape == t.shape and torch.equal(back, t)


def test_a_large_tensor_template_keeps_no_data_and_loads() -> None:
    t = torch.arange(300_000, dtype=torch.float32).reshape(600, 500)  # 1.2 MB: the data write is not kept
    template = dcpwrite.save_template(t.dtype, tuple(t.shape))
    assert len(template.head) + len(template.tail) < 4096 and template.nbytes == t.numel() * 4
    archive = b"".join(template.parts(dcpwrite.tensor_bytes(t)))
    assert zipfile.ZipFile(io.BytesIO(archive)).testzip() is None
    assert torch.equal(torch.load(io.BytesIO(archive), weights_only=True), t)
    with pytest.raises(ValueError, match="bytes for a template"):
        template.parts(memoryview(b"short"))


def test_a_non_contiguous_tensor_is_written_in_row_major_order() -> None:
    t = torch.arange(12, dtype=torch.int64).reshape(3, 4).t()
    archive = b"".join(dcpwrite.save_template(t.dtype, tuple(t.shape)).parts(dcpwrite.tensor_bytes(t)))
    assert torch.equal(torch.load(io.BytesIO(archive), weights_only=True), t)


def _state(seed: int) -> dict[str, torch.Tensor]:
    return {f"model.layer{i}.weight": _tensor(DTYPES[i % len(DTYPES)], (i % 4 + 1, 3), seed + i) for i in range(12)} | {
        "rank0/meta": torch.arange(200, dtype=torch.uint8), "optimizer.state.layer0.weight.step": torch.tensor(3.0)}


def test_stock_dcp_reads_what_it_would_have_written_and_the_metadata_is_dcps(tmp_path: Path) -> None:
    sd = _state(1)
    report = dcpwrite.write_rank(tmp_path / "ours", 7, 0, "stage0", sd)
    assert dcpwrite.commit(tmp_path / "ours", 7, [report]) == set()
    assert persist.latest(tmp_path / "ours") == 7
    persist.verify_directory(tmp_path / "ours", 7)  # the manifest's checksums are the files' as stored
    ours = persist.step_dir(tmp_path / "ours", 7)
    out = {k: torch.empty_like(v) for k, v in sd.items()}
    dcp.load(out, storage_reader=FileSystemReader(str(ours)), no_dist=True)
    assert all(torch.equal(out[k], sd[k]) for k in sd)
    dcp.save(sd, checkpoint_id=str(tmp_path / "stock"), no_dist=True)
    mine, stock = FileSystemReader(str(ours)).read_metadata(), FileSystemReader(str(tmp_path / "stock")).read_metadata()
    assert mine.state_dict_metadata == stock.state_dict_metadata
    assert mine.planner_data == stock.planner_data and mine.version == stock.version
    assert {(i.fqn, tuple(i.offset)) for i in mine.storage_data} == {(i.fqn, tuple(i.offset)) for i in stock.storage_data}
    # dcp_to_torch_save (DCP's own conversion to one torch.save file) reads it too
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(ours), str(tmp_path / "whole.pt"))
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    assert set(whole) == set(sd) and all(torch.equal(whole[k], sd[k]) for k in sd)


@settings(max_examples=30, deadline=None)
@given(at=st.integers(0, 10_000), bit=st.integers(0, 7))
def test_one_flipped_bit_in_a_written_file_fails_its_verification(tmp_path_factory: pytest.TempPathFactory, at: int,
                                                                  bit: int) -> None:
    """The data file's checksum (CRC-32, tagged ``crc32:`` in the manifest) finds any one damaged bit."""
    root = tmp_path_factory.mktemp("flip")
    dcpwrite.commit(root, 3, [dcpwrite.write_rank(root, 3, 0, "stage0", _state(2))])
    data = persist.step_dir(root, 3) / dcpwrite.data_file(0)
    assert persist.read_manifest(root, 3)["files"][data.name]["checksum"].startswith("crc32:")
    raw = bytearray(data.read_bytes())
    raw[at % len(raw)] ^= 1 << bit
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointCorrupt, match="checksum mismatch"):
        persist.verify_directory(root, 3)


def test_chunks_of_two_ranks_make_one_tensor_and_a_replicated_chunk_is_kept_once(tmp_path: Path) -> None:
    full = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    reports = []
    for rank in range(2):  # each rank its half of the rows of model.w (as a DTensor shard reports it), model.b whole
        r = dcpwrite.write_rank(tmp_path, 2, rank, "stage0", {"model.w": full[3 * rank : 3 * rank + 3], "model.b": torch.ones(4)})
        items = tuple(w._replace(size=(6, 4), offsets=(3 * rank, 0)) if w.key == "model.w" else w for w in r.items)
        reports.append(replace(r, items=items))
    dcpwrite.commit(tmp_path, 2, reports)
    md = FileSystemReader(str(persist.step_dir(tmp_path, 2))).read_metadata()
    assert len(md.state_dict_metadata["model.w"].chunks) == 2 and len(md.state_dict_metadata["model.b"].chunks) == 1
    out = {"model.w": torch.empty(6, 4), "model.b": torch.empty(4)}
    dcp.load(out, storage_reader=FileSystemReader(str(persist.step_dir(tmp_path, 2))), no_dist=True)
    assert torch.equal(out["model.w"], full) and torch.equal(out["model.b"], torch.ones(4))


def test_a_name_two_stages_both_wrote_goes_under_each_stages_key(tmp_path: Path) -> None:
    a = dcpwrite.write_rank(tmp_path, 1, 0, "stage0", {"model.weight": torch.zeros(2), "model.only0": torch.ones(1)})
    b = dcpwrite.write_rank(tmp_path, 1, 1, "stage1", {"model.weight": torch.ones(2)})
    assert dcpwrite.commit(tmp_path, 1, [a, b]) == {"model.weight"}
    md = FileSystemReader(str(persist.step_dir(tmp_path, 1))).read_metadata().state_dict_metadata
    assert set(md) == {"stage0/model.weight", "stage1/model.weight", "model.only0"}


def test_ranks_that_disagree_on_a_tensor_are_refused_and_nothing_is_committed(tmp_path: Path) -> None:
    a = dcpwrite.write_rank(tmp_path, 1, 0, "stage0", {"model.w": torch.zeros(2, 2)})
    b = dcpwrite.write_rank(tmp_path, 1, 1, "stage0", {"model.w": torch.zeros(2, 2, dtype=torch.float64)})
    with pytest.raises(CheckpointCorrupt, match="model.w: ranks wrote"):
        dcpwrite.commit(tmp_path, 1, [a, b])
    assert persist.latest(tmp_path) is None


def test_a_missing_or_short_file_at_commit_commits_nothing(tmp_path: Path) -> None:
    a = dcpwrite.write_rank(tmp_path, 4, 0, "stage0", {"model.w": torch.ones(10)})
    b = dcpwrite.write_rank(tmp_path, 4, 1, "stage1", {"model.v": torch.ones(10)})
    data = Path(persist.step_dir(tmp_path, 4)) / dcpwrite.data_file(1)
    data.write_bytes(data.read_bytes()[:-1])  # what a lost write would leave
    with pytest.raises(CheckpointCorrupt, match="its writer wrote"):
        dcpwrite.commit(tmp_path, 4, [a, b])
    data.unlink()
    with pytest.raises(CheckpointCorrupt, match="missing at commit"):
        dcpwrite.commit(tmp_path, 4, [a, b])
    assert persist.latest(tmp_path) is None


def test_the_data_file_is_committed_whole_or_not_at_all(tmp_path: Path) -> None:
    """write_rank writes under a temporary name and renames: no partial data file under the real name."""
    report = dcpwrite.write_rank(tmp_path, 3, 5, "stage0", {"model.w": torch.ones(10)})
    d = Path(persist.step_dir(tmp_path, 3))
    assert sorted(p.name for p in d.iterdir()) == [dcpwrite.data_file(5)]
    assert (d / dcpwrite.data_file(5)).stat().st_size == report.size == report.items[-1].offset + report.items[-1].length
