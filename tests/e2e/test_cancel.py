"""Cancelling a run stops everything it started: SIGINT or SIGTERM to ``baft run`` while the
reference trains, while a link is partitioned between node namespaces, and while a worker hangs
SIGSTOPped. Afterwards no process names the run, no namespace, shared memory or mount of it is
left, the journal says ``aborted`` with the signal, and the exit code is 128 + the signal."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.serial]  # stops signalled processes: alone

SCENARIOS = ROOT / "scenarios" / "ci"


def _has(path_glob: tuple[Path, str], needle: str) -> bool:
    root, pattern = path_glob
    for f in root.glob(pattern):
        try:
            if needle in f.read_text():
                return True
        except OSError:
            pass
    return False


def _cmdlines() -> dict[int, str]:
    """Each process's command line and worker spec (BAFT_SPEC in its environment): what names a
    run's paths. A worker forked by torchrun's fork server (harness.run.agent) runs the server's
    command line, but its environment names the run's worker spec."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                spec = [v for v in (d / "environ").read_bytes().split(b"\0") if v.startswith(b"BAFT_SPEC=")]
                text = (d / "cmdline").read_bytes().replace(b"\0", b" ") + b" " + b" ".join(spec)
            except OSError:
                continue
            out[int(d.name)] = text.decode(errors="replace")
    return out


def _netns() -> set[str]:
    try:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {line.split()[0] for line in listed.splitlines() if line.startswith("baft-")}


def _shm_of(pid: int) -> list[Path]:
    found = []
    for d in Path("/dev/shm").glob("baft-*"):
        try:
            if (d / ".owner").read_text().split()[0] == str(pid):
                found.append(d)
        except (OSError, IndexError):
            pass
    return found


def _cancel(scenario: Path, out: Path, cache: Path, ready: Callable[[], bool], sig: int,
            wait: float = 150) -> tuple[int, str]:
    """Start ``baft run``, wait until ``ready()``, send ``sig`` to the harness; (exit code, output).

    That the run stopped at the signal, rather than going on, each test reads from the journal (what was
    and was not written after it); the 30 s given to the exit only keep a run that ignores the signal from
    holding the test (such a run outlasts them: its hang or partition lasts 60 s)."""
    namespaces_before = _netns()
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(scenario), "--out", str(out),
                             "--cache", str(cache), "--no-report"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + wait
        while not ready():
            assert proc.poll() is None, f"the run ended before the moment to cancel it:\n{proc.communicate()[0]}"
            assert time.monotonic() < deadline, "the moment to cancel never came"
            time.sleep(0.1)
        shm = _shm_of(proc.pid)
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    time.sleep(0.2)  # let init reap what the killed ones left as zombies
    # The run's own processes: those naming its directory, or its reference run's (under the cache, in a
    # directory named after the harness's pid; the cache is shared with the tests running beside this one).
    left = {pid: c for pid, c in _cmdlines().items() if str(out) in c or f".tmp{proc.pid}/" in c}
    assert not left, f"processes of the cancelled run still there: {left}"
    assert not _shm_of(proc.pid), "the run's /dev/shm directory is still there"
    assert not any(d.exists() for d in shm), shm
    assert _netns() <= namespaces_before, f"namespaces left: {_netns() - namespaces_before}"
    assert str(out) not in Path("/proc/mounts").read_text(), "a mount of the run is left"
    return proc.returncode, output


