"""Triggers, validation and rollback of the injectors (no subprocess: events are emitted in-process)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baft import events

from injectors import FAULTS, FaultConfigError, RunShape, WorkerContext
from injectors.compute import StragglerConfig
from injectors.data import JitterConfig, JitterInjector
from injectors.process import KillConfig
from injectors.worker import InWorkerInjector, WindowInjector

RUN = RunShape(world_size=4, steps=50, nodes=2)


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    def kinds(self) -> list[str]:
        return [e for e, _ in self.events]


class Fires(InWorkerInjector):
    """A point injector that only counts (the real ones kill the process)."""

    def inject(self, fields: dict[str, Any]) -> None:
        self.ctx.record("injected", step=fields["step"])


def ctx(tmp_path: Path, rank: int = 1) -> WorkerContext:
    return WorkerContext(rank=rank, fault_dir=tmp_path / "faults", record=Recorder())


@pytest.fixture(autouse=True)
def _no_subscribers():
    events.clear()
    yield
    events.clear()


@settings(max_examples=200, deadline=None)
@given(at=st.integers(0, 49), every=st.integers(1, 20), times=st.integers(1, 6))
def test_step_trigger_fires_each_occurrence_exactly_once(at: int, every: int, times: int) -> None:
    cfg = KillConfig(rank=0, at_step=at, every=every, times=times)
    cfg.check(RUN)
    fired: set[int] = set()
    hits = []
    for step in list(range(50)) + list(range(at, 50)):  # a restart replays steps: no second firing
        for phase in ("iteration", "optimizer"):
            k = cfg.due(step, phase, 0.0, fired)
            if k is not None:
                fired.add(k)
                hits.append(step)
    assert hits == cfg.step_occurrences(50) == [s for s in range(at, 50, every)][:times]


@settings(max_examples=100, deadline=None)
@given(mtbf=st.floats(0.1, 100), seed=st.integers(0, 2**31), times=st.integers(1, 8))
def test_random_trigger_is_seeded_increasing_and_bounded(mtbf: float, seed: int, times: int) -> None:
    cfg = KillConfig(rank=0, mtbf=mtbf, seed=seed, times=times)
    cfg.check(RUN)
    ts = cfg.time_occurrences()
    assert ts == KillConfig(rank=0, mtbf=mtbf, seed=seed, times=times).time_occurrences()  # replayable
    assert len(ts) == times and all(b > a for a, b in zip(ts, ts[1:])) and ts[0] > 0
    fired: set[int] = set()
    for k, t in enumerate(ts):
        assert cfg.due(3, "iteration", t - 1e-6, fired) is None  # not before its time (k is not in fired yet)
        assert cfg.due(3, "iteration", t, fired) == k
        fired.add(k)
    assert cfg.due(3, "iteration", ts[-1] + 1e6, fired) is None


def test_mtbf_gaps_average_the_mtbf() -> None:
    ts = KillConfig(rank=0, mtbf=5.0, seed=1, times=4000).time_occurrences()
    assert 4.6 < ts[-1] / len(ts) < 5.4


@pytest.mark.parametrize(
    "fields, key, expected",
    [
        ({"rank": 0}, "at_step", "exactly one trigger"),
        ({"rank": 0, "at_step": 3, "at_time": 2.0}, "at_step", "exactly one trigger"),
        ({"rank": 0, "at_step": 50}, "at_step", "0..49"),
        ({"rank": 0, "at_step": 3, "phase": "lunch"}, "phase", "a phase of kill"),
        ({"rank": 0, "at_step": 3, "times": 2}, "times", "1 unless every"),
        ({"rank": 0, "at_time": 3.0, "every": 2}, "every", "together with at_step"),
        ({"rank": 0, "at_step": 3, "every_seconds": 2.0}, "every_seconds", "together with at_time"),
        ({"rank": 0, "mtbf": 0.0}, "mtbf", "> 0"),
        ({"rank": 4, "at_step": 3}, "rank", "0..3"),
        # a fault during a restore: the N-th restart's, at the restore or one of its steps
        ({"rank": 0, "at_restore": 1, "at_step": 3, "phase": "restore"}, "at_step", "exactly one trigger"),
        ({"rank": 0, "at_restore": 0, "phase": "restore"}, "at_restore", "an integer >= 1"),
        ({"rank": 0, "at_restore": 1}, "phase", "with at_restore, restore or a step of it"),
        ({"rank": 0, "at_step": 3, "phase": "restore_pull"}, "phase", "the trigger at_restore"),
    ],
)
def test_point_trigger_validation_names_the_field(fields: dict[str, Any], key: str, expected: str) -> None:
    with pytest.raises(FaultConfigError) as e:
        KillConfig(**fields).check(RUN)
    assert e.value.field == key and expected in e.value.expected


@pytest.mark.parametrize(
    "cls, fields, key",
    [
        (JitterConfig, {}, "from_step"),
        (JitterConfig, {"from_step": 3, "from_time": 1.0}, "from_step"),
        (JitterConfig, {"from_step": 5, "to_step": 5}, "to_step"),
        (JitterConfig, {"from_step": 5, "to_step": 51}, "to_step"),
        (JitterConfig, {"from_step": 5, "ranks": [7]}, "ranks"),
        (JitterConfig, {"from_step": 5, "dist": "uniform", "mean_ms": 5, "spread_ms": 6}, "spread_ms"),
        (StragglerConfig, {"rank": 0, "from_step": 5, "factor": 1.0}, "factor"),
        (StragglerConfig, {"rank": 0, "from_time": 5.0, "to_step": 9}, "to_step"),
    ],
)
def test_window_validation_names_the_field(cls: Any, fields: dict[str, Any], key: str) -> None:
    with pytest.raises(FaultConfigError) as e:
        cls(**fields).check(RUN)
    assert e.value.field == key


def test_point_injector_fires_once_per_run_even_across_restarts(tmp_path: Path) -> None:
    cfg = KillConfig(rank=1, at_step=4, phase="optimizer")
    first = Fires(cfg, 0, ctx(tmp_path))
    first.arm()
    for step in range(6):
        events.emit("phase", phase="iteration", step=step)
        events.emit("phase", phase="optimizer", step=step)
    first.disarm()
    assert first.ctx.record.kinds() == ["fault", "injected"]
    assert first.ctx.record.events[0][1]["step"] == 4 and first.ctx.record.events[0][1]["fatal"] is True
    restarted = Fires(cfg, 0, ctx(tmp_path))  # same fault dir: the marker survives the "restart"
    restarted.arm()
    for step in range(3, 6):
        events.emit("phase", phase="optimizer", step=step)
    assert restarted.ctx.record.kinds() == []


def test_point_injector_ignores_other_ranks(tmp_path: Path) -> None:
    inj = Fires(KillConfig(rank=1, at_step=0), 0, ctx(tmp_path, rank=0))
    inj.arm()
    events.emit("phase", phase="iteration", step=0)
    assert inj.ctx.record.kinds() == []


def test_a_microbatch_phase_fires_at_the_first_microbatch_and_a_weight_pass_at_the_first_one(tmp_path: Path) -> None:
    """forward/backward: microbatch 0 only; backward_weight: the step's first weight pass, whichever microbatch (a
    zero-bubble schedule may give a rank weight passes for its last microbatches only)."""
    backward = Fires(KillConfig(rank=1, at_step=2, phase="backward"), 0, ctx(tmp_path))
    weight = Fires(KillConfig(rank=1, at_step=2, phase="backward_weight"), 1, ctx(tmp_path))
    backward.arm()
    weight.arm()
    for mb in (7, 6, 0):
        events.emit("phase", phase="backward", step=2, microbatch=mb)
        events.emit("phase", phase="backward_weight", step=2, microbatch=mb)
    def fired_at(inj: Fires) -> list[int]:
        assert inj.ctx.record.kinds().count("injected") == 1
        return [f["microbatch"] for kind, f in inj.ctx.record.events if kind == "fault"]

    assert fired_at(backward) == [0]  # the last emitted
    assert fired_at(weight) == [7]  # the first emitted, and only it
    assert backward.fired() == {0} and weight.fired() == {0}


def test_a_restore_fault_fires_in_its_restarts_restore_only(tmp_path: Path) -> None:
    """``at_restore: 2``: in the second restarted process of the rank, at the phase named; not in the first
    process nor the first restart, and once."""
    cfg = KillConfig(rank=1, at_restore=2, phase="restore_pull")
    cfg.check(RUN)
    fired: list[int] = []
    for restart in (0, 1, 2, 2, 3):
        inj = Fires(cfg, 0, WorkerContext(rank=1, fault_dir=tmp_path / "faults", record=Recorder(), restart=restart))
        inj.arm()
        events.emit("phase", phase="restore_locate", step=-1, tier="shm")
        events.emit("phase", phase="restore_pull", step=8, tier="peer")
        events.emit("phase", phase="restore", step=8, tier="peer")
        if inj.ctx.record.kinds().count("injected"):
            fired.append(restart)
        inj.disarm()
    assert fired == [2]  # the second process with restart 2 (say, a restart of the restart) finds it fired
    assert cfg.expected_occurrences(50) is None  # it depends on the restarts


class Window(WindowInjector):
    def begin(self) -> None:
        self.ctx.record("begin")

    def end(self) -> None:
        self.ctx.record("end")


def test_window_fault_opens_closes_and_is_rolled_back_once(tmp_path: Path) -> None:
    inj = Window(StragglerConfig(rank=1, from_step=3, to_step=6), 0, ctx(tmp_path))
    inj.arm()
    for step in range(10):
        events.emit("phase", phase="iteration", step=step)
    inj.disarm()
    assert inj.ctx.record.kinds() == ["fault", "begin", "end", "fault_rollback"]
    assert inj.ctx.record.events[0][1]["step"] == 3 and inj.ctx.record.events[3][1]["step"] == 6


def test_disarm_rolls_back_an_open_window(tmp_path: Path) -> None:
    inj = Window(StragglerConfig(rank=1, from_step=3), 0, ctx(tmp_path))
    inj.arm()
    for step in range(5):
        events.emit("phase", phase="iteration", step=step)
    inj.disarm()  # what the worker's finally does, also on its way out of a crash
    assert inj.ctx.record.kinds()[-2:] == ["end", "fault_rollback"]
    assert inj.ctx.record.events[-1][1]["reason"] == "run ended"


def test_jitter_delays_only_inside_its_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("injectors.data.time.sleep", slept.append)
    cfg = JitterConfig(ranks=[1], dist="constant", mean_ms=20, from_step=2, to_step=4)
    inj = JitterInjector(cfg, 0, ctx(tmp_path))
    inj.arm()
    for step in range(6):
        events.emit("phase", phase="iteration", step=step)
        events.emit("phase", phase="data", step=step)
    inj.disarm()
    assert slept == [0.02, 0.02]
    assert ("jitter_summary", {"id": 0, "batches": 2, "delay_seconds": 0.04}) in inj.ctx.record.events


@settings(max_examples=50, deadline=None)
@given(dist=st.sampled_from(["constant", "uniform", "lognormal", "periodic"]), seed=st.integers(0, 1000),
       mean=st.floats(0, 500), rank=st.integers(0, 3), step=st.integers(0, 49))
def test_jitter_delay_is_a_pure_function(dist: str, seed: int, mean: float, rank: int, step: int) -> None:
    cfg = JitterConfig(dist=dist, seed=seed, mean_ms=mean, spread_ms=mean / 2, from_step=0)
    d = cfg.delay(rank, step)
    assert d == JitterConfig(dist=dist, seed=seed, mean_ms=mean, spread_ms=mean / 2, from_step=0).delay(rank, step)
    assert d >= 0


def test_lognormal_jitter_has_the_requested_mean() -> None:
    cfg = JitterConfig(dist="lognormal", mean_ms=20, sigma=0.5, from_step=0)
    ds = [cfg.delay(0, s) for s in range(20000)]
    assert 0.019 < sum(ds) / len(ds) < 0.021


def test_every_registered_fault_documents_its_fields() -> None:
    import dataclasses

    for kind, (cfg, _) in FAULTS.items():
        assert cfg.kind == kind and cfg.__doc__
        for f in dataclasses.fields(cfg):
            assert f.name in (cfg.__doc__ or "") or _field_doc(cfg, f.name), f"{kind}.{f.name} has no docstring"


def _field_doc(cls: type, name: str) -> bool:
    import inspect

    for klass in cls.__mro__:
        try:
            src = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        lines = src.splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith(f"{name}:") and i + 1 < len(lines) and lines[i + 1].strip().startswith('"""'):
                return True
    return False


def test_a_window_reports_what_its_injectors_journaled_summed_over_ranks_and_restarts(tmp_path: Path) -> None:
    """The verdict's window effects are the summaries' own fields: the journal reader's bookkeeping
    (incarnation, world: the world size it stamps on every event) is not an effect to add up."""
    from analysis.journal import Journal, JournalWriter, rank_journal
    from analysis.metrics import windows

    run = tmp_path / "run"
    for rank in (0, 1):
        w = JournalWriter(rank_journal(run, rank), rank=rank, attempt=0)
        for incarnation in (0, 1):  # a restart in the window: its summary adds to the first one's
            w.write("start", world_size=2)
            w.write("fault", fault="slow_storage", id=0, fatal=False, from_step=4, step=4 + 8 * incarnation)
            w.write("slow_storage_summary", id=0, writes=2, delay_seconds=0.8)
            w.write("fault_rollback", fault="slow_storage", id=0, step=10 + 9 * incarnation, reason="run ended")
        w.close()
    (window,) = windows(Journal.load(run))
    assert window.from_step == 4 and window.to_step == 19
    assert window.effects == {"writes": 8, "delay_seconds": 3.2}
    assert window.effect == "writes 8, delay seconds 3.2"
