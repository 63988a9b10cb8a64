"""Run a scenario's faults against a training job on a live cluster (``baft run --target k8s``).

Locally the harness launches the job and its injectors fire inside the workers. On a
cluster the job is already running (a PyTorchJob, a JobSet, the StatefulSet of
``baft deploy``) and Chaos Mesh injects the faults; this module is the nemesis in
between. It follows the job's progress from the journal the ranks write to a shared
volume (``--job-dir``: the same ``journal/rank-*/events.jsonl`` as a local run) or from the
job's W&B run (``--wandb-run``, :mod:`harness.cluster.wandbprogress`), and when
a fault's trigger comes due it creates the fault's Chaos Mesh objects, waits until Chaos
Mesh reports every target injected, and deletes them when the fault is over — a window
at its end step or after its duration, a point fault (a pod kill) as soon as it is
injected, a hang after its pod-failure duration — then waits until Chaos Mesh has
recovered them (the object is gone once its finalizer ran). Whatever happens, also on
Ctrl-C, every object still in place is deleted on the way out.

What it journals, in ``OUT/faulted/journal/launcher.jsonl`` (the file the local launcher
writes, so analysis reads both the same way): ``cluster_start``, a ``fault`` event per
firing with the step it was due at and the step the job had reached once the fault was
confirmed (the difference is the injection latency, in steps), the ``chaos_*`` events of
:class:`~injectors.chaosmesh.client.ChaosClient`, and ``fault_rollback``. At the end the job's
journal is copied next to it, so ``OUT/faulted`` is a run directory like a local one, and
with ``--reference`` (the journal of an uninterrupted run of the same job) the usual
verdict and report are written.

Limits, said plainly: triggers fire at step boundaries read from the journal, so a fault
lands a poll interval plus Chaos Mesh's injection time after its step (both journaled);
phases inside an iteration cannot be targeted; time triggers count from the job's first
``start`` event. Nothing here has run against a real API server: the client path is tested
against a local stand-in (see docs/clusters.md).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.journal import Journal, JournalWriter, launcher_journal, read_events
from analysis.verdict import ChaosFiring, ClusterFacts, Verdict, WallSeconds, judge
from harness.cluster.config import ClusterConfig
from harness.errors import HarnessError
from harness.run.progress import JournalProgress, Progress
from harness.scenario import Scenario
from injectors.chaosmesh.client import Cancelled
from injectors.chaosmesh.formats import parse_go_duration
from injectors.chaosmesh.manifests import ClusterTarget, Crds, Unmappable, manifests, validate
from injectors.trigger import PointFault, WindowFault
from injectors.worker import describe


class ClusterRunError(HarnessError):
    """The run on the cluster could not go on (the job never started, a selector matches no pod, a timeout)."""


@dataclass(kw_only=True, slots=True)
class Firing:
    """One occurrence of one fault: its objects and when it starts and ends."""

    fault_id: int
    kind: str
    config: Any
    occurrence: int
    objects: list[dict[str, Any]]
    at_step: int | None = None
    """Due once the job has done this many steps."""
    at_time: float | None = None
    """Due this many seconds after the job's first worker started."""
    hold: float = 0.0
    """Point faults: seconds to keep the objects before deleting (a pod-failure's duration)."""
    began: float | None = None
    """Elapsed seconds when Chaos Mesh confirmed it (set by its thread)."""
    end: threading.Event = field(default_factory=threading.Event)
    """Set by the run when the fault is over (or the run stops): its thread deletes the objects."""
    cancel: threading.Event = field(default_factory=threading.Event)
    """Set when the run stops: a thread still waiting for injection gives up (and deletes)."""
    reason: str = ""
    """Why it ended: ``window ended``, ``fault done``, ``run ended``."""
    end_step: int = 0
    """The job's step when it was ended."""
    thread: threading.Thread | None = None

    def due(self, step: int, elapsed: float) -> bool:
        if isinstance(self.config, WindowFault):
            return self.config.starts(step, elapsed)
        return (self.at_step is not None and step >= self.at_step) or \
            (self.at_time is not None and elapsed >= self.at_time)

    def passed(self, step: int, elapsed: float) -> bool:
        """A window that opened and closed between two reads of the journal: too late to inject."""
        return isinstance(self.config, WindowFault) and self.config.ended(step, elapsed, None)

    @property
    def due_step(self) -> int | None:
        """The step the scenario asks for (None: a time trigger)."""
        return self.config.from_step if isinstance(self.config, WindowFault) else self.at_step

    def over(self, step: int, elapsed: float) -> bool:
        if self.began is None:
            return False
        if isinstance(self.config, WindowFault):
            return self.config.ended(step, elapsed, self.began)
        return elapsed >= self.began + self.hold

    def label(self) -> str:
        return f"faults[{self.fault_id}] ({self.kind}" + (f", occurrence {self.occurrence})" if self.occurrence else ")")


