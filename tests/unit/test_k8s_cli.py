"""``baft run --target k8s --dry-run``: the scenario's faults as validated Chaos Mesh YAML, no cluster touched."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.cli import main as cli_main
from tests.crds import CRDS, SHARED_CRDS, needs_schema

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
    (["--workflow", "--job-dir", "/tmp"], "needs --dry-run"),
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

