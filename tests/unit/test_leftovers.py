"""What killed runs leave in /dev/shm: owned directories, told apart from live runs' (pid and start time)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.cli import main as cli_main
from harness.run.leftovers import OWNER, UNOWNED_AGE, claim_shm, owner_alive, stale_shm, sweep
from harness.run.processes import start_time as _start_time


def _dead_pid() -> tuple[int, str]:
    """The pid and start time of a process that has exited (reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    start = _start_time(proc.pid)
    assert start is not None
    proc.kill()
    proc.wait()
    return proc.pid, start


def test_a_claimed_directory_names_this_process_and_is_kept(tmp_path: Path) -> None:
    path = claim_shm(tmp_path)
    assert path.name.startswith("baft-") and oct(path.stat().st_mode & 0o777) == "0o700"
    assert (path / OWNER).read_text().split()[0] == str(os.getpid()) and owner_alive(path) is True
    stale, kept = stale_shm(tmp_path)
    assert stale == [] and kept == [f"{path}: its run is still going"]


def test_a_dead_owners_directory_is_removed_with_what_it_holds(tmp_path: Path) -> None:
    path = tmp_path / "baft-0123456789ab"
    (path / "node0" / "slot").mkdir(parents=True)
    (path / "node0" / "slot" / "data").write_bytes(b"x" * 4096)
    pid, start = _dead_pid()
    (path / OWNER).write_text(f"{pid} {start}\n")
    assert owner_alive(path) is False
    dry = sweep(shm_root=tmp_path, network=False, processes=False, dry_run=True)
    assert dry.removed == [str(path)] and path.is_dir()  # a dry run removes nothing
    done = sweep(shm_root=tmp_path, network=False, processes=False)
    assert done.removed == [str(path)] and not path.exists() and done.errors == []


def test_a_reused_pid_is_not_the_owner(tmp_path: Path) -> None:
    path = tmp_path / "baft-reused"
    path.mkdir()
    (path / OWNER).write_text(f"{os.getpid()} 1\n")  # this pid, but a process that started at another time
    assert owner_alive(path) is False and stale_shm(tmp_path)[0] == [path]


def test_an_unowned_directory_goes_only_once_it_is_old(tmp_path: Path) -> None:
    path = tmp_path / "baft-deploy-x"
    path.mkdir()
    stale, kept = stale_shm(tmp_path)
    assert stale == [] and "no owner file" in kept[0]
    old = time.time() - UNOWNED_AGE - 5
    os.utime(path, (old, old))
    assert stale_shm(tmp_path)[0] == [path]


def test_force_takes_live_runs_too_and_nothing_else_is_touched(tmp_path: Path) -> None:
    live = claim_shm(tmp_path)
    other = tmp_path / "not-baft"
    other.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "baft-link").symlink_to(target)  # a link is never followed nor removed
    (tmp_path / "baft-file").write_text("")
    assert stale_shm(tmp_path, force=True)[0] == [live]
    sweep(shm_root=tmp_path, network=False, processes=False, force=True)
    assert not live.exists() and other.is_dir() and target.is_dir() and (tmp_path / "baft-link").is_symlink()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["live", "dead", "reused", "unowned", "garbled"]), st.booleans()),
                max_size=8))
def test_every_directory_is_either_stale_or_kept_and_a_live_one_never_stale(tmp_path_factory: pytest.TempPathFactory,
                                                                           dirs: list[tuple[str, bool]]) -> None:
    root = tmp_path_factory.mktemp("shm")
    me, now = f"{os.getpid()} {_start_time(os.getpid())}", time.time()
    owners = {"live": me, "dead": "999999999 5", "reused": f"{os.getpid()} 1", "garbled": "not a pid"}
    expected_stale = set()
    for i, (state, old) in enumerate(dirs):
        path = root / f"baft-{i:012x}"
        path.mkdir()
        if state in owners:
            (path / OWNER).write_text(owners[state])
        if old:
            os.utime(path, (now - 2 * UNOWNED_AGE, now - 2 * UNOWNED_AGE))
        if state in ("dead", "reused") or (state in ("unowned", "garbled") and old):
            expected_stale.add(path)
    stale, kept = stale_shm(root, now=now)
    assert set(stale) == expected_stale and len(stale) + len(kept) == len(dirs)


def test_cli_dry_run_lists_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    before = sorted(Path("/dev/shm").glob("baft-*"))
    assert cli_main(["cleanup", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would remove" in out or "nothing left behind" in out
    assert all(p.exists() for p in before if p.is_dir())  # a dry run removed nothing
