"""A scenario driven against a job on a cluster: the real kubernetes client, the local stand-in API server,
and a job whose ranks append to their journals from a thread (the e2e test uses a real torchrun job)."""
from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from analysis.journal import Journal, JournalWriter, launcher_journal, rank_journal
from harness.cli import main as cli_main
from harness.cluster.run import ClusterConfig, ClusterRunError, plan, run_on_cluster
from harness.scenario import parse
from injectors.chaosmesh.client import ChaosClient
from injectors.chaosmesh.crds import CrdUnavailable
from injectors.chaosmesh.manifests import ClusterTarget, ManifestInvalid, Unmappable
from tests.crds import CRDS, needs_schema, stricter_podchaos
from tests.k8s_standin import CRD_PREFIX, StandIn, connected

kubernetes = pytest.importorskip("kubernetes", reason="needs the kubernetes client (pip install 'baft-harness[k8s]')")
pytestmark = [pytest.mark.k8s, needs_schema, pytest.mark.timeout(60)]

SELECTOR = {"app": "gpt"}
TARGET = ClusterTarget(namespace="train", selector=SELECTOR, rank_label="apps.kubernetes.io/pod-index")
PODS = [{"name": f"gpt-{i}", "labels": {"app": "gpt", "apps.kubernetes.io/pod-index": str(i)}} for i in range(2)]
WORKLOAD = {"model": "gpt-tiny", "stages": 2, "data_parallel": 1, "microbatches": 2, "schedule": "1f1b",
            "steps": 14, "seed": 0, "nodes": 2}


def scenario(faults: list[dict[str, Any]], steps: int = 14) -> Any:
    return parse({"name": "on-cluster", "workload": {**WORKLOAD, "steps": steps},
                  "checkpoint": {"strategy": "sync", "every": 2}, "faults": faults, "run": {"max_restarts": 8},
                  "expect": {"bitwise": True, "max_lost_steps": 2}}, "<test>", host=False)


class FakeJob:
    """Two ranks journaling ``start``, one ``step`` per ``period`` seconds, then ``finish``: the progress
    a job on the cluster writes to the shared volume (only the events the harness follows)."""

    def __init__(self, run_dir: Path, steps: int, period: float = 0.06, delay: float = 0.0, instant: int = 0) -> None:
        self.run_dir, self.steps, self.period, self.delay = run_dir, steps, period, delay
        self.instant = instant
        """The first steps are journaled at once with ``start`` (a burst the harness reads in one poll)."""
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        time.sleep(self.delay)
        writers = [JournalWriter(rank_journal(self.run_dir, r), rank=r, attempt=0) for r in range(2)]
        for w in writers:
            w.write("start", world_size=2)
        for step in range(self.steps):
            if step >= self.instant:
                time.sleep(self.period)
            for w in writers:
                w.write("step", step=step)
        for w in writers:
            w.write("finish", step=self.steps)
            w.close()

    def __enter__(self) -> FakeJob:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(10)


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandIn(inject_after_gets=1, recover_after_gets=2, pod_list=PODS) as server:
        yield server


@pytest.fixture
def client(standin: StandIn) -> Iterator[ChaosClient]:
    with connected(standin) as chaos:
        yield chaos


def config(job_dir: Path, **kw: Any) -> ClusterConfig:
    return ClusterConfig(**{"job_dir": job_dir, "poll": 0.02, "inject_timeout": 5, "recover_timeout": 5,
                            "start_timeout": 5, "timeout": 30, **kw})


def events(out: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in Journal.load(out / "faulted").launcher if e["event"] == kind]


# --- plan -------------------------------------------------------------------------------------------

def test_plan_gives_every_occurrence_its_own_object_and_holds_a_hang_for_its_duration() -> None:
    s = scenario([{"kill": {"rank": 1, "at_step": 3, "every": 4, "times": 3}}, {"hang": {"rank": 0, "at_step": 5}},
                  {"throttle": {"link": [0, 1], "rate": "10mbit", "from_step": 2, "to_step": 6}}])
    firings = plan(s, TARGET, "r1", CRDS)
    assert [(f.fault_id, f.occurrence, f.at_step) for f in firings] == [(0, 0, 3), (0, 1, 7), (0, 2, 11), (1, 0, 5),
                                                                         (2, 0, None)]
    assert len({f.objects[0]["metadata"]["name"] for f in firings}) == 5
    assert firings[0].hold == 0 and firings[3].hold == 600  # pod-failure lasts the target's hang_duration (10m)


