"""``baft check``'s choices (issue 54): what the reference's journals say the script does, and the battery each
kind of script gets; bad input exits 2 before anything runs."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.journal import Journal, JournalWriter, float_bits, rank_journal
from harness.campaign.check import CheckConfig, Profile, battery
from harness.cli import main as cli_main
from harness.errors import ScenarioError
from harness.scenario import load

SCRIPT = str(Path(__file__).resolve().parents[4] / "examples" / "ddp_torchsave" / "train.py")


def reference(root: Path, steps: int, saves: list[int], backwards: int = 1, epochs: tuple[int, ...] = (0,)) -> Journal:
    w = JournalWriter(rank_journal(root, 0), rank=0, attempt=0)
    w.write("start", node="node0", world_size=1)
    for s in range(steps):
        if s in epochs:
            w.write("script_epoch", step=s)
        w.write("state", step=s, digests={"model": {"w": f"m{s}"}, "data": {"batch": f"b{s}"}})
        w.write("step", step=s, loss=1.0, loss_bits=float_bits(1.0), backwards=backwards)
        if s + 1 in saves:
            w.write("script_save", step=s + 1, how="torch.save")
    w.write("finish", step=steps)
    w.close()
    return Journal.load(root)


def test_the_profile_reads_steps_saves_epochs_and_micro_batches(tmp_path: Path) -> None:
    p = Profile.of(reference(tmp_path, 24, [5, 10, 15, 20], backwards=4, epochs=(0, 16)))
    assert (p.steps, p.saves, p.save_ways, p.micro_batches, p.epochs, p.loader) == (
        24, [5, 10, 15, 20], ["torch.save"], 4, [0, 16], True)
    assert "4 micro-batches per step" in p.describe() and "2 epochs" in p.describe()


def _names(config: CheckConfig, profile: Profile) -> list[str]:
    return [c.name for c in battery(config, profile)]


def test_the_battery_follows_what_the_script_does(tmp_path: Path) -> None:
    plain = Profile(steps=24, saves=[5, 10, 15, 20], save_ways=["torch.save"], micro_batches=1, epochs=[0], loader=True)
    two = CheckConfig(script=SCRIPT, nproc=2)
    assert _names(two, plain) == ["kill-after-save", "kill-during-save", "preempt-generous-grace",
                                  "preempt-short-grace", "kill-during-restart"]
    rich = Profile(steps=24, saves=[5, 10, 15, 20], save_ways=["torch.save"], micro_batches=4, epochs=[0, 12],
                   loader=True)
    nodes = CheckConfig(script=SCRIPT, nproc=1, nodes=2)
    assert _names(nodes, rich) == ["kill-after-save", "kill-during-save", "kill-mid-accumulation",
                                   "preempt-generous-grace", "preempt-short-grace", "kill-later-epoch",
                                   "kill-during-restart", "node-loss"]
    cases = {c.name: c for c in battery(nodes, rich)}
    assert cases["kill-mid-accumulation"].faults == [{"kill": {"rank": 1, "at_step": 6, "phase": "data", "microbatch": 2}}]
    assert cases["kill-later-epoch"].faults[0]["kill"]["at_step"] == 16  # the first save in epoch 2 is step 15
    assert cases["kill-during-save"].faults == [{"kill": {"rank": 0, "at_step": 10, "phase": "save"}}]
    never = Profile(steps=10, saves=[], save_ways=[], micro_batches=1, epochs=[], loader=False)
    assert _names(CheckConfig(script=SCRIPT), never) == ["kill-without-save", "preempt-generous-grace",
                                                         "preempt-short-grace"]


@settings(max_examples=40, deadline=None)
@given(steps=st.integers(2, 60), every=st.integers(1, 30), micro=st.integers(1, 4), nodes=st.integers(1, 3),
       nproc=st.integers(1, 2), epoch=st.integers(0, 59))
def test_every_case_is_a_valid_scenario_whose_faults_can_fire(tmp_path_factory, steps: int, every: int, micro: int,
                                                              nodes: int, nproc: int, epoch: int) -> None:
    """Whatever the script does, each generated scenario validates (file, keys, phases, restarts) and keys its
    faults to steps the run takes."""
    saves = list(range(every, steps + 1, every))
    profile = Profile(steps=steps, saves=saves, save_ways=["torch.save"], micro_batches=micro,
                      epochs=sorted({0, min(epoch, steps - 1)}), loader=True)
    config = CheckConfig(script=SCRIPT, nproc=nproc, nodes=nodes)
    d = tmp_path_factory.mktemp("case")
    import yaml

    for case in battery(config, profile):
        path = d / f"{case.name}.yaml"
        path.write_text(yaml.safe_dump(case.scenario(config, profile)))
        s = load(path)
        for f in s.faults:
            at = getattr(f.config, "at_step", None)
            assert at is None or 0 <= at < steps, (case.name, at)


def test_bad_input_exits_2_before_anything_runs(tmp_path: Path, capsys) -> None:
    assert cli_main(["check", str(tmp_path / "missing.py")]) == 2
    assert "missing.py" in capsys.readouterr().err
    with pytest.raises(ScenarioError):
        CheckConfig(script=SCRIPT, nproc=2, launcher="python")
    assert cli_main(["check", "--nproc", "0", SCRIPT]) == 2
    assert cli_main(["check", "--steps", "1", SCRIPT]) == 2
