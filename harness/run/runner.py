"""Run a scenario: the cached reference, the faulted run, and the verdict.

Output directory layout::

    OUT/scenario.yaml        the scenario as given
    OUT/reference/journal/   the reference run's journal (copied from the cache)
    OUT/faulted/             journal/, logs/, checkpoints/, faults/ of the run under test
    OUT/verdict.json         the verdict (``analysis.verdict.Verdict``)

The reference is the same workload without faults or checkpoints. Its result
depends only on the workload config and the code that trains, so it is cached
under a hash of both and reused across scenarios.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from baft import CheckpointConfig
from baft.strategies.registry import TRAITS

from analysis.errors import AnalysisError
from analysis.journal import Journal, JournalWriter, launcher_journal, read_events
from analysis.report import run_report
from analysis.verdict import Verdict, WallSeconds, judge
from harness.errors import Cancelled, LaunchError
from harness.run.launcher import LaunchConfig, launch
from harness.run.leftovers import claim_shm
from harness.run.storefleet import StoreSpec
from harness.scenario import EXIT_TIMEOUT, RunConfig, Scenario
from harness.schema import to_plain
from harness.worker.spec import WorkerSpec, WorkloadConfig
from injectors.network import NetworkTopology
from injectors.storage import DiskFullConfig, mount_private, unmount_private

#: The code that determines a reference run's journal: all a worker runs (the worker room, the
#: checkpointing library, the spec's schema) and the journal writer; folders are hashed file by file.
_TRAINING_CODE = ("harness/worker", "baft", "harness/schema.py", "harness/errors.py", "analysis/journal.py")


def training_code(root: Path) -> list[Path]:
    """The files of :data:`_TRAINING_CODE`, in a stable order."""
    files: list[Path] = []
    for rel in _TRAINING_CODE:
        p = root / rel
        files.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p])
    return files


def default_cache_dir() -> Path:
    base = os.environ.get("BAFT_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "baft-harness")
    return Path(base)


def _reference_workload(workload: WorkloadConfig) -> WorkloadConfig:
    """The workload the reference runs: the same, without a planted bug (a mutant and ``omit`` live
    only in the faulted run: the reference never restores), and the built-in one on a single node: its training depends on the ranks, not
    on how they are spread over agents, so the reference of 4 ranks on 2 nodes is that of 4 ranks on
    one (one agent to start instead of two, and one cache entry for both). A user's script keeps its
    nodes: it may read ``LOCAL_RANK`` or ``LOCAL_WORLD_SIZE``."""
    if not workload.user_code:
        return dataclasses.replace(workload, mutant=None, omit=[], nodes=1)
    return dataclasses.replace(workload, mutant=None, omit=[])


def script_command(workload: WorkloadConfig, work_dir: Path | None = None) -> list[str] | None:
    """What torchrun runs for a script workload (None: the built-in one): a ``command`` through the boot
    module, ``{run_dir}`` in its arguments made ``work_dir``."""
    if workload.command is not None:
        script, *args = workload.command
        where = str(work_dir) if work_dir is not None else "."
        return ["-m", "harness.worker.boot", str(script), *(str(a).replace("{run_dir}", where) for a in args)]
    return [workload.script, *workload.args] if workload.script is not None else None


def work_dir(run_dir: Path, workload: WorkloadConfig) -> Path | None:
    """Where a ``command`` workload's workers run: the run's own directory for the script's files
    (its relative checkpoint paths), kept across restarts; None for other workloads."""
    if workload.command is None:
        return None
    path = (run_dir / "work").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_cwd(workload: WorkloadConfig, work_dir: Path | None) -> Path | None:
    """Where the workers run: ``workload.cwd`` when set, else the run's working directory."""
    return Path(workload.cwd) if workload.cwd is not None else work_dir


def reference_key(workload: WorkloadConfig, root: Path | None = None) -> str:
    """The cache key of ``workload``'s reference: its config, torch's version, the training code under
    ``root`` (this checkout by default) and the user's script."""
    root = root or Path(__file__).resolve().parents[2]
    h = hashlib.sha256(json.dumps(to_plain(_reference_workload(workload)), sort_keys=True).encode())
    h.update(importlib.metadata.version("torch").encode())  # the installed build, without importing it
    for f in training_code(root):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    if workload.script is not None or workload.command is not None:
        h.update(Path(str(workload.script or (workload.command or [""])[0])).read_bytes())
    return h.hexdigest()[:20]


@dataclass(kw_only=True, slots=True)
class Reference:
    run_dir: Path
    cached: bool
    seconds: float


def checks_reproducibility(workload: WorkloadConfig) -> bool:
    """Whether the reference runs twice (``workload.reproducible``; by default for a ``command``)."""
    return workload.reproducible if workload.reproducible is not None else workload.command is not None


