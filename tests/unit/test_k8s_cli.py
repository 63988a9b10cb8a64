"""``baft run --target k8s --dry-run``: the scenario's faults as validated Chaos Mesh YAML, no cluster touched."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.cli import main as cli_main
from injectors.chaosmesh.crds import CRDS_ENV
from tests.crds import CRDS, SHARED_CRDS, needs_schema, shared_documents, stricter_podchaos, write_crds

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.k8s
#: Without a cluster the CRDs are given; the tests give the shared folder explicitly.
CRDS_ARGS = ["--crds", str(SHARED_CRDS)]


@needs_schema
def test_dry_run_prints_appliable_documents(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["run", str(ROOT / "scenarios" / "ci" / "storage-disk-full.yaml"), "--target", "k8s", "--dry-run",
                   *CRDS_ARGS, "--namespace", "train", "--selector", "app=gpt,team=ml"])
    out = capsys.readouterr().out
    assert rc == 0
    docs = list(yaml.safe_load_all(out))
    assert {d["kind"] for d in docs} == {"PodChaos", "IOChaos"}
    for d in docs:
        assert d["apiVersion"] == "chaos-mesh.org/v1alpha1" and d["metadata"]["namespace"] == "train"
        assert d["spec"]["selector"]["labelSelectors"]["team"] == "ml"


@needs_schema
@pytest.mark.parametrize("argv, message", [
    (["--namespace", "train"], "needs --namespace and --selector"),
    (["--namespace", "train", "--selector", "nokeyvalue"], "--selector"),
    (["--namespace", "Bad_NS", "--selector", "a=b"], "namespace"),
])
def test_dry_run_bad_input_exits_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["run", str(ROOT / "scenarios" / "smoke" / "kill-rank.yaml"), "--target", "k8s", "--dry-run",
                 *CRDS_ARGS, *argv])
    assert rc == 2 and message in capsys.readouterr().err


@needs_schema
def test_a_fault_chaos_mesh_cannot_express_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["run", str(ROOT / "scenarios" / "ci" / "jitter-drift.yaml"), "--target", "k8s", "--dry-run",
                   *CRDS_ARGS, "--namespace", "train", "--selector", "app=gpt"])
    assert rc == 2 and "cannot run on a cluster" in capsys.readouterr().err


@needs_schema
def test_workflow_prints_one_validated_workflow_for_time_triggers(capsys: pytest.CaptureFixture[str]) -> None:
    from injectors.chaosmesh.manifests import validate

    rc = cli_main(["run", str(ROOT / "examples" / "k8s" / "timed-sequence.yaml"), "--target", "k8s", "--dry-run",
                   "--workflow", *CRDS_ARGS, "--namespace", "train", "--selector", "app=gpt"])
    out = capsys.readouterr().out
    assert rc == 0
    [wf] = list(yaml.safe_load_all(out))
    validate(wf, CRDS)
    kinds = {t["templateType"] for t in wf["spec"]["templates"]}
    assert {"Parallel", "Serial", "Suspend", "TimeChaos", "NetworkChaos", "PodChaos"} <= kinds
    # Three kills, 300 s apart from 300 s: three branches waiting 300, 600 and 900 s.
    waits = sorted(t["deadline"] for t in wf["spec"]["templates"] if t["name"].startswith("f2-") and
                   t["templateType"] == "Suspend")
    assert waits == ["300s", "600s", "900s"]


@needs_schema
@pytest.mark.parametrize("argv, message", [
    (["--dry-run", "--workflow", *CRDS_ARGS], "cluster's clock"),  # kill-rank.yaml triggers at a step
    (["--workflow", "--job-dir", "/tmp"], "--dry-run with it"),
])
def test_workflow_refusals_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["run", str(ROOT / "scenarios" / "smoke" / "kill-rank.yaml"), "--target", "k8s",
                   "--namespace", "train", "--selector", "app=gpt", *argv])
    assert rc == 2 and message in capsys.readouterr().err


@needs_schema
def test_clock_skew_is_refused_locally_but_maps_on_a_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    scenario = str(ROOT / "examples" / "k8s" / "timed-sequence.yaml")
    assert cli_main(["run", scenario]) == 2
    assert "clock_skew runs only on a cluster" in capsys.readouterr().err
    assert cli_main(["run", scenario, "--target", "k8s", "--dry-run", *CRDS_ARGS, "--namespace", "train",
                     "--selector", "app=gpt"]) == 0
    assert "TimeChaos" in {d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)}


# --- where the CRDs come from without a cluster ----------------------------------------------------------------

KILL_RANK = ["run", str(ROOT / "scenarios" / "smoke" / "kill-rank.yaml"), "--target", "k8s", "--dry-run",
             "--namespace", "train", "--selector", "app=gpt"]


def test_dry_run_without_crds_says_in_one_line_how_to_get_them(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(CRDS_ENV, raising=False)
    assert cli_main(KILL_RANK) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("baft: error: without a cluster the Chaos Mesh CRDs")
    assert "kubectl get crd podchaos.chaos-mesh.org" in err and "https://mirrors.chaos-mesh.org/v2.8.0/crd.yaml" in err
    assert "--crds DIR" in err and CRDS_ENV in err


@needs_schema
def test_crds_from_a_directory_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    write_crds(tmp_path / "release", *shared_documents().values())  # one multi-document file, as crd.yaml is
    assert cli_main([*KILL_RANK, "--crds", str(tmp_path / "release")]) == 0
    assert [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)] == ["PodChaos"]
    monkeypatch.setenv(CRDS_ENV, str(tmp_path / "release"))
    assert cli_main(KILL_RANK) == 0 and "PodChaos" in capsys.readouterr().out


@needs_schema
def test_the_given_crds_are_the_ones_validated_against(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_crds(tmp_path / "strict", stricter_podchaos("pod-kill"))
    assert cli_main([*KILL_RANK, "--crds", str(tmp_path / "strict")]) == 2  # a bad manifest is still refused
    out, err = capsys.readouterr()
    assert out == "" and "$.spec.action: 'pod-kill' is not one of ['pod-failure', 'container-kill'] (schema)" in err
    write_crds(tmp_path / "no-podchaos", shared_documents()["iochaos.chaos-mesh.org"])
    assert cli_main([*KILL_RANK, "--crds", str(tmp_path / "no-podchaos")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no CustomResourceDefinition podchaos.chaos-mesh.org in {tmp_path}" in err


def test_crds_that_are_not_a_directory_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main([*KILL_RANK, "--crds", "/nonexistent/crds"]) == 2
    assert capsys.readouterr().err == ("baft: error: --crds: expected a directory of Chaos Mesh CRD YAML files, "
                                       "found '/nonexistent/crds' (no such path)\n")


def test_crds_are_for_dry_run_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a for a in KILL_RANK if a != "--dry-run"]
    assert cli_main([*argv, "--job-dir", str(tmp_path), "--crds", str(tmp_path)]) == 2
    assert "--crds: expected --dry-run with it: on a cluster the objects are validated against the CRDs the cluster serves" \
        in capsys.readouterr().err


def test_a_dry_run_ignores_the_flags_of_following_a_job() -> None:
    """``--dry-run`` prints objects and follows no job: a timeout flag given with it changes nothing and is not
    refused for want of --job-dir (as before the flags came from ClusterOptions)."""
    from harness.cli import _parser, _run_options

    argv = ["run", "s.yaml", "--target", "k8s", "--namespace", "ns", "--selector", "app=x", "--dry-run",
            "--inject-timeout", "30", "--poll", "0.1"]
    options, cluster = _run_options(_parser("run").parse_args(argv))
    assert options.target == "k8s" and cluster.dry_run and cluster.follow is None
    options, cluster = _run_options(_parser("run").parse_args([a for a in argv if a != "--dry-run"] +
                                                              ["--job-dir", "/shared/j"]))
    assert cluster.follow.inject_timeout == 30 and cluster.follow.poll == 0.1 and str(cluster.follow.job_dir) == "/shared/j"