def plan(scenario: Scenario, target: ClusterTarget, run_id: str, crds: Crds | None) -> list[Firing]:
    """Every firing of the scenario's faults, its objects built and validated against ``crds``; raises before
    anything runs (``crds`` None: built only, for a caller that validates them later against the cluster's).

    :class:`~injectors.chaosmesh.manifests.Unmappable` for a fault Chaos Mesh cannot express or a trigger
    the cluster cannot honour (a phase inside an iteration), ``ManifestInvalid`` for an object
    the CRDs would refuse, ``CrdUnavailable`` for a CRD ``crds`` lacks.
    """
    out: list[Firing] = []
    for i, f in enumerate(scenario.faults):
        c = f.config
        if isinstance(c, PointFault):
            if c.phase != "iteration":
                raise Unmappable(f.kind, f"phase {c.phase!r}: on a cluster faults fire at step boundaries read from "
                                         "the journal (plus Chaos Mesh's injection time), never inside an iteration; "
                                         "use phase: iteration")
            steps = c.step_occurrences(scenario.workload.steps)
            times = c.time_occurrences()
            whens: list[tuple[int | None, float | None]] = [(s, None) for s in steps] + [(None, t) for t in times]
            for k, (at_step, at_time) in enumerate(whens):
                objects = manifests(f.kind, c, i, target, run_id, k if len(whens) > 1 else None)
                hold = max((parse_go_duration(o["spec"]["duration"]) for o in objects if "duration" in o["spec"]),
                           default=0.0)
                out.append(Firing(fault_id=i, kind=f.kind, config=c, occurrence=k, objects=objects,
                                  at_step=at_step, at_time=at_time, hold=hold))
        else:
            out.append(Firing(fault_id=i, kind=f.kind, config=c, occurrence=0,
                              objects=manifests(f.kind, c, i, target, run_id)))
    if crds is not None:
        for obj in (o for firing in out for o in firing.objects):
            validate(obj, crds)
    return out


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return dict((obj["spec"].get("selector") or {}).get("labelSelectors") or {})


def _selectors(obj: dict[str, Any]) -> list[dict[str, str]]:
    """The pod labels an object selects: its selector's, and its NetworkChaos target's."""
    target = (obj["spec"].get("target") or {}).get("selector") or {}
    return [_labels(obj)] + ([dict(target["labelSelectors"])] if target.get("labelSelectors") else [])