def ensure_reference(workload: WorkloadConfig, cache: Path, timeout: float, copy: int = 0,
                     run: RunConfig | None = None) -> Reference:
    """The reference run of ``workload``, from the cache or run now.

    Safe to share between processes (pytest workers, two ``baft run``): a lock per key lets one of
    them run it while the others wait, and a reference appears only complete, by a rename, and
    is never removed once it is there (a reader may be copying it). ``copy`` 1: a second run of it,
    to tell whether the job is reproducible at all. ``run``: an unmodified script's reference runs with the
    scenario's watchdog (``hang_timeout``, ``startup_timeout``): a script that never takes a step is
    stopped and said to be."""
    final = cache / "reference" / (reference_key(workload) + (f"-{copy}" if copy else ""))
    if (final / "complete").is_file():
        return _cached(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.with_name(final.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also on a signal
        if (final / "complete").is_file():
            return _cached(final)  # another process ran it while this one waited
        tmp = final.with_name(final.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        spec = WorkerSpec(workload=_reference_workload(workload), checkpoint=CheckpointConfig(strategy="none"))
        try:
            wd = work_dir(tmp, workload)
            watched = run if run is not None and workload.command is not None else None
            result = launch(tmp, spec, LaunchConfig(nodes=spec.workload.nodes, world_size=workload.world_size,
                                                    max_restarts=0, timeout=timeout, script=script_command(workload, wd),
                                                    cwd=run_cwd(workload, wd), hang_timeout=(watched.hang_timeout or watched.startup_timeout)
                                                    if watched is not None else None,
                                                    startup_timeout=watched.startup_timeout if watched is not None else None,
                                                    exit_timeout=run.exit_timeout if run is not None else EXIT_TIMEOUT))
            if wd is not None:
                shutil.rmtree(wd, ignore_errors=True)  # the script's own checkpoints are not the reference's
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a reference cut short is never cached, nor left behind
            raise
        if not result.ok:
            cause = silence(tmp, run.startup_timeout if run is not None else 0.0) or failure_line(tmp / "logs")
            raise LaunchError(f"the reference run failed (exit codes {result.returncodes}, timed out: "
                              f"{result.timed_out}){': ' + cause if cause else ''}; logs in {tmp / 'logs'}")
        (tmp / "complete").write_text(f"{result.seconds:.3f}")
        shutil.rmtree(final, ignore_errors=True)  # an incomplete one (none is ever renamed there)
        os.replace(tmp, final)
    return Reference(run_dir=final, cached=False, seconds=result.seconds)


_EXCEPTION = re.compile(r"^(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b.*)$")


def silence(run_dir: Path, startup_timeout: float) -> str | None:
    """What the watchdog said of a run it stopped (None if it stopped nothing): no first step in time,
    or a hang later."""
    launcher = launcher_journal(run_dir)
    hangs = [e for e in read_events(launcher) if e.get("event") == "hang_detected"] if launcher.is_file() else []
    if not hangs:
        return None
    try:
        stepped = bool(Journal.load(run_dir).events("step"))
    except AnalysisError:  # stopped before any rank journalled (still importing, on busy cores)
        stepped = False
    if not stepped:
        return (f"no optimizer step within {startup_timeout:g} s of the start (run.startup_timeout): the "
                "harness counts the steps of torch.optim optimizers, through their step hooks")
    return f"the job made no progress for {hangs[0].get('silent_seconds', 0):.0f} s (a hang; run.hang_timeout)"


def failure_line(logs: Path) -> str | None:
    """The last exception a worker printed in ``logs`` (``RuntimeError: ...``), torchrun's own report of
    the failed child left out; None if there is none."""
    found = None
    for log in sorted(logs.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            m = _EXCEPTION.match(line.strip())
            if m and "ChildFailedError" not in line:
                found = m.group(1)[:300]
    return found


def _cached(final: Path) -> Reference:
    return Reference(run_dir=final, cached=True, seconds=float((final / "complete").read_text() or 0))


def keep_copy(tier: Path) -> None:
    """Unmount the run's private checkpoint file system, keeping its files in the run directory."""
    saved = tier.with_name(tier.name + ".saved")
    shutil.rmtree(saved, ignore_errors=True)
    shutil.copytree(tier, saved, ignore=shutil.ignore_patterns(".baft-ballast"))
    unmount_private(tier)
    shutil.rmtree(tier, ignore_errors=True)
    os.replace(saved, tier)



def _gone_at_end(scenario: Scenario, faulted: Path) -> set[int]:
    """The nodes lost for good that no ``node_join`` brought back in this run (its launcher journal's
    ``node_join`` events: a join the scenario declares may not have happened)."""
    journal = launcher_journal(faulted)
    joined = {int(str(e["node"]).removeprefix("node")) for e in (read_events(journal) if journal.is_file() else [])
              if e.get("event") == "node_join"}
    return set(scenario.lost_nodes) - joined


def run_scenario(scenario: Scenario, out: Path, cache: Path | None = None, report: bool = True) -> Verdict:
    """Run reference and faulted run, write ``verdict.json`` (and, with ``report``, ``report.html``,
    ``report.md`` and the plots) into ``out``, return the verdict."""
    cache = cache or default_cache_dir()
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("reference", "reference-again", "faulted"):
        shutil.rmtree(out / sub, ignore_errors=True)
    if scenario.source and Path(scenario.source).is_file():
        shutil.copyfile(scenario.source, out / "scenario.yaml")
    try:
        ref = ensure_reference(scenario.workload, cache, scenario.run.timeout, run=scenario.run)
    except Cancelled as c:
        journal = JournalWriter(launcher_journal(out / "faulted"))
        journal.write("aborted", signal=c.name, during="reference")
        journal.close()
        raise
    shutil.copytree(ref.run_dir / "journal", out / "reference" / "journal")
    again = None
    if checks_reproducibility(scenario.workload):
        again = ensure_reference(scenario.workload, cache, scenario.run.timeout, copy=1, run=scenario.run)
        shutil.copytree(again.run_dir / "journal", out / "reference-again" / "journal")

    faulted = out / "faulted"
    # Shared-memory snapshots of this run only (node i under shm/node<i>); removed when it
    # ends, whatever happened. baft gets a store per node for replicas and restores.
    shm = claim_shm()  # names this process, so `baft cleanup` can tell it from a killed run's
    given = scenario.checkpoint.dir  # a URL (object store) is the user's; a directory goes into the run
    checkpoint = dataclasses.replace(scenario.checkpoint.with_baft(shm_dir=str(shm)),
                                     dir=given if "://" in given else str((faulted / "checkpoints").resolve()))
    stores = (StoreSpec(base=shm, replication=checkpoint.replication)
              if TRAITS[checkpoint.strategy].node_stores else None)
    spec = WorkerSpec(workload=scenario.workload, checkpoint=checkpoint, faults=scenario.faults, probe=scenario.probe,
                      reference=str((out / "reference").resolve()) if scenario.workload.command is not None else None)
    wd = work_dir(faulted, scenario.workload)
    private_tier = next((f.config for f in scenario.faults if isinstance(f.config, DiskFullConfig)), None)
    if private_tier is not None:
        mount_private(Path(checkpoint.dir), private_tier.size_mb)
    t0 = time.monotonic()
    stack = contextlib.ExitStack()
    try:
        topology = stack.enter_context(NetworkTopology(scenario.workload.nodes)) if scenario.uses_netns else None
        result = launch(faulted, spec, LaunchConfig(
            nodes=scenario.workload.nodes, world_size=scenario.workload.world_size,
            max_restarts=scenario.run.max_restarts, timeout=scenario.run.timeout, stores=stores,
            hang_timeout=scenario.run.hang_timeout, startup_timeout=scenario.run.startup_timeout, topology=topology, harness_faults=scenario.harness_faults(),
            min_nodes=scenario.workload.nodes - len(scenario.lost_nodes), last_call=scenario.run.last_call,
            script=script_command(scenario.workload, wd), cwd=run_cwd(scenario.workload, wd),
            exit_timeout=scenario.run.exit_timeout,
            preemptions=any(f.kind == "preempt" for f in scenario.faults),
            joins=any(f.kind == "node_join" for f in scenario.faults),
        ))
    finally:
        stack.close()  # namespaces, veths and bridge go, whatever happened
        shutil.rmtree(shm, ignore_errors=True)
        if private_tier is not None:
            keep_copy(Path(checkpoint.dir))
    # The agent of a node lost for good was killed on purpose, and one the harness ended after every rank
    # had finished (a teardown hang, in the verdict); the others must end well.
    survivors = [rc for node, rc in enumerate(result.returncodes)
                 if node not in _gone_at_end(scenario, faulted) and node not in result.ended_after_finish]
    launch_failures = ([f"torchrun agents exited {result.returncodes}" + (" (timed out)" if result.timed_out else "")
                        + (f"; the last exception a worker printed: {cause}" if (cause := failure_line(faulted / "logs"))
                           else "")]
                       if result.timed_out or any(rc != 0 for rc in survivors) else []) + result.errors
    verdict = judge(
        Journal.load(out / "reference"), Journal.load(faulted), scenario.expect,
        steps=scenario.workload.steps, faults_declared=len(scenario.faults), launch_failures=launch_failures,
        again=Journal.load(out / "reference-again") if again is not None else None,
    )
    verdict = dataclasses.replace(
        verdict, scenario=scenario.name, agents_returncodes=result.returncodes,
        wall_seconds=WallSeconds(reference=ref.seconds, reference_cached=ref.cached, faulted=time.monotonic() - t0))
    verdict.write(out)
    if report:
        run_report(out)
    return verdict

