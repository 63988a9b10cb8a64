"""End-to-end fixtures: run the real ``baft`` CLI (real torchrun, real gloo, real signals)."""
from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ref_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference cache every test of the run shares: tox points BAFT_CACHE_DIR into its env;
    else one directory beside the pytest-xdist workers' temp dirs (the cache locks per key)."""
    env = os.environ.get("BAFT_CACHE_DIR")
    if env:
        return Path(env)
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "baft-cache"
    shared.mkdir(exist_ok=True)
    return shared


def run_cli(scenario: Path | dict[str, Any], out: Path, cache: Path,
            report: bool = False) -> tuple[int, str, dict[str, Any] | None]:
    """Run ``baft run`` (the CLI's ``main``, in this process); returns exit code, output and the
    verdict (if written). The HTML/Markdown report and its plots only with ``report`` (the tests
    that read them: test_suite, test_pytest_plugin, test_cluster and the unit report tests).

    In-process, a run skips the seconds a fresh interpreter spends importing torch and tearing it down;
    everything the run starts (torchrun agents, workers, node stores) is a real process either way.
    How the ``baft`` process itself starts and exits (signals, exit codes) is tested in test_cancel.py
    and test_cli.py, through real processes."""
    from harness.cli import main

    if isinstance(scenario, dict):
        path = out.with_suffix(".yaml")
        path.write_text(yaml.safe_dump(scenario))
        scenario = path
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = main(["run", str(scenario), "--out", str(out), "--cache", str(cache)] + ([] if report else ["--no-report"]))
    verdict_path = out / "verdict.json"
    verdict = json.loads(verdict_path.read_text()) if verdict_path.is_file() else None
    return rc, buf.getvalue(), verdict


def delivered(run_dir: Path, node: int, ranks: list[int]) -> tuple[float, set[int]]:
    """When node ``node`` was lost (its ``node_loss`` fault) and the versions of which node's store had
    delivered every one of ``ranks``'s replicas to its peer before that: what a restore from memory can
    use. How far replication gets depends on the machine's load, so tests of node loss judge the
    restore against this rather than a fixed number of steps."""
    from analysis.journal import Journal, read_events

    (lost,) = [e["t"] for e in Journal.load(run_dir).events("fault") if e.get("fault") == "node_loss"]
    sent = [e for e in read_events(run_dir / "journal" / f"store-node{node}.jsonl")
            if e["event"] == "replicated" and e["t"] < lost]
    return lost, set.intersection(*({e["version"] for e in sent if e["rank"] == r} for r in ranks))


def kill_pair(name: str = "kill-rank0-step12") -> tuple[dict[str, Any], dict[str, Any]]:
    """A passing scenario and its negative control (the RNG left out of the checkpoint), sharing one
    reference: what the suite and the pytest plugin tests judge, and the spine's ``rng`` control."""
    good: dict[str, Any] = {
        "name": name,
        "workload": {"model": "gpt-tiny", "stages": 2, "steps": 20},
        "checkpoint": {"strategy": "sync", "every": 5},
        "faults": [{"kill": {"rank": 0, "at_step": 12}}],
        "expect": {"bitwise": True, "max_lost_steps": 5},
    }
    bad = {**good, "name": "kill-without-rng", "workload": {**good["workload"], "omit": ["rng"]}}
    return good, bad


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that shapes links (``netns``) runs alone too: ``serial`` (tests/run.py runs those after the parallel
    part, in one process). Every other serial test says so with its own marker."""
    for item in items:
        if item.get_closest_marker("netns"):
            item.add_marker(pytest.mark.serial)


def shm_semaphores() -> set[str]:
    """The names of multiprocessing's POSIX semaphores in /dev/shm now."""
    return {n for n in os.listdir("/dev/shm") if n.startswith("sem.mp-")}


def unlink_unmapped_semaphores(names: set[str]) -> list[str]:
    """Remove those of ``names`` that no live process has mapped (a semaphore in use is mapped by every
    process that opened it); the names removed. Matched by inode, not by name: the process that creates a
    semaphore maps a temporary file that glibc then links to the name and unlinks, so its maps show the
    temporary name (deleted); matching names removed a live run's fresh semaphores from under it (a reference
    run of another test failed on its workers' start, FileNotFoundError, in a fresh-clone CI run)."""
    inodes: dict[int, str] = {}
    for n in names:
        with contextlib.suppress(FileNotFoundError):
            inodes[os.stat(os.path.join("/dev/shm", n)).st_ino] = n
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            lines = maps.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(None, 5)
            if len(fields) == 6 and "/dev/shm/" in fields[5] and int(fields[4]) in inodes:
                mapped.add(inodes[int(fields[4])])
    gone = sorted(set(inodes.values()) - mapped)
    for n in gone:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join("/dev/shm", n))
    return gone
