"""Bad input to ``baft``: one ``UsageError``, caught once in ``main``: exit 2, one line on stderr, no traceback."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main as cli_main
from harness.errors import HarnessError, ScenarioError, UsageError

ROOT = Path(__file__).resolve().parents[2]
KILL = str(ROOT / "scenarios" / "smoke" / "kill-rank.yaml")


def test_a_scenario_error_is_a_usage_error_of_the_harness() -> None:
    assert issubclass(UsageError, HarnessError) and issubclass(ScenarioError, UsageError)


@pytest.mark.parametrize("argv, message", [
    (["report", ".", "--mtbf", "x"], "baft: error: --mtbf: expected hours > 0, comma-separated, found 'x'"),
    (["advise", "/nonexistent", "--mtbf", "0"], "baft: error: --mtbf: expected hours > 0"),
    (["report", "/nonexistent"], "baft: error: /nonexistent: not a directory"),
    (["fuzz", KILL, "--budget", "0"], "baft: error: --budget: expected an integer >= 1, found 0"),
    (["fuzz", KILL, "--shrink-budget", "-1"], "baft: error: --shrink-budget: expected an integer >= 0"),
    (["validate", "/nonexistent.yaml"], "baft: error: /nonexistent.yaml"),
    (["suite", "/nonexistent"], "baft: error: /nonexistent: expected a directory of scenario files"),
    (["run", KILL, "--target", "k8s", "--dry-run"], "baft: error: --namespace: expected a value: --target k8s needs --namespace and --selector, found None"),
    (["run", KILL, "--target", "k8s", "--namespace", "ml", "--selector", "app=gpt"],
     "baft: error: --job-dir: expected the job's run directory on a volume shared"),
    (["run", KILL, "--target", "k8s", "--namespace", "ml", "--selector", "app", "--dry-run"],
     "baft: error: --selector: expected k=v[,k=v], found 'app'"),
    (["run", KILL, "--target", "k8s", "--namespace", "ml", "--selector", "a=b", "--workflow", "--job-dir", "/x"],
     "baft: error: --workflow: expected --dry-run with it: --workflow prints one Chaos Mesh Workflow"),
    (["run", KILL, "--namespace", "ml"], "baft: error: --namespace is for --target k8s (a job on a cluster); this run is local"),
    (["run", KILL, "--job-dir", "/x"], "baft: error: --job-dir is for --target k8s"),
    (["run", KILL, "--target", "k8s", "--namespace", "ml", "--selector", "a=b", "--job-dir", "/x", "--poll", "0"],
     "baft: error: --poll: expected seconds > 0, found 0.0"),
    (["deploy", KILL, "--namespace", "Bad_NS", "--image", "i:1", "--claim", "shared"],
     "baft: error: --namespace: expected a DNS-1123 label"),
])
def test_bad_input_exits_2_with_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(message), captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err and captured.out == ""


def test_a_moved_key_is_one_warning_line_naming_the_file_and_the_new_path(tmp_path: Path) -> None:
    import subprocess
    import sys

    scenario = tmp_path / "old.yaml"
    scenario.write_text("name: old\nworkload: {model: gpt-tiny, stages: 2, microbatches: 4, steps: 10, nodes: 2}\n"
                        "checkpoint: {strategy: baft, every: 5, replicas: 1}\nfaults: []\n")
    out = subprocess.run([sys.executable, "-m", "harness.cli", "validate", str(scenario)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [f"baft: warning: {scenario}: checkpoint.replicas is deprecated and will be "
                                       "removed in the next release: use checkpoint.baft.replication.replicas"]
