"""Unmodified training scripts (``workload: {command: [...]}``): the boot module's hooks find the steps,
losses and state without the script's help, and the harness finds where a restarted script resumed."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from analysis.journal import Journal
from tests.e2e.conftest import ROOT, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
DDP = ROOT / "examples" / "ddp_torchsave"


def scenario(name: str, *flags: str) -> dict[str, Any]:
    data = yaml.safe_load((DDP / f"{name}.yaml").read_text())
    data["workload"]["command"][0] = str(DDP / "train.py")  # the dict is written elsewhere
    data["workload"]["command"] += list(flags)
    return data


def causes(v: dict[str, Any]) -> dict[str, str]:
    """The verdict's diagnosis: each cause's code and its first piece of evidence."""
    return {c["code"]: c["evidence"][0] for c in v.get("diagnosis", [])}


def test_a_script_that_restores_itself_is_found_resumed_from_its_checkpoint(tmp_path: Path, ref_cache: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoint at 10, killed at 13: resumed from 10, 3 steps lost, bit for bit (the script's loader has
    a generator of its own)."""
    tmp = tmp_path / "tmpdir"  # the processes' temporary directory: the run leaves nothing there
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    rc, out, v = run_cli(DDP / "fixed.yaml", tmp_path / "out", ref_cache)
    # nothing of this run is left there (torchrun's files went into the run's logs/torchelastic); torch's
    # compile cache (torchinductor_<user>) is shared by every run, not left behind by one
    left = [p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_")]
    assert not left, left
    assert list((tmp_path / "out" / "faulted" / "logs" / "torchelastic" / "node0").glob("*/attempt_1"))
    assert rc == 0 and v["passed"] and v["bitwise_equal"] and v["completed"], out
    (rec,) = v["recoveries"]
    assert (rec["restored_step"], rec["lost_steps"], rec["restored_tier"]) == (10, 3, "script"), rec
    assert rec["resume"] == "resumed from step 10 (every component equals the reference at step 10)"
    assert "resumed from step 10 (every component" in out
    assert v["reproducibility"]["equal"]  # the reference, run twice, equal: judged bit for bit
    assert not v.get("diagnosis") and "likely cause" not in out  # a right resume gets no cause
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
    assert rec["resume"] == "resumed at step 10: model equals step 10; rng matches no step of the reference"
    assert causes(v) == {"rng-drawn-after-restore": "rank 0: model equals step 10, rng/torch equals no step"}
    assert "likely cause     [rng-drawn-after-restore]" in out and "usual fix: give the DataLoader" in out


def test_a_torn_checkpoint_is_named_torn(tmp_path: Path, ref_cache: Path) -> None:
    """--torn: the optimizer saved a step after the model, to its own file."""
    rc, out, v = run_cli(scenario("fixed", "--torn"), tmp_path / "out", ref_cache)
    assert rc == 1, out
    (rec,) = v["recoveries"]
    assert "torn: model equals step 10, optimizer equals step 11" in rec["resume"], rec
    assert v["first_divergence"]["component"] == "optimizer" and v["first_divergence"]["step"] == 10
    assert causes(v) == {"torn-checkpoint": "rank 0: model equals step 10, optimizer equals step 11"}


MISUSE = """\
import sys, torch
m = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(int(sys.argv[1])):
    m(torch.ones(1, 2)).sum().backward()
    opt.step()
    opt.zero_grad()
if len(sys.argv) > 2 and sys.argv[2] == "crash":
    raise RuntimeError("the data path does not exist: /data/shards")
if len(sys.argv) > 2 and sys.argv[2] == "stall":
    import time
    time.sleep(60)  # waiting for something that never comes
"""


@pytest.mark.parametrize(("args", "steps", "rc", "says"), [
    (["5"], 8, 1, "it finished rank 0 after 5 step(s), expected 8 (workload.steps)"),
    (["5", "crash"], 5, 1, "the reference run failed (exit codes [1], timed out: False): RuntimeError: the data path "
                           "does not exist: /data/shards"),
    (["0"], 5, 1, "it finished rank 0 after 0 step(s), expected 5 (workload.steps) (no optimizer step seen: the harness "
                  "counts the steps of torch.optim optimizers)"),
    (["0", "stall"], 5, 1, "no optimizer step within 5 s of the start (run.startup_timeout)"),
])
def test_a_script_that_ends_early_or_crashes_says_so(tmp_path: Path, ref_cache: Path, args: list[str], steps: int,
                                                   rc: int, says: str) -> None:
    (tmp_path / "train.py").write_text(MISUSE)
    data = {"name": "misuse", "workload": {"command": [str(tmp_path / "train.py"), *args], "nproc": 1, "steps": steps},
            "checkpoint": {"strategy": "none"}, "faults": [], "expect": {"bitwise": True},
            "run": {"startup_timeout": 5 if "stall" in args else 60}}
    code, out, _ = run_cli(data, tmp_path / "out", ref_cache)
    assert code == rc and says in out, out


def needs(module: str) -> None:
    """The framework, installed by the ``frameworks`` extra (CI installs it: there a missing one fails)."""
    import importlib.util
    import os

    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI"):
            pytest.fail(f"{module} is not installed (pip install -c constraints.txt '.[frameworks]')")
        pytest.skip(f"{module} is not installed (pip install -c constraints.txt '.[frameworks]')")


def test_lightning_resumes_its_model_but_not_the_rng_or_the_epochs_batches(tmp_path: Path, ref_cache: Path) -> None:
    """An unmodified Lightning Trainer (CPU DDP, two processes, ModelCheckpoint every 5 steps,
    fit(ckpt_path="last")): model, optimizer and scheduler resume at step 10, the RNG is the one
    seed_everything gave at step 0 and the batch is the epoch's first again."""
    needs("lightning")
    rc, out, v = run_cli(ROOT / "examples" / "lightning" / "kill.yaml", tmp_path / "out", ref_cache)
    assert rc == 1 and not v["bitwise_equal"], out
    (rec,) = v["recoveries"]
    assert (rec["restored_step"], rec["lost_steps"]) == (10, 3), rec
    assert rec["resume"] == "resumed at step 10: model equals step 10, but rng equals step 0, data equals step 0", rec
    d = v["first_divergence"]
    assert (d["step"], d["component"]) == (10, "rng"), d
    assert causes(v) == {"rng-not-restored": "rank 0: model equals step 10, rng/torch equals step 0",
                         "data-position-not-restored": "rank 0: model equals step 10, data equals step 0"}


def test_the_hugging_face_trainer_resumes_bit_for_bit(tmp_path: Path, ref_cache: Path) -> None:
    """An unmodified HF Trainer on a tiny GPT-2 (save_steps 5, resume_from_checkpoint): its checkpoint
    holds the RNG states, and it skips the batches of the epoch it had seen."""
    needs("transformers")
    rc, out, v = run_cli(ROOT / "examples" / "hf_trainer" / "kill.yaml", tmp_path / "out", ref_cache)
    assert rc == 0 and v["passed"] and v["bitwise_equal"], out
    (rec,) = v["recoveries"]
    assert (rec["restored_step"], rec["lost_steps"]) == (10, 3), rec
    assert rec["resume"] == "resumed from step 10 (every component equals the reference at step 10)"
    assert not v.get("diagnosis")


def test_a_kill_during_the_scripts_save_leaves_files_of_two_steps(tmp_path: Path, ref_cache: Path) -> None:
    """``phase: save`` fires in torch.save: rank 0 killed as it starts saving step 10. Its files of step 5
    stay (written atomically), but rank 1 had already replaced its RNG file with step 10's."""
    data = scenario("fixed")
    data["faults"] = [{"kill": {"rank": 0, "at_step": 10, "phase": "save"}}]
    data["expect"] = {"bitwise": True}
    rc, out, v = run_cli(data, tmp_path / "out", ref_cache)
    assert rc == 1, out
    (rec,) = v["recoveries"]
    assert rec["restored_step"] == 5 and rec["fault"]["phase"] == "save", (rec, out)
    assert rec["resume"] == ("rank 0: resumed from step 5 (every component equals the reference at step 5); "
                             "rank 1: resumed at step 5: model equals step 5, but rng equals step 10"), (rec, out)
    assert causes(v) == {"torn-checkpoint": "rank 1: model equals step 5, rng/torch equals step 10"}


NONDETERMINISTIC = """\
import os, sys, torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.Adam(model.parameters(), lr=0.05)
noise = torch.Generator().manual_seed(int.from_bytes(os.urandom(7), "little"))  # differs in every run
x, y = torch.randn(16, 4, generator=torch.Generator().manual_seed(1)), torch.randn(16, 1)
step = 0
if os.path.exists("ck.pt"):
    ck = torch.load("ck.pt")
    model.load_state_dict(ck["model"]); opt.load_state_dict(ck["opt"]); step = ck["step"]
while step < int(sys.argv[1]):
    loss = torch.nn.functional.mse_loss(model(x + 1e-4 * torch.randn(x.shape, generator=noise)), y)
    opt.zero_grad(); loss.backward(); opt.step()
    step += 1
    if step % 4 == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, "ck.pt")
"""


def test_a_job_that_is_not_deterministic_is_judged_by_its_loss_curve(tmp_path: Path, ref_cache: Path) -> None:
    """Two uninterrupted runs differ (noise from OS entropy): no false alarm; the verdict says where they
    differ and judges the loss curve; the resume is found by the optimizer's own step count."""
    (tmp_path / "train.py").write_text(NONDETERMINISTIC)
    data = {"name": "noisy", "workload": {"command": [str(tmp_path / "train.py"), "12"], "nproc": 1, "steps": 12},
            "checkpoint": {"strategy": "none"}, "faults": [{"kill": {"rank": 0, "at_step": 6}}],
            "expect": {"bitwise": True}, "run": {"max_restarts": 1}}
    rc, out, v = run_cli(data, tmp_path / "out", ref_cache)
    assert rc == 0 and v["passed"], out
    r = v["reproducibility"]
    # Where they first differ: the loss of iteration 0 unless its float32 value happens to round alike
    # in both runs (the noise moves it by some 1e-5 of itself), then the model after step 1.
    d = r["first_divergence"]
    assert not r["equal"] and (d["step"], d["component"]) in ((0, "loss"), (1, "model"), (1, "loss")), r
    assert "a bitwise verdict is impossible; judged by the loss curve" in out
    assert v["loss_curve"] is not None and not v["loss_curve"]["failures"]
    (rec,) = v["recoveries"]
    assert rec["restored_step"] == 4 and "by the optimizer's own step count" in rec["resume"], rec


ACC = ROOT / "examples" / "accelerate"


def accelerate_scenario(name: str) -> dict[str, Any]:
    data = yaml.safe_load((ACC / f"{name}.yaml").read_text())
    data["workload"]["command"][0] = str(ACC / "train.py")  # the dict is written elsewhere
    return data


def test_accelerate_as_shipped_resumes_its_model_but_not_the_shuffle_order_or_the_rng(tmp_path: Path,
                                                                                     ref_cache: Path) -> None:
    """save_state / load_state with skip_first_batches: model, optimizer and scheduler come back at step 10;
    the resumed epoch is shuffled as the first epoch was (the sampler's order is not in the checkpoint
    without use_seedable_sampler), and the new iterator draws its seed from the restored global RNG."""
    needs("accelerate")
    rc, out, v = run_cli(ACC / "kill.yaml", tmp_path / "out", ref_cache)
    assert rc == 1 and not v["bitwise_equal"], out
    (rec,) = v["recoveries"]
    assert (rec["restored_step"], rec["lost_steps"]) == (10, 3), rec
    assert rec["resume"].startswith("resumed at step 10: model equals step 10, but data equals step 2; rng matches no "
                                    "step of the reference; accelerate restored acc/checkpoints/checkpoint_1"), rec
    d = v["first_divergence"]
    assert (d["step"], d["component"]) == (10, "rng"), d
    assert causes(v) == {"rng-drawn-after-restore": "rank 0: model equals step 10, rng/torch equals no step",
                         "data-position-not-restored": "rank 0: model equals step 10, data equals step 2"}


def test_accelerate_with_a_seedable_sampler_and_a_loader_generator_resumes_bit_for_bit(tmp_path: Path,
                                                                                      ref_cache: Path) -> None:
    needs("accelerate")
    rc, out, v = run_cli(ACC / "fixed.yaml", tmp_path / "out", ref_cache)
    assert rc == 0 and v["passed"] and v["bitwise_equal"], out
    (rec,) = v["recoveries"]
    assert rec["resume"] == ("resumed from step 10 (every component equals the reference at step 10; accelerate "
                             "restored acc/checkpoints/checkpoint_1)"), rec
    assert not v.get("diagnosis")


@pytest.mark.parametrize("adapters", [None, []], ids=["adapter", "no-adapter"])
def test_a_kill_as_accelerate_saves(tmp_path: Path, ref_cache: Path, adapters: list[str] | None) -> None:
    """With the adapter ``phase: save`` fires as ``save_state`` begins: nothing of step 10 is written, the
    job resumes from step 5. Without it the phase is seen at the first file the save writes (the weights, through
    safetensors' ``save_file``), after accelerate made the directory: the empty checkpoint_1 is the newest, and
    every restart fails on it (accelerate 1.16 writes a checkpoint file by file into its final directory)."""
    needs("accelerate")
    data = accelerate_scenario("fixed")
    data["workload"]["adapters"] = adapters
    data["faults"] = [{"kill": {"rank": 0, "at_step": 10, "phase": "save"}}]
    data["expect"] = {"bitwise": True}
    if adapters == []:
        data["workload"]["reproducible"] = False  # one reference: the run is judged on its failure
    rc, out, v = run_cli(data, tmp_path / "out", ref_cache)
    work = tmp_path / "out" / "faulted" / "work" / "acc" / "checkpoints"
    if adapters is None:
        assert rc == 0 and v["bitwise_equal"], out
        assert [r["restored_step"] for r in v["recoveries"]] == [5], v["recoveries"]
        assert (work / "checkpoint_1" / "optimizer.bin").is_file()  # step 10 saved again, whole, after the resume
    else:
        assert rc == 1 and not v["completed"], out
        assert "FileNotFoundError" in out and "checkpoint_1/" in out, out
        # the agents saw why the restarts failed: the kill's victims are explained, the restarts' crash is named
        (said,) = [f for f in v["failures"] if "no fault explains" in f]
        assert re.search(r"incarnation 1: ranks? [0-9, ]+ ended with exit code 1 before a first step: FileNotFoundError",
                         said) and 'examples/accelerate/train.py", line' in said, said
        assert all(f["explained"] for f in v["worker_failures"] if f["incarnation"] == 0), v["worker_failures"]
        assert (work / "checkpoint_1").is_dir() and not (work / "checkpoint_1" / "optimizer.bin").exists()


def test_a_resume_between_two_micro_batches_is_judged_by_its_state_not_its_partial_loss(
        tmp_path: Path, ref_cache: Path) -> None:
    """A save inside an accumulating step (the gradient restored): the resumed step's loss is summed over
    the one backward call the new process made. That loss record was a false divergence; the state decides."""
    rc, out, v = run_cli(DDP / "accumulate.yaml", tmp_path / "out", ref_cache)
    assert rc == 0 and v["passed"] and v["bitwise_equal"], out
    (rec,) = v["recoveries"]
    assert rec["restored_step"] == 7, rec
    assert {(p["rank"], p["step"], p["backwards"], p["reference_backwards"]) for p in v["partial_steps"]} == {
        (0, 7, 1, 2), (1, 7, 1, 2)}
    assert "resumed mid-step 7 (1 of 2 micro-batches restored with the gradient) on ranks 0, 1" in out
    # the gradient left out of the save: caught at the state after that step, not at its loss
    rc, out, v = run_cli(scenario("accumulate", "--drop-grad"), tmp_path / "bug", ref_cache)
    assert rc == 1 and not v["bitwise_equal"], out
    d = v["first_divergence"]
    assert (d["step"], d["component"]) == (8, "model"), d
    assert causes(v) == {"accumulated-gradient-lost": "rank 0 resumed mid-step 7; the state after it differs first "
                                                      "in model / module.0.bias"}
