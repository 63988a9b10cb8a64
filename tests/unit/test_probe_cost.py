"""The probe's cost cuts keep its power: every tensor is read each step it is journaled (also one changed
behind autograd's back, through ``.data``), a small tensor's fingerprint is bit for bit the stream's, and the
work cut is counted (not timed): no stream for a small tensor, one parameter-name lookup for many steps."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from baft.state import fingerprint
from baft.state.fingerprint import _fingerprint_tensor, _Scratch, _small_fingerprint, fingerprint_components

from analysis.journal import Journal
from harness.worker.hooks import ScriptProbe
from harness.worker.probe import Probe


def _model() -> tuple[torch.nn.Sequential, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    # lr 0: the optimizer itself changes nothing (its momentum buffers are state keyed by parameter names)
    return model, torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9)


def _journaled_model_digests(tmp_path: Path, between: Any, steps: int = 4) -> list[dict[str, str]]:
    """The model's digests the probe journals at each step of a loop that changes nothing by training
    (lr 0, the same batch), with ``between(model, step)`` run after each optimizer step."""
    model, opt = _model()
    x, y = torch.ones(2, 3), torch.zeros(2, 1)
    probe = Probe(tmp_path, rank=0, attempt=0, node="node0", world_size=1)
    hooks = ScriptProbe(probe, steps=steps).install()
    try:
        for step in range(steps):
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            between(model, step)
    finally:
        hooks.uninstall()
        probe.close(steps)
    return [e["digests"]["model"] for e in Journal.load(tmp_path).events("state", 0)]


def _through_data(model: torch.nn.Sequential, step: int) -> None:
    if step == 1:
        model[0].weight.data[0, 0] += 1.0  # .data: its own version counter, the parameter's stays as it was


def _under_no_grad(model: torch.nn.Sequential, step: int) -> None:
    if step == 1:
        with torch.no_grad():
            model[2].bias.mul_(3.0)


def _detached(model: torch.nn.Sequential, step: int) -> None:
    if step == 1:
        model[0].bias.detach().sub_(0.5)


@pytest.mark.parametrize("change, key", [(_through_data, "0.weight"), (_under_no_grad, "2.bias"), (_detached, "0.bias")])
def test_a_tensor_changed_between_two_steps_is_read_again(tmp_path: Path, change: Any, key: str) -> None:
    digests = _journaled_model_digests(tmp_path, change)
    assert len(digests) == 5  # the state before each of 4 steps and after the last
    # before the change the state stands still (lr 0): the digests agree, so the one that differs is the change
    assert digests[0] == digests[1]
    assert digests[2][key] != digests[1][key]  # the state before step 2: the change after step 1 is seen
    assert {k: v for k, v in digests[2].items() if k != key} == {k: v for k, v in digests[1].items() if k != key}
    assert digests[2] == digests[3] == digests[4]


SMALL = [torch.randn(7, 5), torch.randn(64, 1024), torch.randn(3, dtype=torch.float64), torch.tensor(2.5),
         torch.randn(6, 4).t(), torch.randn(10)[::3], torch.randn(1, 7).expand(5, 7),
         torch.randn(8, 8).to(torch.float16), torch.arange(625), torch.randint(0, 255, (5056,), dtype=torch.uint8),
         torch.tensor([True, False]), torch.tensor([1e30, 3.0]), torch.tensor([1e-40, -0.0]),
         torch.tensor([float("nan"), 1.0]), torch.tensor([1e300], dtype=torch.float64),
         torch.randn(4, 4, requires_grad=True), torch.nn.Parameter(torch.randn(5))]


@pytest.mark.parametrize("t", SMALL, ids=lambda t: f"{t.dtype}{tuple(t.shape)}")
@pytest.mark.parametrize("with_norm", [True, False])
def test_a_small_tensor_fingerprints_bit_for_bit_as_the_stream_does(t: torch.Tensor, with_norm: bool) -> None:
    with np.errstate(all="ignore"):
        small = _small_fingerprint(t, _Scratch(), with_norm)
        streamed = _fingerprint_tensor(t.detach(), _Scratch(), with_norm)
    assert small is not None
    assert small[0] == streamed[0]
    assert small[1] == streamed[1] or (small[1] != small[1] and streamed[1] != streamed[1])  # nan is nan


def test_a_negative_view_is_left_to_the_stream() -> None:
    t = torch._neg_view(torch.randn(3, dtype=torch.complex64))
    assert _small_fingerprint(t, _Scratch(), True) is None  # numpy cannot read it: the stream resolves it


def test_every_tensor_of_a_small_state_is_read_once_a_pass_and_none_through_a_stream(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    streams: list[int] = []
    small = fingerprint._small_fingerprint
    stream = fingerprint._TensorStream

    def counted_small(t: torch.Tensor, scratch: _Scratch, with_norm: bool) -> Any:
        reads.append(id(t))
        return small(t, scratch, with_norm)

    class CountedStream(stream):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any) -> None:
            streams.append(1)
            super().__init__(*args)

    monkeypatch.setattr(fingerprint, "_small_fingerprint", counted_small)
    monkeypatch.setattr(fingerprint, "_TensorStream", CountedStream)
    model, opt = _model()
    state = {"model": model.state_dict(), "rng": {"torch": torch.get_rng_state()}, "data": {"batch": [torch.ones(2, 3)]}}
    digests, _ = fingerprint_components(state)
    tensors = sum(len(v) for v in digests.values())
    assert tensors == 4 + 1 + 1
    assert len(reads) == tensors and streams == []  # every tensor read, each in a few calls, none by a stream
    big = torch.zeros(fingerprint.BLOCK_BYTES // 4 + 1)  # more than one block: the stream's, as before
    fingerprint_components({"model": {"big": big}})
    assert streams == [1]


def test_the_parameter_names_are_looked_up_once_for_many_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lookups: list[int] = []
    model, opt = _model()
    named = model.named_parameters

    def counted(*args: Any, **kwargs: Any) -> Any:
        lookups.append(1)
        return named(*args, **kwargs)

    monkeypatch.setattr(model, "named_parameters", counted)
    probe = Probe(tmp_path, rank=0, attempt=0, node="node0", world_size=1)
    hooks = ScriptProbe(probe, steps=6).install()
    first = 0
    try:
        for step in range(6):
            model(torch.ones(2, 3)).sum().backward()
            opt.step()
            first = first or len(lookups)  # the first step also finds the model by its parameters
    finally:
        hooks.uninstall()
        probe.close(6)
    states = Journal.load(tmp_path).events("state", 0)
    assert len(states) == 7 and len(lookups) == first  # was one more lookup per state journaled
    assert all("state.2.bias.momentum_buffer" in s["digests"]["optimizer"] for s in states[1:])  # named
    # a new parameter group: the names are looked up again, the new parameter named as in the model
    extra = torch.nn.Linear(1, 1)
    opt.add_param_group({"params": list(extra.parameters())})
    assert hooks._param_names() == {0: "0.weight", 1: "0.bias", 2: "2.weight", 3: "2.bias", 4: "4", 5: "5"}
    assert len(lookups) == first + 1