class ClusterRun:
    """One scenario against one job: follow the journal, fire, confirm, delete, journal."""

    def __init__(self, scenario: Scenario, client: Any, target: ClusterTarget, config: ClusterConfig, out: Path,
                 run_id: str) -> None:
        self.scenario, self.client, self.target, self.config = scenario, client, target, config
        self.out, self.run_id = out, run_id
        self.firings = plan(scenario, target, run_id, client.crds)  # the CRDs the cluster serves
        self.progress: Progress
        if config.wandb_run is not None:
            from harness.cluster.wandbprogress import WandbProgress

            self.progress = WandbProgress(config.wandb_run, base_url=config.wandb_base_url)
        else:
            assert config.job_dir is not None
            self.progress = JournalProgress(config.job_dir)
        self.errors: list[str] = []
        self.journal: JournalWriter | None = None
        self.job_ended = False
        """Set when the run stops because the job finished: a pending injection is then too late, not an error."""

    # --- journal ---------------------------------------------------------------------------------

    def _record(self, event: str, **fields: Any) -> None:
        assert self.journal is not None
        self.journal.write(event, sync=True, **fields)

    def _note(self, event: str, payload: dict[str, Any]) -> None:
        self._record(event, **payload)

    def _elapsed(self) -> float:
        return time.time() - (self.progress.started_at or time.time())

    # --- the run -----------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Follow the job to its end, firing every fault; return the facts for the summary.

        Each firing lives in its own thread (create, wait for injection, hold until told, delete,
        wait for recovery), so a slow injection never delays another fault's trigger; this thread
        only follows the journal and tells firings when they are due and when they are over. The
        occurrences of one fault go one after the other: the next starts only once the previous is
        deleted, and one whose step passed while the previous was still in place is skipped.
        """
        faulted = self.out / "faulted"
        faulted.mkdir(parents=True, exist_ok=True)
        self.journal = JournalWriter(launcher_journal(faulted))
        c = self.config
        self._record("cluster_start", run_id=self.run_id, namespace=self.target.namespace,
                     selector=self.target.selector, job_dir=str(c.job_dir) if c.job_dir else None,
                     progress=self.progress.where(), firings=len(self.firings))
        started: list[Firing] = []
        clean = False
        try:
            # Reach the API server (and the Role) before waiting for the job, so a wrong kubeconfig or a
            # missing permission fails now, not after the start timeout.
            self.client.matching_pods(self.target.namespace, self.target.selector)
            self._wait_for_job()
            self._check_selectors()
            deadline = time.monotonic() + c.timeout
            pending = list(self.firings)
            while True:
                step, elapsed = self._poll(), self._elapsed()
                for firing in started:
                    if not firing.end.is_set() and firing.over(step, elapsed):
                        self._end(firing, step, "window ended" if isinstance(firing.config, WindowFault)
                                  else "fault done")
                for firing in list(pending):
                    if not firing.due(step, elapsed) or self._busy(firing, started):
                        continue
                    pending.remove(firing)
                    later = next((f for f in pending if f.fault_id == firing.fault_id), None)
                    if later is not None and later.due(step, elapsed):
                        self._skip(firing, step, "the next occurrence was due too when this one could start")
                    elif firing.passed(step, elapsed):
                        self._skip(firing, step, f"the window (from step {firing.due_step}) opened and closed between "
                                                 f"two reads of the journal; the job is at step {step}")
                    else:
                        started.append(firing)
                        firing.thread = threading.Thread(target=self._fire, args=(firing, step),
                                                         name=f"fault-{firing.fault_id}-{firing.occurrence}",
                                                         daemon=True)
                        firing.thread.start()
                if self.progress.done:
                    break
                if time.monotonic() > deadline:
                    self.errors.append(f"the job did not finish within {c.timeout:g} s (step {step})")
                    break
                time.sleep(c.poll)
            for firing in pending:
                self._skip(firing, self.progress.step, "the job ended before its trigger")
            clean = True
        finally:
            self._stop(started, clean)
        return {"step": self.progress.step, "done": self.progress.done, "errors": self.errors}

    def _poll(self) -> int:
        """The job's step; progress that cannot be read now (a volume or network hiccup) is retried, a few times."""
        for attempt in range(5):
            try:
                return self.progress.poll()
            except OSError as e:
                if attempt == 4:
                    raise ClusterRunError(f"cannot read {self.progress.where()}: {e}") from None
                self._record("progress_unreadable", error=str(e))
                time.sleep(self.config.poll)
        raise AssertionError("unreachable")

    def _busy(self, firing: Firing, started: list[Firing]) -> bool:
        """Whether an earlier occurrence of the same fault is still in place (or being removed)."""
        return any(f.fault_id == firing.fault_id and f.thread is not None and f.thread.is_alive() for f in started)

    def _skip(self, firing: Firing, step: int, reason: str) -> None:
        self._record("fault_skipped", id=firing.fault_id, fault=firing.kind, occurrence=firing.occurrence,
                     due_step=firing.due_step, step=step, reason=reason)

    def _stop(self, started: list[Firing], clean: bool) -> None:
        """End every firing still in place and wait for its thread; always runs, also on Ctrl-C.

        After a clean end (the job finished), windows close as usual (delete, then wait until Chaos
        Mesh recovered them) and injections still pending are called off as too late. After an
        error or Ctrl-C every thread is also cancelled, which skips the wait for recovery: the
        deletes are sent, the user gets control back.
        """
        try:
            step = self.progress.poll()
        except Exception:  # reading the progress is what failed: end with the last step read
            step = self.progress.step
        self.job_ended = clean
        for firing in started:
            if not clean or firing.began is None:
                firing.cancel.set()
            if not firing.end.is_set():
                self._end(firing, step, "run ended")
        c = self.config
        bound = c.inject_timeout + c.recover_timeout + 3 * self.client.request_timeout + 10
        try:
            for firing in started:
                assert firing.thread is not None
                firing.thread.join(bound)
                if firing.thread.is_alive():
                    names = ", ".join(o["metadata"]["name"] for o in firing.objects)
                    self.errors.append(f"{firing.label()}: still being rolled back after {bound:g} s; check that "
                                       f"{names} are gone from namespace {self.target.namespace!r}")
        except KeyboardInterrupt:
            self.errors.append("interrupted while rolling back: check that no object labelled baft.dev/run="
                               f"{self.run_id} is left in namespace {self.target.namespace!r}")
            raise
        finally:
            self._record("cluster_end", step=self.progress.step, finished=sorted(self.progress.finished),
                         world=self.progress.world, errors=list(self.errors))
            assert self.journal is not None
            self.journal.close()

    def _end(self, firing: Firing, step: int, reason: str) -> None:
        firing.reason, firing.end_step = reason, step
        firing.end.set()

    def _wait_for_job(self) -> None:
        deadline = time.monotonic() + self.config.start_timeout
        while True:
            self._poll()
            if self.progress.started_at is not None:
                return
            if time.monotonic() > deadline:
                if self.config.wandb_run is not None:
                    raise ClusterRunError(f"the {self.progress.where()} did not appear within "
                                          f"{self.config.start_timeout:g} s (does the job log to it? --wandb-run is "
                                          "ENTITY/PROJECT/RUN_ID, the id the job passes to wandb.init)")
                raise ClusterRunError(f"no worker of the job journaled a start within {self.config.start_timeout:g} s "
                                      f"in {self.progress.where()} (is --job-dir the job's run directory on the "
                                      "shared volume?)")
            time.sleep(self.config.poll)

    def _check_selectors(self) -> None:
        """Every selector (and NetworkChaos target) matches a running pod now: a wrong one is an error
        before anything is created, not a fault that silently hits nothing later."""
        seen: set[str] = set()
        for firing in self.firings:
            for obj in firing.objects:
                for labels in _selectors(obj):
                    key = json.dumps(labels, sort_keys=True)
                    if key in seen:
                        continue
                    seen.add(key)
                    if not self.client.matching_pods(self.target.namespace, labels):
                        raise ClusterRunError(f"{firing.label()}: no running pod in namespace "
                                              f"{self.target.namespace!r} has the labels {labels} (check --selector "
                                              "and --rank-label)")

    def _fire(self, firing: Firing, step: int) -> None:
        """One firing's life, in its own thread: inject, hold until ended, delete and wait for recovery."""
        c = self.config
        started = time.monotonic()
        try:
            # Counted now, not at the start: after a pod kill its replacement may still be on its way.
            expected = min(len(self.client.matching_pods(self.target.namespace, _labels(o))) for o in firing.objects)
            if expected == 0:
                raise ClusterRunError(f"no running pod matches {_labels(firing.objects[0])} at step {step}")
            with self.client.injected(firing.objects, c.inject_timeout, self._note, poll=c.poll,
                                      expected_pods=expected, recover_timeout=c.recover_timeout,
                                      cancel=firing.cancel):
                firing.began = self._elapsed()
                self._record("fault", **{**describe(firing.config), "phase": "iteration"}, fault=firing.kind,
                             id=firing.fault_id, occurrence=firing.occurrence, fatal=firing.config.fatal,
                             due_step=firing.due_step, step=step, injected_step=self.progress.step,
                             elapsed=round(firing.began, 4), inject_seconds=round(time.monotonic() - started, 3),
                             objects=[o["metadata"]["name"] for o in firing.objects])
                firing.end.wait()
        except Exception as e:  # the client deleted what it created
            if firing.began is None and self.job_ended and isinstance(e, Cancelled):
                self._skip(firing, step, "the job finished before Chaos Mesh confirmed the fault")
            elif firing.began is None:
                self.errors.append(f"{firing.label()}: {e}")
                self._record("fault_not_injected", id=firing.fault_id, fault=firing.kind,
                             occurrence=firing.occurrence, due_step=firing.due_step, step=step, error=str(e))
            else:
                self.errors.append(f"{firing.label()}: {e}")
        finally:
            if firing.began is not None:
                self._record("fault_rollback", fault=firing.kind, id=firing.fault_id, occurrence=firing.occurrence,
                             step=firing.end_step, reason=firing.reason)


