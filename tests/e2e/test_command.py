"""Unmodified training scripts (``workload: {command: [...]}``): the boot module's hooks find the steps,
losses and state without the script's help, and the harness finds where a restarted script resumed."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from analysis.journal import Journal

from tests.e2e.conftest import ROOT, run_cli

pytestmark = [pytest.mark.e2e]
DDP = ROOT / "examples" / "ddp_torchsave"


def scenario(name: str, *flags: str) -> dict[str, Any]:
    data = yaml.safe_load((DDP / f"{name}.yaml").read_text())
    data["workload"]["command"][0] = str(DDP / "train.py")  # the dict is written elsewhere
    data["workload"]["command"] += list(flags)
    return data


def test_a_script_that_restores_itself_is_found_resumed_from_its_checkpoint(tmp_path: Path, ref_cache: Path) -> None:
    """Checkpoint at 10, killed at 13: resumed from 10, 3 steps lost, bit for bit (the script's loader has
    a generator of its own)."""
    rc, out, v = run_cli(DDP / "fixed.yaml", tmp_path / "out", ref_cache)
    assert rc == 0 and v["passed"] and v["bitwise_equal"] and v["completed"], out
    (rec,) = v["recoveries"]
    assert (rec["restored_step"], rec["lost_steps"], rec["restored_tier"]) == (10, 3, "script"), rec
    assert rec["resume"] == "resumed from step 10 (every component equals the reference at step 10)"
    assert "resumed from step 10 (every component" in out
    j = Journal.load(tmp_path / "out" / "faulted")
    # the steps, the losses of every rank and the state of every component, found by the hooks alone
    assert {e["step"] for e in j.events("step", 0)} == set(range(24))
    assert all(e["loss"] is not None for e in j.events("step", 1))
    assert set(j.events("state", 0)[-1]["digests"]) == {"model", "optimizer", "scheduler", "rng", "data", "step"}
    # the script wrote its checkpoints where {run_dir} pointed: this run's own working directory
    assert (tmp_path / "out" / "faulted" / "work" / "ckpt" / "last.pt").is_file()


def test_the_global_rng_a_new_dataloader_iterator_draws_from_is_named(tmp_path: Path, ref_cache: Path) -> None:
    """As shipped the script restores the torch RNG, then makes a new DataLoader iterator, which draws its
    base seed from that RNG: one draw the reference made before the checkpoint is made again."""
    rc, out, v = run_cli(DDP / "kill.yaml", tmp_path / "out", ref_cache)
    assert rc == 1 and not v["bitwise_equal"], out
    d = v["first_divergence"]
    assert (d["step"], d["component"], d["key"]) == (10, "rng", "torch"), d
    (rec,) = v["recoveries"]
    assert rec["restored_step"] == 10 and rec["lost_steps"] == 3
    assert rec["resume"] == "resumed at step 10, but model equals step 10; rng matches no step of the reference"


def test_a_torn_checkpoint_is_named_torn(tmp_path: Path, ref_cache: Path) -> None:
    """--torn: the optimizer saved a step after the model, to its own file."""
    rc, out, v = run_cli(scenario("fixed", "--torn"), tmp_path / "out", ref_cache)
    assert rc == 1, out
    (rec,) = v["recoveries"]
    assert "torn: model equals step 10, optimizer equals step 11" in rec["resume"], rec
    assert v["first_divergence"]["component"] == "optimizer" and v["first_divergence"]["step"] == 10


MISUSE = """\
import sys, torch
m = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(int(sys.argv[1])):
    m(torch.ones(1, 2)).sum().backward()
    opt.step()
    opt.zero_grad()
if len(sys.argv) > 2:
    raise RuntimeError("the data path does not exist: /data/shards")
"""


@pytest.mark.parametrize(("args", "steps", "rc", "says"), [
    (["5"], 8, 1, "it finished rank 0 after 5 step(s), expected 8 (workload.steps)"),
    (["5", "crash"], 5, 1, "the reference run failed (exit codes [1], timed out: False): RuntimeError: the data path "
                           "does not exist: /data/shards"),
])
def test_a_script_that_ends_early_or_crashes_says_so(tmp_path: Path, ref_cache: Path, args: list[str], steps: int,
                                                   rc: int, says: str) -> None:
    (tmp_path / "train.py").write_text(MISUSE)
    data = {"name": "misuse", "workload": {"command": [str(tmp_path / "train.py"), *args], "nproc": 1, "steps": steps},
            "checkpoint": {"strategy": "none"}, "faults": [], "expect": {"bitwise": True}}
    code, out, _ = run_cli(data, tmp_path / "out", ref_cache)
    assert code == rc and says in out, out
