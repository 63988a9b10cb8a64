"""Following a job on a cluster through its W&B run: the real ``wandb`` client against a local stand-in of
the GraphQL queries it makes, and the real ``kubernetes`` client against the Chaos Mesh stand-in."""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from analysis.journal import launcher_journal, read_events
from harness.cli import main as cli_main
from harness.cluster.run import ClusterConfig, ClusterRunError, run_on_cluster
from harness.cluster.wandbprogress import WandbProgress, check_run_path
from harness.scenario import parse
from injectors.chaosmesh.client import ChaosClient
from tests.k8s_standin import StandIn
from tests.unit import test_cluster
from tests.unit.test_chaosmesh import needs_schema
from tests.wandb_standin import WandbStandIn

pytest.importorskip("wandb", reason="needs wandb (pip install 'baft-harness[wandb]')")
pytest.importorskip("kubernetes", reason="needs the kubernetes client (pip install 'baft-harness[k8s]')")
pytestmark = [pytest.mark.k8s, pytest.mark.timeout(90)]

RUN = "ent/llm/run-7"
TARGET = test_cluster.TARGET
WORKLOAD = {**test_cluster.WORKLOAD, "steps": 12}


@pytest.fixture(autouse=True)
def wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key for the stand-in, and wandb's own files kept under the test's directory."""
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    for var, sub in (("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data"),
                     ("WANDB_DIR", "dir")):
        monkeypatch.setenv(var, str(tmp_path / "wandb" / sub))
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)


@pytest.fixture
def wb() -> Iterator[WandbStandIn]:
    with WandbStandIn() as server:
        yield server


standin, client = test_cluster.standin, test_cluster.client  # the Chaos Mesh stand-in and the real client


class WandbJob:
    """A job logging one history row per ``period`` seconds to its W&B run, then finishing it; optionally
    dropping back (a restore) and logging the lost steps again, which W&B ignores below its last step."""

    def __init__(self, wb: WandbStandIn, steps: int, period: float = 0.08, delay: float = 0.0,
                 restore_at: int | None = None, after_first_query: bool = False) -> None:
        self.wb, self.steps, self.period, self.delay, self.restore_at = wb, steps, period, delay, restore_at
        self.after_first_query = after_first_query
        """Start only once the harness asks for the run: it is then following, however long its start-up
        took on a busy machine (else the job may finish before the harness looks)."""
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + 120
        while self.after_first_query and self.wb.queries == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(self.delay)
        self.wb.create(RUN, created_at=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()))
        step, restored = 0, False
        while step < self.steps:
            time.sleep(self.period)
            self.wb.log(RUN, step)
            if step == self.restore_at and not restored:
                restored, step = True, step - 3  # the job restores from three steps back
            step += 1
        self.wb.finish(RUN)

    def __enter__(self) -> WandbJob:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(10)


def scenario(faults: list[dict[str, Any]]) -> Any:
    return parse({"name": "wandb-follow", "workload": WORKLOAD, "checkpoint": {"strategy": "sync", "every": 2},
                  "faults": faults, "run": {"max_restarts": 8}, "expect": {"bitwise": True, "max_lost_steps": 2}},
                 "<test>", host=False)


# --- the progress itself ------------------------------------------------------------------------------

def test_progress_is_zero_until_the_run_exists_then_its_last_step_plus_one(wb: WandbStandIn) -> None:
    p = WandbProgress(RUN, base_url=wb.url)
    assert p.poll() == 0 and p.started_at is None and not p.done
    wb.create(RUN, created_at="2026-11-30T12:00:00")
    assert p.poll() == 0 and p.started_at == datetime(2026, 11, 30, 12, tzinfo=timezone.utc).timestamp() and p.state == "running"
    wb.log(RUN, 4)
    assert p.poll() == 5 and p.steps_seen == 1
    wb.finish(RUN, "crashed")
    assert p.poll() == 5 and not p.done  # torchrun may restart the workers: still followed
    wb.finish(RUN)
    p.poll()
    assert p.done and wb.queries >= 4


def test_progress_never_goes_back(wb: WandbStandIn) -> None:
    p = WandbProgress(RUN, base_url=wb.url)
    wb.create(RUN)
    wb.log(RUN, 9)
    assert p.poll() == 10
    wb.runs[RUN]["last_step"] = 3  # a server answering an older view (or a rewound run): the furthest stays
    assert p.poll() == 10


@pytest.mark.parametrize("path", ["run-7", "ent/run-7", "ent/llm/run 7", "ent//run", "a/b/c/d", ""])
def test_a_run_path_is_entity_project_id(path: str) -> None:
    with pytest.raises(ValueError, match="ENTITY/PROJECT/RUN_ID"):
        check_run_path(path)


def test_an_unreachable_server_is_an_os_error_naming_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends
    p = WandbProgress(RUN, base_url=f"http://127.0.0.1:{port}", timeout=2)
    with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
        p.poll()


def test_a_server_that_stops_answering_is_an_os_error_within_the_timeout_then_reads_again(wb: WandbStandIn) -> None:
    p = WandbProgress(RUN, base_url=wb.url, timeout=2)
    wb.create(RUN)
    wb.log(RUN, 2)
    assert p.poll() == 3
    answer = wb.answer

    def broken(query: dict[str, Any]) -> dict[str, Any]:
        if "run(name:" in (query.get("query") or ""):
            raise ConnectionAbortedError("the stand-in drops the request")  # no response: the client times out
        return answer(query)

    wb.answer = broken  # type: ignore[method-assign]
    began = time.monotonic()
    with pytest.raises(OSError, match=f"cannot read W&B run {RUN}"):
        p.poll()
    assert time.monotonic() - began < 10
    wb.answer = answer  # type: ignore[method-assign]
    wb.log(RUN, 5)
    assert p.poll() == 6


# --- a run on the cluster, steps from W&B ---------------------------------------------------------------

def _launcher(out: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_events(launcher_journal(out / "faulted")) if e["event"] == kind]


@needs_schema
def test_faults_fire_at_the_steps_the_wandb_run_reports(wb: WandbStandIn, standin: StandIn, client: ChaosClient,
                                                        tmp_path: Path) -> None:
    s = scenario([{"kill": {"rank": 1, "at_step": 4}},
                  {"throttle": {"link": [0, 1], "rate": "10mbit", "from_step": 6, "to_step": 9}}])
    cfg = ClusterConfig(wandb_run=RUN, wandb_base_url=wb.url, poll=0.02, inject_timeout=5, recover_timeout=5,
                        start_timeout=10)
    # 0.5 s a step, counted from the harness's first query: the kill's step and the window (steps 6-9) must
    # outlast a poll on a machine whose cores the other test workers keep busy. (This once passed delay=0.6,
    # a start-up delay, for the period: at the default 0.08 s a step a CI run saw the job reach step 11
    # before the harness's first read and fire nothing.)
    with WandbJob(wb, 12, period=0.5, restore_at=7, after_first_query=True):
        verdict = run_on_cluster(s, client, TARGET, cfg, tmp_path / "out", "r1", report=False)
    assert verdict.passed, verdict
    assert verdict.cluster is not None and verdict.cluster.wandb_run == RUN and verdict.cluster.job_dir is None
    fired = {e["id"]: e for e in _launcher(tmp_path / "out", "fault")}
    assert fired[0]["due_step"] == 4 and 4 <= fired[0]["step"] <= fired[0]["injected_step"]
    assert fired[1]["step"] >= 6
    rollback = {e["id"]: e for e in _launcher(tmp_path / "out", "fault_rollback")}
    assert rollback[1]["step"] >= 9 and rollback[1]["reason"] == "window ended"
    [start] = _launcher(tmp_path / "out", "cluster_start")
    assert start["progress"] == f"W&B run {RUN} on {wb.url}" and start["job_dir"] is None
    [end] = _launcher(tmp_path / "out", "cluster_end")
    assert end["step"] == 12 and end["errors"] == []
    assert standin.objects == {} and len(standin.deleted) == 2


@needs_schema
def test_a_run_that_never_appears_is_a_clear_error(wb: WandbStandIn, client: ChaosClient, tmp_path: Path) -> None:
    cfg = ClusterConfig(wandb_run=RUN, wandb_base_url=wb.url, poll=0.05, start_timeout=0.5)
    with pytest.raises(ClusterRunError, match=f"W&B run {RUN} .* did not appear within 0.5 s"):
        run_on_cluster(scenario([{"kill": {"rank": 1, "at_step": 4}}]), client, TARGET, cfg, tmp_path / "out",
                       "r1", report=False)
    assert wb.queries >= 2


def test_a_config_needs_a_journal_or_a_wandb_run() -> None:
    with pytest.raises(ValueError, match="job_dir"):
        ClusterConfig()
    with pytest.raises(ValueError, match="ENTITY/PROJECT/RUN_ID"):
        ClusterConfig(wandb_run="just-an-id")


# --- the CLI ------------------------------------------------------------------------------------------------

def _scenario_file(tmp_path: Path) -> Path:
    file = tmp_path / "s.yaml"
    file.write_text(yaml.safe_dump({"name": "cli-wandb", "workload": {**WORKLOAD, "steps": 8},
                                    "checkpoint": {"strategy": "sync", "every": 2},
                                    "faults": [{"kill": {"rank": 1, "at_step": 3}}],
                                    "expect": {"bitwise": True, "max_lost_steps": 2}}))
    return file


def _kubeconfig(tmp_path: Path, host: str) -> Path:
    file = tmp_path / "kubeconfig"
    file.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "standin",
        "clusters": [{"name": "standin", "cluster": {"server": host}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "u", "namespace": "train"}}]}))
    return file


K8S = ["--target", "k8s", "--namespace", "train", "--selector", "app=gpt", "--rank-label",
       "apps.kubernetes.io/pod-index"]


@needs_schema
def test_cli_follows_a_wandb_run_and_prints_each_firing(wb: WandbStandIn, standin: StandIn, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with WandbJob(wb, 8, period=0.15, after_first_query=True):
        rc = cli_main(["run", str(_scenario_file(tmp_path)), *K8S, "--kubeconfig", str(_kubeconfig(tmp_path, standin.host)),
                       "--wandb-run", RUN, "--wandb-base-url", wb.url, "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"following W&B run {RUN}" in out and "cli-wandb: PASSED (on the cluster; no --reference" in out
    assert "faults[0] kill: due step 3, fired at step" in out


@pytest.mark.parametrize("extra, message", [
    (["--wandb-run", "no-slashes"], "--wandb-run: expected ENTITY/PROJECT/RUN_ID"),
    (["--wandb-run", RUN, "--reference", "ref"], "--reference: expected --job-dir with it"),
])
def test_cli_refuses_a_bad_wandb_run_or_a_reference_without_the_journal(extra: list[str], message: str,
                                                                       tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["run", str(_scenario_file(tmp_path)), *K8S, *extra])
    assert rc == 2 and message in capsys.readouterr().err
