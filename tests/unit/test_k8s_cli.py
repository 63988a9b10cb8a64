"""``baft run --target k8s --dry-run``: the scenario's faults as validated Chaos Mesh YAML, no cluster touched."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.k8s


def test_dry_run_prints_appliable_documents(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["run", str(ROOT / "scenarios" / "ci" / "storage-disk-full.yaml"), "--target", "k8s", "--dry-run",
                   "--namespace", "train", "--selector", "app=gpt,team=ml"])
    out = capsys.readouterr().out
    assert rc == 0
    docs = list(yaml.safe_load_all(out))
    assert {d["kind"] for d in docs} == {"PodChaos", "IOChaos"}
    for d in docs:
        assert d["apiVersion"] == "chaos-mesh.org/v1alpha1" and d["metadata"]["namespace"] == "train"
        assert d["spec"]["selector"]["labelSelectors"]["team"] == "ml"


@pytest.mark.parametrize("argv, message", [
    (["--namespace", "train"], "needs --namespace and --selector"),
    (["--namespace", "train", "--selector", "nokeyvalue"], "--selector"),
    (["--namespace", "Bad_NS", "--selector", "a=b"], "namespace"),
])
def test_dry_run_bad_input_exits_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["run", str(ROOT / "scenarios" / "smoke" / "kill-rank.yaml"), "--target", "k8s", "--dry-run", *argv])
    assert rc == 2 and message in capsys.readouterr().err


def test_a_fault_chaos_mesh_cannot_express_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["run", str(ROOT / "scenarios" / "ci" / "jitter-drift.yaml"), "--target", "k8s", "--dry-run",
                   "--namespace", "train", "--selector", "app=gpt"])
    assert rc == 2 and "cannot run on a cluster" in capsys.readouterr().err