def test_a_phase_inside_an_iteration_cannot_be_targeted_on_a_cluster() -> None:
    s = scenario([{"kill": {"rank": 1, "at_step": 4, "phase": "backward"}}])
    with pytest.raises(Unmappable, match="phase 'backward'"):
        plan(s, TARGET, "r1", CRDS)


def test_a_window_is_due_from_its_start_and_over_at_its_end() -> None:
    [f] = plan(scenario([{"throttle": {"link": [0, 1], "rate": "10mbit", "from_step": 2, "to_step": 6}}]),
               TARGET, "r1", CRDS)
    assert not f.due(1, 0.0) and f.due(2, 0.0)
    f.began = 1.0
    assert not f.over(5, 9.0) and f.over(6, 1.5)


# --- runs against the stand-in -----------------------------------------------------------------------

def test_faults_fire_at_their_steps_are_confirmed_deleted_and_recovered(standin: StandIn, client: ChaosClient,
                                                                        tmp_path: Path) -> None:
    s = scenario([{"kill": {"rank": 1, "at_step": 4}},
                  {"throttle": {"link": [0, 1], "rate": "10mbit", "from_step": 3, "to_step": 8}}])
    job = tmp_path / "job"
    with FakeJob(job, 14):
        verdict = run_on_cluster(s, client, TARGET, config(job), tmp_path / "out", "r1", report=False)
    assert verdict.passed, verdict
    fired = {e["id"]: e for e in events(tmp_path / "out", "fault")}
    assert fired[0]["step"] >= 4 and fired[0]["injected_step"] >= fired[0]["step"]
    assert fired[1]["step"] >= 3 and fired[0]["objects"] and fired[0]["fatal"]
    rollbacks = {e["id"]: e for e in events(tmp_path / "out", "fault_rollback")}
    assert rollbacks[1]["step"] >= 8 and rollbacks[1]["reason"] == "window ended"
    assert rollbacks[0]["reason"] == "fault done"
    assert standin.objects == {} and len(standin.deleted) == 2  # both deleted, both gone
    assert {e["name"] for e in events(tmp_path / "out", "chaos_recovered")} == \
        {n for f in fired.values() for n in f["objects"]}
    # The rank pod of rank 1 is pod index 1; the link's two ends are pods 0 and 1.
    kinds = {b["kind"]: b for b in standin.created}
    assert kinds["PodChaos"]["spec"]["selector"]["labelSelectors"]["apps.kubernetes.io/pod-index"] == "1"
    # The job's journal was collected: the faulted run directory reads like a local one.
    assert sorted(Journal.load(tmp_path / "out" / "faulted").ranks) == [0, 1]
    assert verdict.cluster is not None and [f.status for f in verdict.cluster.firings] == ["injected", "injected"]


@pytest.mark.parametrize("change, error, says", [
    (lambda s: setattr(s, "pod_list", PODS[:1]), ClusterRunError, "no running pod in namespace 'train'"),  # no index 1
    # the cluster's own schema is the one applied, here stricter than the CRD files
    (lambda s: s.crds.__setitem__("podchaos.chaos-mesh.org", stricter_podchaos("pod-kill")), ManifestInvalid,
     re.escape("$.spec.action: 'pod-kill'")),
    (lambda s: setattr(s, "forbid_crds", True), CrdUnavailable, "reading CustomResourceDefinition podchaos.chaos-mesh"
     ".org failed: HTTP 403: .* is forbidden.*the ClusterRole of baft deploy --harness"),
], ids=["selector-matches-no-pod", "cluster-schema-refuses", "crds-forbidden"])
def test_what_the_cluster_refuses_fails_before_anything_is_created(standin: StandIn, client: ChaosClient,
                                                                  tmp_path: Path, change: Any, error: type[Exception],
                                                                  says: str) -> None:
    change(standin)
    with FakeJob(tmp_path / "job", 6), pytest.raises(error, match=says):
        run_on_cluster(scenario([{"kill": {"rank": 1, "at_step": 2}}]), client, TARGET, config(tmp_path / "job"),
                       tmp_path / "out", "r1", report=False)
    assert standin.created == []


