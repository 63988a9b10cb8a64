"""The spine end to end: train, checkpoint, SIGKILL a rank, torchrun restarts, bitwise verdict."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, kill_pair, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_smoke_scenario_passes(tmp_path: Path, ref_cache: Path) -> None:
    rc, out, v = run_cli(ROOT / "scenarios/smoke/kill-rank.yaml", tmp_path / "out", ref_cache, report=True)
    assert rc == 0, out
    assert "PASSED" in out
    assert (tmp_path / "out" / "report.html").is_file() and (tmp_path / "out" / "loss.png").is_file()
    assert v is not None and v["passed"] and v["bitwise_equal"] and v["first_divergence"] is None
    assert v["faults_fired"] == 1 and v["completed"]
    rec = v["recoveries"][0]
    # Killed at the start of step 17 with checkpoints every 5: resume at 15, redo 15 and 16.
    assert rec["restored_step"] == 15 and v["lost_steps"] == 2
    assert v["recovery_seconds"] > 0  # measured (how fast is not a test's business)
    # After the restart every rank re-ran and compared its post-recovery steps.
    assert v["states_compared"] >= 2 * (31 + 3)


MATRIX = [
    pytest.param(dict(model="gpt-tiny", stages=2, schedule="gpipe", steps=20), 5, 0, 7, id="gpipe-2st-kill-r0"),
    pytest.param(dict(model="gpt-tiny", stages=3, schedule="1f1b", steps=20), 4, 2, 13, id="1f1b-3st-kill-r2"),
    pytest.param(dict(model="gpt-tiny", stages=4, schedule="1f1b", steps=16, nodes=2), 3, 1, 8, id="1f1b-4st-2nodes"),
    pytest.param(dict(model="mlp", stages=2, data_parallel=2, schedule="gpipe", steps=20), 5, 3, 11, id="mlp-2st-2dp"),
    pytest.param(dict(model="gpt-tiny", stages=2, virtual_stages=2, schedule="interleaved-1f1b", steps=16), 4, 0, 10,
                 id="interleaved-2st-2v"),
]


@pytest.mark.parametrize(("workload", "every", "rank", "at_step"), MATRIX)
def test_kill_between_checkpoints_resumes_bitwise(tmp_path: Path, ref_cache: Path, workload: dict, every: int, rank: int, at_step: int) -> None:
    scenario = {
        "name": "matrix",
        "workload": {"microbatches": 4, **workload},
        "checkpoint": {"strategy": "sync", "every": every},
        "faults": [{"kill": {"rank": rank, "at_step": at_step}}],
        "expect": {"bitwise": True, "max_lost_steps": every},
    }
    rc, out, v = run_cli(scenario, tmp_path / "out", ref_cache)
    assert rc == 0, out
    assert v is not None and v["bitwise_equal"] and v["faults_fired"] == 1
    assert v["recoveries"][0]["restored_step"] == at_step // every * every
    assert v["lost_steps"] == at_step % every


@pytest.mark.parametrize("component", ["data"])  # the rng control runs in test_suite (kill_pair)
def test_negative_control_names_the_missing_component(tmp_path: Path, ref_cache: Path, component: str) -> None:
    good, _ = kill_pair()
    scenario = {**good, "name": f"negative-{component}", "expect": {"bitwise": True},
                "workload": {**good["workload"], "omit": [component]}}
    rc, out, v = run_cli(scenario, tmp_path / "out", ref_cache)
    assert rc == 1, out
    assert v is not None and not v["passed"] and not v["bitwise_equal"]
    assert v["first_divergence"]["component"] == component
    assert v["first_divergence"]["step"] == 10  # the restored boundary
    assert f"{component} /" in out