def firings(launcher: list[dict[str, Any]]) -> list[ChaosFiring]:
    """What the harness did on the cluster, one entry per firing (``status``: injected, not injected,
    skipped): the step the scenario asked for, the step polled when it was fired, the step the job had
    reached once Chaos Mesh confirmed it, how long injecting and recovering took."""
    out = []
    status = {"fault": "injected", "fault_not_injected": "not injected", "fault_skipped": "skipped"}
    for e in [e for e in launcher if e["event"] in status]:
        key = (e.get("id"), e.get("occurrence"))
        names = set(e.get("objects") or [])
        rollback = next((r for r in launcher if r["event"] == "fault_rollback"
                         and (r.get("id"), r.get("occurrence")) == key), None)
        recovered = [r.get("waited_s") for r in launcher if r["event"] == "chaos_recovered" and r.get("name") in names]
        out.append(ChaosFiring(id=e.get("id"), fault=e.get("fault"), occurrence=e.get("occurrence"),
                               status=status[e["event"]], due_step=e.get("due_step"), step=e.get("step"),
                               injected_step=e.get("injected_step"), inject_seconds=e.get("inject_seconds"),
                               deleted_step=rollback.get("step") if rollback else None,
                               recover_seconds=max(r for r in recovered if r is not None) if any(r is not None for r in recovered) else None, objects=sorted(names),
                               why=e.get("error") or e.get("reason")))
    return sorted(out, key=lambda f: (f.id, f.occurrence))


