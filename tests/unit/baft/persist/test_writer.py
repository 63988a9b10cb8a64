"""baft.persist.writer: the writer process writes a DCP data file from slot ranges and bytes, durably, says
what failed, and goes when its parent closes it or dies."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from baft.persist import dcpwrite
from baft.persist.writer import WriterProcess
from baft.snapshot.slots import Slot


def _records(slot: Slot) -> tuple[list, list[torch.Tensor]]:
    data = slot.data()
    a = data[0:400].view(torch.float32).reshape(10, 10)
    a.copy_(torch.randn(10, 10, generator=torch.Generator().manual_seed(1)))
    b = data[448:464].view(torch.int64)
    b.copy_(torch.tensor([7, -3]))
    loose = torch.arange(5, dtype=torch.int16)  # not in the slot: sent as bytes
    tensors = [a, b, loose, a]  # the same template twice in one request
    records = []
    for t in tensors:
        tpl = dcpwrite.save_template(t.dtype, tuple(t.shape))
        records.append(((tpl.head, tpl.tail, tpl.head_crc, tpl.tail_crc), dcpwrite._source(t, slot)))
    return records, tensors


def test_the_file_holds_each_tensors_archive_and_the_answer_is_its_size_and_checksum(tmp_path: Path) -> None:
    slot = Slot(tmp_path / "slot", 4096, 1024, create=True)
    writer = WriterProcess()
    try:
        records, tensors = _records(slot)
        assert isinstance(records[0][1], tuple) and isinstance(records[2][1], bytes)  # a slot range, and bytes
        for attempt in range(2):  # the second request reuses the templates the process already holds
            path = tmp_path / f"out{attempt}.distcp"
            size, checksum = writer.write(str(path), str(slot.path), records)
            raw = path.read_bytes()
            assert checksum.startswith("crc32:") and size == len(raw)
            assert checksum == dcpwrite.persist.checksum(raw, like=checksum)
            pos = 0
            for t in tensors:
                n = dcpwrite.save_template(t.dtype, tuple(t.shape)).length
                archive = raw[pos : pos + n]
                assert zipfile.ZipFile(io.BytesIO(archive)).testzip() is None
                assert torch.equal(torch.load(io.BytesIO(archive), weights_only=True), t)
                pos += n
            assert not (tmp_path / f"out{attempt}.distcp.tmp").exists()
    finally:
        writer.close()
        slot.close()
    assert writer._proc.returncode == 0  # it left at the end of its input


def test_each_write_reads_the_slot_as_it_is_then_also_once_the_file_is_replaced(tmp_path: Path) -> None:
    """The process keeps a slot file mapped between writes: it must see the rank's newer bytes, and a
    slot file made anew at the same path (another size, another inode) rather than the old mapping."""
    slot = Slot(tmp_path / "slot", 4096, 1024, create=True)
    writer = WriterProcess()
    try:
        records, tensors = _records(slot)
        for attempt in range(2):
            tensors[0].fill_(float(attempt + 1))  # the rank rewrites the slot in place
            path = tmp_path / f"out{attempt}.distcp"
            writer.write(str(path), str(slot.path), records)
            n = dcpwrite.save_template(torch.float32, (10, 10)).length
            back = torch.load(io.BytesIO(path.read_bytes()[:n]), weights_only=True)
            assert torch.equal(back, torch.full((10, 10), float(attempt + 1)))
        slot.close()
        os.unlink(slot.path)
        slot = Slot(tmp_path / "slot", 8192, 1024, create=True)  # replaced: another file at the same path
        records, tensors = _records(slot)
        tensors[0].fill_(5.0)
        writer.write(str(tmp_path / "out2.distcp"), str(slot.path), records)
        back = torch.load(io.BytesIO((tmp_path / "out2.distcp").read_bytes()[:n]), weights_only=True)
        assert torch.equal(back, torch.full((10, 10), 5.0))
    finally:
        writer.close()
        slot.close()


def test_a_failed_write_is_an_oserror_and_the_process_serves_the_next(tmp_path: Path) -> None:
    slot = Slot(tmp_path / "slot", 4096, 1024, create=True)
    writer = WriterProcess()
    try:
        records, _ = _records(slot)
        with pytest.raises(OSError, match="No such file or directory"):
            writer.write(str(tmp_path / "no" / "such" / "dir" / "f.distcp"), str(slot.path), records)
        size, _ = writer.write(str(tmp_path / "f.distcp"), str(slot.path), records)
        assert size == (tmp_path / "f.distcp").stat().st_size
    finally:
        writer.close()
        slot.close()


def test_a_writer_whose_process_died_says_so(tmp_path: Path) -> None:
    writer = WriterProcess()
    try:
        os.kill(writer.pid, signal.SIGKILL)
        writer._proc.wait()
        with pytest.raises(OSError, match="the writer process is gone"):
            writer.write(str(tmp_path / "f"), "", [])
    finally:
        writer.close()


PARENT = """
import sys, time
from baft.persist.writer import WriterProcess
w = WriterProcess()
print(w.pid, flush=True)
time.sleep(60)
"""


def _state(pid: int) -> str | None:
    """The process's state letter (Z: a zombie), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return None


