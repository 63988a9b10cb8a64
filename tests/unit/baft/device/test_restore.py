"""A restored slot into a state on the device (issue 37, item 2, the host-to-device direction), on the simulated
device of :class:`tests.fakes.streams.FakeStreams`: the bulk bytes are copied on a side stream after the
compute stream's last use of the live tensors, training's next kernel runs after the copies, the host never
waits for the training stream, and the state is the saved one bit for bit."""
from __future__ import annotations

import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from baft.device.restore import restore_into
from baft.state.fingerprint import digest_components
from baft.state.train import TrainState

from tests.fakes.streams import FakeStreams


def trained(seed: int, steps: int) -> TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2))
    for i in range(steps):
        model(torch.randn(3, 8, generator=torch.Generator().manual_seed(i))).pow(2).mean().backward()
        state.optimizer.step()
        state.optimizer.zero_grad()
        state.step += 1
    return state


def saved(state: TrainState) -> dict:
    """What a slot gives back: host copies of every component."""
    def copy(tree):
        if isinstance(tree, dict):
            return {k: copy(v) for k, v in tree.items()}
        if isinstance(tree, list):
            return [copy(v) for v in tree]
        return tree.clone() if isinstance(tree, torch.Tensor) else tree
    return copy(state.capture())


BULK = ("model", "optimizer")


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), fresh_steps=st.integers(0, 2))
def test_the_bulk_goes_on_a_side_stream_and_training_waits_for_it(seed: int, fresh_steps: int) -> None:
    source = trained(0, 3)
    want = digest_components(source.capture(only=BULK))
    components = saved(source)
    target = trained(1, fresh_steps)  # another init; with or without Adam's moments made yet
    fake = FakeStreams()
    seen: list[dict] = []
    fake.kernel("compute", "last use", lambda: seen.append(digest_components(target.capture(only=BULK))))
    flight = restore_into(target, components, fake, slot_stays=True)
    assert flight is not None and not flight.finished()
    fake.kernel("compute", "training", lambda: seen.append(digest_components(target.capture(only=BULK))))
    rng = random.Random(seed)
    fake.run(lambda ready: rng.randrange(len(ready)), 10_000)
    assert flight.finished()
    assert seen[1] == want and seen[0] != want  # the next kernel saw the restored state; the last use did not
    assert digest_components(target.capture(only=BULK)) == want
    assert target.step == 3 and not [e for e in fake.log if e[0] == "sync"]  # the host never waited
    copies = [e for e in fake.log if e[0] == "copy"]
    side = {e[1] for e in copies}
    assert len(copies) == sum(1 for t in components["model"].values() if t.dim() > 0) + sum(
        1 for per in components["optimizer"]["state"].values() for t in per.values() if t.dim() > 0)
    assert side and "compute" not in side
    first_copy = fake.log.index(copies[0])
    waited = [e for e in fake.log[:first_copy] if e[0] == "wait" and e[1] in side]
    assert waited, "the copy stream did not wait for the compute stream's last use"


def test_the_host_waits_for_the_copy_stream_only_when_the_slot_goes_away() -> None:
    source = trained(0, 2)
    target = trained(1, 0)
    fake = FakeStreams()
    compute_events = set()
    record = fake.record

    def noting(stream):
        event = record(stream)
        if stream == "compute":
            compute_events.add(event.id)
        return event

    fake.record = noting  # type: ignore[method-assign]
    restore_into(target, saved(source), fake)  # the slot is unmapped after: the copies must be done
    synced = [e[1] for e in fake.log if e[0] == "sync"]
    assert synced and not set(synced) & compute_events
    assert digest_components(target.capture(only=BULK)) == digest_components(source.capture(only=BULK))


def test_a_state_on_the_host_is_restored_as_before() -> None:
    source = trained(0, 2)
    target = trained(1, 1)
    assert restore_into(target, saved(source)) is None
    assert digest_components(target.capture()) == digest_components(source.capture())