def _aborted(out: Path) -> list[dict]:
    f = out / "faulted" / "journal" / "launcher.jsonl"
    return [e for e in map(json.loads, f.read_text().splitlines()) if e["event"] == "aborted"] if f.is_file() else []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cancel_during_the_reference_run_leaves_nothing_and_caches_nothing(tmp_path: Path, sig: int) -> None:
    cache = tmp_path / "cache"  # empty: the reference must run
    out = tmp_path / "out"
    scenario = SCENARIOS / "hang-watchdog.yaml"
    rc, output = _cancel(scenario, out, cache,
                         lambda: _has((cache / "reference", "*.tmp*/journal/rank-*/events.jsonl"), '"event":"step"'), sig)
    assert rc == 128 + sig, output
    assert [e["signal"] for e in _aborted(out)] == [signal.Signals(sig).name]
    assert _aborted(out)[0]["during"] == "reference"
    assert not [p for p in (cache / "reference").glob("*") if p.suffix != ".lock"], "a reference cut short was left in the cache"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_cancel_during_a_hang_continues_and_stops_the_stopped_worker(tmp_path: Path, ref_cache: Path, sig: int) -> None:
    out = tmp_path / "out"
    spec = yaml.safe_load((SCENARIOS / "hang-watchdog.yaml").read_text())
    spec["run"]["hang_timeout"] = 60  # the hang lasts until the signal, never detected
    scenario = tmp_path / "hang.yaml"
    scenario.write_text(yaml.safe_dump(spec))

    def hanging() -> bool:
        # the hang fired and the worker is stopped (state T)
        if not _has((out / "faulted" / "journal", "rank-*/events.jsonl"), '"event":"fault"'):
            return False
        for pid, c in _cmdlines().items():
            if str(out) in c:
                try:
                    if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
                        return True
                except OSError:
                    pass
        return False

    rc, output = _cancel(scenario, out, ref_cache, hanging, sig)
    assert rc == 128 + sig, output
    assert [e["signal"] for e in _aborted(out)] == [signal.Signals(sig).name]
    events = [json.loads(line)["event"] for line in (out / "faulted" / "journal" / "launcher.jsonl").read_text().splitlines()]
    assert "hang_detected" not in events, events  # stopped at the signal, not after the watchdog's 60 s


@pytest.mark.netns
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_cancel_during_a_link_partition_rolls_it_back(tmp_path: Path, ref_cache: Path, sig: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    out = tmp_path / "out"
    spec = yaml.safe_load((SCENARIOS / "link-partition.yaml").read_text())
    spec["faults"][0]["partition"]["duration"] = 60  # still in place when the signal comes
    scenario = tmp_path / "partition.yaml"
    scenario.write_text(yaml.safe_dump(spec))
    rc, output = _cancel(scenario, out, ref_cache,
                         lambda: _has((out / "faulted" / "journal", "launcher.jsonl"), '"event":"fault"'), sig)
    assert rc == 128 + sig, output
    journal = [json.loads(line) for line in (out / "faulted" / "journal" / "launcher.jsonl").read_text().splitlines()]
    events = [e["event"] for e in journal]
    assert "fault_rollback" in events and events[-1] != "fault", events
    # rolled back by the cancel, not at the end of its 60 s window
    assert [e["reason"] for e in journal if e["event"] == "fault_rollback"] == ["run ended"], journal
    assert [e["signal"] for e in _aborted(out)] == [signal.Signals(sig).name]


def test_cleanup_stops_the_processes_of_a_killed_harness_and_keeps_a_live_ones(tmp_path: Path) -> None:
    from harness.run.processes import OWNER_VARIABLE, TOKEN_VARIABLE, owner_value

    def start(token: str, owner: str) -> subprocess.Popen:
        env = {**os.environ, TOKEN_VARIABLE: token, OWNER_VARIABLE: owner}
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)

    dead = subprocess.Popen(["true"])
    dead.wait()  # a harness that is gone: its pid names no live process with that start time
    orphan = start("a" * 32, f"{dead.pid}:0")
    alive = start("b" * 32, owner_value())  # this test's process is the owner, and it runs
    try:
        time.sleep(0.3)
        dry = subprocess.run([sys.executable, "-m", "harness.cli", "cleanup", "--dry-run"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert f"pids {orphan.pid}" in dry.stdout and str(alive.pid) not in dry.stdout, dry.stdout
        assert orphan.poll() is None  # a dry run stops nothing
        done = subprocess.run([sys.executable, "-m", "harness.cli", "cleanup"], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
        assert f"pids {orphan.pid}" in done.stdout, done.stdout
        assert orphan.wait(timeout=10) == -signal.SIGTERM
        assert alive.poll() is None
    finally:
        for p in (orphan, alive):
            if p.poll() is None:
                p.kill()
                p.wait()