def _until(check, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_the_process_goes_with_the_rank_that_started_it() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert _until(lambda: Path(f"/proc/{child}/comm").read_text().strip() == "baft-writer")  # named for ps
        parent.kill()  # SIGKILL: no close, no atexit
        parent.wait()
        assert _until(lambda: _state(child) in (None, "Z"))  # killed with its parent (PR_SET_PDEATHSIG)
    finally:
        if parent.poll() is None:
            parent.kill()


def test_the_writer_runs_in_the_idle_classes_when_asked_and_says_what_it_got() -> None:
    """Its files are written while the ranks wait in their bubbles (SCHED_IDLE: a core no normal process
    wants), and the strategy journals what the kernel accepted (``background_priority``)."""
    idle, normal = WriterProcess(priority="idle"), WriterProcess()
    try:
        assert (idle.applied.cpu, idle.applied.io, idle.applied.note) == ("SCHED_IDLE", "idle", "")
        assert os.sched_getscheduler(idle.pid) == os.SCHED_IDLE
        assert normal.applied.cpu == "normal" and os.sched_getscheduler(normal.pid) == os.SCHED_OTHER
    finally:
        idle.close()
        normal.close()


def _absolute(root: Path, ops: list) -> list:
    return [(op.kind, str(root / op.rel), op.size, op.data, op.sync_dir) for op in ops]


def test_a_commit_run_by_the_process_leaves_what_one_run_here_does_and_stops_at_a_short_file(tmp_path: Path) -> None:
    """The commit's file operations (expect, write, remove) in the writer process: the same manifest and
    ``latest`` as :func:`run_ops` here; a file not at its writer's size raises CheckpointCorrupt there too, and
    nothing after it runs (``latest`` stays)."""
    from baft.errors import CheckpointCorrupt
    from baft.persist import commits

    for root in (tmp_path / "here", tmp_path / "there"):
        (root / commits.step_name(1)).mkdir(parents=True)
        (root / commits.step_name(1) / "a.distcp").write_bytes(b"x" * 10)
        (root / commits.step_name(0)).mkdir()  # an older step, stale: pruned once step 1 is committed
    files = {"a.distcp": (10, "crc32:00000000")}
    ops = commits.commit_file_ops(1, 1, files, {"format": "dcp"})
    commits.run_ops(tmp_path / "here", ops + commits.prune_ops(tmp_path / "here", 1, committing=1))
    writer = WriterProcess()
    try:
        writer.run(_absolute(tmp_path / "there", ops + commits.prune_ops(tmp_path / "there", 1, committing=1)))
        for name in (f"{commits.step_name(1)}/{commits.MANIFEST}", commits.LATEST):
            assert (tmp_path / "there" / name).read_bytes() == (tmp_path / "here" / name).read_bytes()
        assert not (tmp_path / "there" / commits.step_name(0)).exists()
        assert commits.latest(tmp_path / "there") == 1
        (tmp_path / "there" / commits.step_name(2)).mkdir()
        (tmp_path / "there" / commits.step_name(2) / "a.distcp").write_bytes(b"x" * 9)  # short
        with pytest.raises(CheckpointCorrupt, match="9 bytes at commit, its writer wrote 10"):
            writer.run(_absolute(tmp_path / "there", commits.commit_file_ops(2, 1, files)))
        assert commits.latest(tmp_path / "there") == 1 and not (tmp_path / "there" / commits.step_name(2) / commits.MANIFEST).exists()
        with pytest.raises(CheckpointCorrupt, match="missing at commit"):
            writer.run(_absolute(tmp_path / "there", commits.commit_file_ops(3, 1, files)))
        writer.run([])  # and it serves the next request
    finally:
        writer.close()


def test_a_persist_from_the_same_slot_reuses_its_entries_but_writes_the_bytes_of_now(tmp_path: Path) -> None:
    """write_rank keeps each slot's plan (templates, items, where the bytes are) for the same views: the next
    persist writes the slot's bytes as they are then, a tensor sent by value (not in the slot) with its values
    then, and a key whose tensor was replaced as the new one."""
    slot = Slot(tmp_path / "slot", 4096, 1024, create=True)
    writer = WriterProcess()
    try:
        data = slot.data()
        a = data[0:400].view(torch.float32).reshape(10, 10)
        loose = torch.zeros(3, dtype=torch.int64)  # the same object each time, not in the slot
        for step, other in enumerate((torch.ones(2), torch.arange(6.0))):
            a.fill_(float(step + 1))
            loose.fill_(step + 7)
            sd = {"a": a, "loose": loose, "other": other}
            report = dcpwrite.write_rank(tmp_path, step, 0, "s", sd, writer=writer, slot=slot)
            raw = (tmp_path / f"step-{step:08d}" / report.file).read_bytes()
            for w in report.items:
                back = torch.load(io.BytesIO(raw[w.offset : w.offset + w.length]), weights_only=True)
                assert torch.equal(back, sd[w.key]), (step, w.key)
            assert report.size == len(raw)
        assert dcpwrite._PLANS  # kept for the slot's next persist
    finally:
        writer.close()
        slot.close()