def collect(job_dir: Path, faulted: Path) -> None:
    """Copy the job's journal next to the harness's, so ``faulted`` reads like a local run directory."""
    src = job_dir / "journal"
    for item in sorted(src.iterdir()) if src.is_dir() else []:
        dest = faulted / "journal" / item.name
        if item.name == launcher_journal(faulted).name:
            continue  # the harness's own file; a job's launcher journal (if any) stays on the volume
        if item.is_dir():
            shutil.copytree(item, dest, dirs_exist_ok=True)
        else:
            shutil.copy2(item, dest)


def run_on_cluster(scenario: Scenario, client: Any, target: ClusterTarget, config: ClusterConfig, out: Path,
                   run_id: str, reference: Path | None = None, report: bool = True) -> Verdict:
    """Drive the scenario's faults against the job, then judge it (with ``reference``) or summarise it.

    Returns the verdict, written to ``verdict.json``: with ``reference`` judged like a local run's;
    without one nothing is compared (``note`` says so) and it passed when every fault was injected
    and recovered and the job finished.
    """
    out.mkdir(parents=True, exist_ok=True)
    if scenario.source and Path(scenario.source).is_file():
        shutil.copyfile(scenario.source, out / "scenario.yaml")
    t0 = time.monotonic()
    facts = ClusterRun(scenario, client, target, config, out, run_id).run()
    faulted = out / "faulted"
    if config.job_dir is not None:
        collect(config.job_dir, faulted)
    failures = list(facts["errors"])
    if not facts["done"] and not failures:
        failures.append("the job did not finish")
    launcher = list(read_events(launcher_journal(faulted)))
    if reference is None:
        fired = {e.get("id") for e in launcher if e["event"] == "fault"}
        failures += [f"faults[{i}] never fired" for i in range(len(scenario.faults)) if i not in fired]
        verdict = Verdict(passed=not failures, failures=failures, note="no --reference: no bitwise or loss comparison was made")
    else:
        if config.job_dir is None:
            raise ClusterRunError("a verdict against --reference needs the job's journal: give --job-dir too")
        shutil.rmtree(out / "reference", ignore_errors=True)
        shutil.copytree(reference / "journal", out / "reference" / "journal")
        verdict = judge(Journal.load(out / "reference"), Journal.load(faulted), scenario.expect,
                        steps=scenario.workload.steps, faults_declared=len(scenario.faults), launch_failures=failures)
    verdict = dataclasses.replace(
        verdict, scenario=scenario.name, target="k8s",
        wall_seconds=WallSeconds(reference=None, reference_cached=False, faulted=time.monotonic() - t0),
        cluster=ClusterFacts(namespace=target.namespace, run_id=run_id,
                             job_dir=str(config.job_dir) if config.job_dir else None, wandb_run=config.wandb_run,
                             firings=firings(launcher)))
    verdict.write(out)
    if report and reference is not None:
        from analysis.report import run_report

        run_report(out)
    return verdict