def test_a_fault_that_never_injects_is_deleted_and_fails_the_run(standin: StandIn, client: ChaosClient,
                                                                  tmp_path: Path) -> None:
    standin.never_inject = True
    with FakeJob(tmp_path / "job", 30):
        verdict = run_on_cluster(scenario([{"kill": {"rank": 1, "at_step": 2}}], steps=30), client, TARGET,
                                 config(tmp_path / "job", inject_timeout=0.3), tmp_path / "out", "r1", report=False)
    assert not verdict.passed
    assert any("was not injected" in f for f in verdict.failures)
    assert any("never fired" in f for f in verdict.failures)
    assert standin.objects == {} and len(standin.deleted) == 1
    assert events(tmp_path / "out", "fault") == [] and len(events(tmp_path / "out", "fault_not_injected")) == 1


def test_a_fault_whose_step_never_comes_is_reported(standin: StandIn, client: ChaosClient, tmp_path: Path) -> None:
    with FakeJob(tmp_path / "job", 5):  # the job stops at step 5; the scenario says 14 steps
        verdict = run_on_cluster(scenario([{"kill": {"rank": 1, "at_step": 9}}]), client, TARGET,
                                 config(tmp_path / "job"), tmp_path / "out", "r1", report=False)
    assert not verdict.passed and "faults[0] never fired" in verdict.failures
    assert standin.created == [] and len(events(tmp_path / "out", "fault_skipped")) == 1


def test_a_fault_chaos_mesh_never_recovers_is_an_error(standin: StandIn, client: ChaosClient, tmp_path: Path) -> None:
    standin.recover_after_gets = 10**6
    with FakeJob(tmp_path / "job", 8):
        verdict = run_on_cluster(scenario([{"kill": {"rank": 0, "at_step": 2}}], steps=8), client, TARGET,
                                 config(tmp_path / "job", recover_timeout=0.3), tmp_path / "out", "r1", report=False)
    assert not verdict.passed and any("still there" in f for f in verdict.failures)
    assert len(events(tmp_path / "out", "chaos_not_recovered")) == 1


