"""The boot module's hooks, in this process: what they find in a plain training loop, and that
uninstalling them gives torch back as it was."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from baft import events

from harness.worker.hooks import ScriptProbe, active


class Recorder:
    """Stands in for the journal (:class:`harness.worker.probe.Probe`): keeps what it is given."""

    rank = 0

    def __init__(self) -> None:
        self.states: list[tuple[int, dict[str, Any]]] = []
        self.steps: list[tuple[int, float | None, float | None]] = []
        self.backwards: list[int | None] = []
        self.records: list[tuple[str, dict[str, Any]]] = []

    def components(self, step: int, components: dict[str, Any], names: Any = None) -> dict:
        self.states.append((step, components))
        return {}

    def step(self, step: int, loss: float | None, seconds: float, probe_seconds: float | None = None,
             backwards: int | None = None) -> None:
        self.steps.append((step, loss, probe_seconds))
        self.backwards.append(backwards)

    def record(self, event: str, **fields: Any) -> None:
        self.records.append((event, fields))


def train(steps: int, tmp_path: Path, accumulate: int = 1) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    data = TensorDataset(torch.randn(32, 3, generator=torch.Generator().manual_seed(1)), torch.randn(32, 1))
    losses = []
    batches = iter(DataLoader(data, batch_size=4))
    for _ in range(steps):
        total = 0.0
        for _ in range(accumulate):
            x, y = next(batches)
            loss = torch.nn.functional.mse_loss(model(x), y) / accumulate
            loss.backward()
            total += float(loss.detach())
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(total)
    torch.save(model.state_dict(), tmp_path / "m.pt")
    return losses


def test_the_hooks_find_steps_losses_state_and_saves_and_leave_torch_as_it_was(tmp_path: Path) -> None:
    before = (torch.Tensor.backward, torch.save, torch.serialization.save)
    rec = Recorder()
    phases: list[tuple[str, int]] = []
    unsubscribe = events.subscribe(lambda kind, f: phases.append((f["phase"], f["step"])) if kind == "phase" else None)
    hooks = ScriptProbe(rec, steps=3).install()
    try:
        assert active() is hooks
        losses = train(3, tmp_path, accumulate=2)
    finally:
        hooks.uninstall()
        unsubscribe()
    assert active() is None and (torch.Tensor.backward, torch.save, torch.serialization.save) == before
    # one step per optimizer step, the micro-steps' losses summed (what the script summed too)
    assert [s for s, _, _ in rec.steps] == [0, 1, 2]
    assert [round(loss, 6) for _, loss, _ in rec.steps] == [round(v, 6) for v in losses]
    assert all(p is not None and p >= 0 for _, _, p in rec.steps)
    assert rec.backwards == [2, 2, 2]  # backward calls per step: the journal says how many each loss sums
    # the state at each step and after the last: the model found by its parameters, named as in it
    assert [s for s, _ in rec.states] == [0, 1, 2, 3]
    step0 = rec.states[0][1]
    assert set(step0) == {"model", "optimizer", "scheduler", "rng", "data", "step"}
    assert set(step0["model"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    # faults' phases: the batch fetches (two per step), the step, and the save after 3 steps
    assert phases.count(("data", 0)) == 2 and ("iteration", 2) in phases and ("save", 3) in phases


def test_a_framework_count_that_disagrees_is_recorded_once(tmp_path: Path) -> None:
    rec = Recorder()
    hooks = ScriptProbe(rec, steps=2, adapters=("lightning",)).install()
    try:
        train(2, tmp_path)
        hooks.framework_step("lightning", 2)  # agrees: two steps taken
        hooks.framework_step("lightning", 4)  # counts twice as many
        hooks.framework_step("lightning", 5)
    finally:
        hooks.uninstall()
    mismatches = [r for r in rec.records if r[0] == "step_mismatch"]
    assert mismatches == [("step_mismatch", {"framework": "lightning", "framework_step": 4, "counted": 2})]
    # what baft check reads: the loop's pass over its DataLoader and its torch.save, once per step each
    assert [r for r in rec.records if r[0] != "step_mismatch"] == [
        ("script_epoch", {"step": 0}), ("script_save", {"step": 2, "how": "torch.save"})], rec.records
    assert hooks.adapter_enabled("lightning") and not hooks.adapter_enabled("transformers")


def test_each_batch_fetch_of_a_step_is_its_micro_batch_and_a_restarted_process_announces_its_first_load(
        tmp_path: Path) -> None:
    """What ``baft check``'s faults key on (issue 54): the data phase names the step's micro-batch (a kill in the
    middle of an accumulated step), and a restarted process's first load before its first step is the phase
    ``restore`` (a kill during the restart), once."""
    phases: list[tuple[str, int, int | None]] = []
    unsubscribe = events.subscribe(lambda kind, f: phases.append((f["phase"], f["step"], f.get("microbatch")))
                                   if kind == "phase" else None)
    rec = Recorder()
    rec.attempt = 1  # type: ignore[attr-defined]  # a restarted process
    hooks = ScriptProbe(rec, steps=2).install()
    try:
        torch.save({"x": 1}, tmp_path / "c.pt")
        torch.load(tmp_path / "c.pt")
        torch.load(tmp_path / "c.pt")  # the restore is announced once
        train(2, tmp_path, accumulate=2)
    finally:
        hooks.uninstall()
        unsubscribe()
    assert [p for p in phases if p[0] == "data"] == [("data", 0, 0), ("data", 0, 1), ("data", 1, 0), ("data", 1, 1)]
    assert [p for p in phases if p[0] == "restore"] == [("restore", 0, None)]