@pytest.mark.parametrize("injected", [True, False])
def test_ctrl_c_deletes_every_object_in_place(injected: bool, standin: StandIn, client: ChaosClient, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in the harness's loop while a window is open, or while Chaos Mesh is still injecting it."""
    import sys

    import harness.cluster.run as cluster

    real_sleep = time.sleep
    standin.inject_after_gets = 1 if injected else 10**6

    def sleep(seconds: float) -> None:
        served = any(n > standin.inject_after_gets for n in standin.gets.values())
        if standin.objects and served == injected and sys._getframe(1).f_code.co_name == "run":
            raise KeyboardInterrupt
        real_sleep(seconds)

    monkeypatch.setattr(cluster.time, "sleep", sleep)
    s = scenario([{"throttle": {"link": [0, 1], "rate": "10mbit", "from_step": 2}}])
    with FakeJob(tmp_path / "job", 14), pytest.raises(KeyboardInterrupt):
        run_on_cluster(s, client, TARGET, config(tmp_path / "job"), tmp_path / "out", "r1", report=False)
    monkeypatch.undo()
    assert len(standin.deleted) == 1
    journal = _launcher(tmp_path / "out")
    events = [e["event"] for e in journal]
    assert "chaos_deleted" in events and ("fault" in events) == injected
    rollbacks = [e for e in journal if e["event"] == "fault_rollback"]
    assert [e["reason"] for e in rollbacks] == (["run ended"] if injected else [])


def _launcher(out: Path) -> list[dict[str, Any]]:
    from analysis.journal import read_events

    return list(read_events(launcher_journal(out / "faulted")))


# --- the CRDs come from the cluster ---------------------------------------------------------------------

def test_each_crd_is_read_from_the_cluster_once_and_only_those_needed(standin: StandIn, client: ChaosClient,
                                                                        tmp_path: Path) -> None:
    s = scenario([{"kill": {"rank": 1, "at_step": 2, "every": 3, "times": 3}},
                  {"throttle": {"link": [0, 1], "rate": "10mbit", "from_step": 3, "to_step": 5}}])
    with FakeJob(tmp_path / "job", 14):
        assert run_on_cluster(s, client, TARGET, config(tmp_path / "job"), tmp_path / "out", "r1",
                              report=False).passed
    reads = [p[len(CRD_PREFIX):] for m, p in standin.requests if p.startswith(CRD_PREFIX)]
    assert sorted(reads) == ["networkchaos.chaos-mesh.org", "podchaos.chaos-mesh.org"]
    assert client.crds.where == f"the cluster at {standin.host}"


def test_a_cluster_lacking_one_crd_fails_naming_it_before_anything_is_created(standin: StandIn, client: ChaosClient,
                                                                              tmp_path: Path) -> None:
    del standin.crds["networkchaos.chaos-mesh.org"]
    s = scenario([{"kill": {"rank": 1, "at_step": 2}},
                  {"throttle": {"link": [0, 1], "rate": "10mbit", "from_step": 3, "to_step": 5}}])
    with FakeJob(tmp_path / "job", 6), pytest.raises(CrdUnavailable) as info:
        run_on_cluster(s, client, TARGET, config(tmp_path / "job"), tmp_path / "out", "r1", report=False)
    assert info.value.name == "networkchaos.chaos-mesh.org"
    assert "the cluster has no CustomResourceDefinition networkchaos.chaos-mesh.org" in str(info.value)
    assert "helm install chaos-mesh" in str(info.value)
    assert standin.created == [] and not (tmp_path / "out" / "faulted").exists()


def test_the_job_never_starting_is_a_clear_error(client: ChaosClient, tmp_path: Path) -> None:
    with pytest.raises(ClusterRunError, match="no worker of the job journaled a start"):
        run_on_cluster(scenario([{"kill": {"rank": 1, "at_step": 2}}]), client, TARGET,
                       ClusterConfig(job_dir=tmp_path / "nothing", start_timeout=0.2, poll=0.05),
                       tmp_path / "out", "r1", report=False)


# --- the CLI ------------------------------------------------------------------------------------------

def cli_run(standin: StandIn, tmp_path: Path, steps: int = 10) -> int:
    """``baft run`` of a one-kill scenario against ``standin`` through a kubeconfig, a job of ``steps`` steps."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "standin",
        "clusters": [{"name": "standin", "cluster": {"server": standin.host}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "u", "namespace": "train"}}]}))
    file = tmp_path / "s.yaml"
    file.write_text(yaml.safe_dump({"name": "cli", "workload": {**WORKLOAD, "steps": steps},
                                    "checkpoint": {"strategy": "sync", "every": 2},
                                    "faults": [{"kill": {"rank": 1, "at_step": 3}}],
                                    "expect": {"bitwise": True, "max_lost_steps": 2}}))
    with FakeJob(tmp_path / "job", steps, period=0.15):
        return cli_main(["run", str(file), "--target", "k8s", "--kubeconfig", str(kubeconfig), "--namespace", "train",
                         "--selector", "app=gpt", "--rank-label", "apps.kubernetes.io/pod-index",
                         "--job-dir", str(tmp_path / "job"), "--out", str(tmp_path / "out")])


def test_cli_runs_against_a_kubeconfig_and_prints_each_firing(standin: StandIn, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_run(standin, tmp_path)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "cli: PASSED (on the cluster; no --reference" in out
    assert "faults[0] kill: due step 3, fired at step" in out and "injected by step" in out
    assert standin.objects == {} and [m for m, _ in standin.requests].count("POST") == 1
    assert ("GET", f"{CRD_PREFIX}podchaos.chaos-mesh.org") in standin.requests  # validated against the cluster's


def test_cli_on_a_cluster_without_chaos_mesh_exits_2_in_one_line(standin: StandIn, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    standin.crds.clear()
    assert cli_run(standin, tmp_path, steps=4) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in out + err
    assert err.startswith("baft: error: the cluster has no CustomResourceDefinition podchaos.chaos-mesh.org: "
                          "Chaos Mesh is not installed there; install Chaos Mesh v2.8.0 (helm install chaos-mesh")
    assert standin.created == []


def test_cli_without_job_dir_says_what_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parents[2]
    rc = cli_main(["run", str(root / "scenarios" / "smoke" / "kill-rank.yaml"), "--target", "k8s",
                   "--namespace", "train", "--selector", "app=gpt"])
    assert rc == 2 and "needs --job-dir" in capsys.readouterr().err


# --- timing at the edges (fast steps, slow polls) -------------------------------------------------------

def _creates_and_deletes(out: Path) -> list[str]:
    return [e["event"] for e in _launcher(out) if e["event"] in ("chaos_created", "chaos_deleted")]


def test_occurrences_of_one_fault_never_overlap(standin: StandIn, client: ChaosClient, tmp_path: Path) -> None:
    s = scenario([{"kill": {"rank": 1, "at_step": 2, "every": 2, "times": 5}}], steps=40)
    with FakeJob(tmp_path / "job", 40, period=0.03):
        run_on_cluster(s, client, TARGET, config(tmp_path / "job", poll=0.15), tmp_path / "out", "r1", report=False)
    seq = _creates_and_deletes(tmp_path / "out")
    assert seq and seq == ["chaos_created", "chaos_deleted"] * (len(seq) // 2)  # one at a time
    fired = len(events(tmp_path / "out", "fault"))
    skipped = events(tmp_path / "out", "fault_skipped")
    assert fired >= 1 and fired + len(skipped) == 5 and len(standin.created) == fired
    assert all("due too" in e["reason"] for e in skipped)


def test_a_window_that_passed_between_two_polls_is_skipped_not_injected_late(standin: StandIn, client: ChaosClient,
                                                                            tmp_path: Path) -> None:
    s = scenario([{"throttle": {"link": [0, 1], "rate": "10mbit", "from_step": 3, "to_step": 4}}], steps=20)
    with FakeJob(tmp_path / "job", 20, instant=10):  # steps 0-9 land together: the window 3-4 is never seen open
        verdict = run_on_cluster(s, client, TARGET, config(tmp_path / "job"), tmp_path / "out", "r1", report=False)
    [skip] = events(tmp_path / "out", "fault_skipped")
    assert "opened and closed between two reads" in skip["reason"] and skip["due_step"] == 3
    assert standin.created == [] and "faults[0] never fired" in verdict.failures


def test_a_fault_the_job_outran_is_skipped_not_an_error(standin: StandIn, client: ChaosClient, tmp_path: Path) -> None:
    standin.inject_after_gets = 10**6  # Chaos Mesh is slower than the rest of the job
    with FakeJob(tmp_path / "job", 8, period=0.05):
        verdict = run_on_cluster(scenario([{"kill": {"rank": 1, "at_step": 6}}], steps=8), client, TARGET,
                                 config(tmp_path / "job"), tmp_path / "out", "r1", report=False)
    [skip] = events(tmp_path / "out", "fault_skipped")
    assert "finished before Chaos Mesh confirmed" in skip["reason"]
    assert verdict.failures == ["faults[0] never fired"]
    assert [k[2] for k in standin.deleted] == [standin.created[0]["metadata"]["name"]]  # the object was deleted


def test_progress_skips_a_damaged_line_and_a_restarted_rank_is_not_finished(tmp_path: Path) -> None:
    from harness.run.progress import JournalProgress

    w = JournalWriter(rank_journal(tmp_path, 0), rank=0, attempt=0)
    w.write("start", world_size=1)
    w.write("step", step=0)
    w.close()
    with open(rank_journal(tmp_path, 0), "a") as f:
        f.write('{"t":1,"event":"step","rank":0,"step":\n')  # torn by a crash
    w = JournalWriter(rank_journal(tmp_path, 0), rank=0, attempt=0)
    w.write("step", step=1)
    w.write("finish", step=2)
    p = JournalProgress(tmp_path)
    assert p.poll() == 2 and p.done
    assert p.finished_at[0] > 0
    w.write("start", world_size=1, pid=4321)  # killed after finishing, restarted: running again
    w.close()
    p.poll()
    assert not p.done and p.pids == {0: 4321}  # the worker the exit deadline would end


def test_cli_with_a_kubeconfig_that_is_a_directory_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parents[2]
    rc = cli_main(["run", str(root / "scenarios" / "smoke" / "kill-rank.yaml"), "--target", "k8s", "--namespace",
                   "train", "--selector", "app=gpt", "--job-dir", str(tmp_path), "--kubeconfig", str(tmp_path),
                   "--out", str(tmp_path / "out")])
    assert rc == 2 and "no usable kubeconfig" in capsys.readouterr().err
