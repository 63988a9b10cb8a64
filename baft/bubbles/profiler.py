"""Measure each pipeline stage's compute spans and idle windows, every iteration.

A stage idles whenever the schedule waits for a send or receive to finish (the
pipeline bubbles; gloo waits sleep, so the CPU is really free). The profiler
wraps the stage's ``forward_one_chunk`` / ``backward_one_chunk`` and the
schedule module's p2p wait helper — at most a wrapper around the user's stage
and schedule, nothing re-implemented — and records per iteration:

* compute spans (forward and backward per microbatch, and the optimizer step,
  timed with the optimizer's own step hooks),
* idle windows: each wait, by its position in the iteration (the k-th wait of
  every iteration is the same place in a static schedule), with offset and
  duration.

After ``warmup`` iterations it reports the expected windows (an exponential
moving average per position) and keeps measuring: when the idle time drifts
from what the current plan was made for — by more than ``drift_threshold`` for
``patience`` iterations in a row, or when the number of windows changes — it
says so, with the reason, so the planner can re-plan. BAFT's paper profiles
only at the start; timings drift (data-loader jitter, a slowed rank, a new
batch size), so this never stops.

Other code (the copy engine) can listen to wait enter/exit to use the windows.

On CUDA the host's clock around a launch measures the launch: :meth:`BubbleProfiler.use_device` hands
the timing to a device timer (:class:`baft.device.timer.DeviceTimer`, events on the stage's
stream) from the next iteration on; its profiles arrive one iteration late. CPU tensors keep the host
clock.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from baft.errors import BaftConfigError, BaftError


@dataclass(kw_only=True, slots=True)
class ProfilerConfig:
    """How idle windows are measured and when a drift triggers a re-plan."""

    warmup: int = 3
    """Iterations measured before the first plan."""
    drift_threshold: float = 0.3
    """Relative change of an iteration's total idle time against the plan's that counts as drift."""
    patience: int = 3
    """Consecutive drifted iterations before a re-plan."""
    smoothing: float = 0.3
    """Weight of the newest iteration in the moving average of each window."""

    def __post_init__(self) -> None:
        if self.warmup < 1:
            raise BaftConfigError("warmup", "an integer >= 1", self.warmup)
        if not self.drift_threshold > 0:
            raise BaftConfigError("drift_threshold", "a number > 0", self.drift_threshold)
        if self.patience < 1:
            raise BaftConfigError("patience", "an integer >= 1", self.patience)
        if not 0 < self.smoothing <= 1:
            raise BaftConfigError("smoothing", "a number in (0, 1]", self.smoothing)


@dataclass(frozen=True, slots=True)
class Span:
    """One timed span of an iteration, seconds relative to its start."""

    kind: str  # forward, backward, backward_weight, optimizer, wait, snapshot (inline work at a wait's start)
    index: int  # microbatch for compute, position for waits
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(slots=True)
class IterationProfile:
    """Everything measured in one iteration of one stage."""

    step: int
    spans: list[Span] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def windows(self) -> list[float]:
        return [s.duration for s in self.spans if s.kind == "wait"]

    @property
    def idle(self) -> float:
        return sum(self.windows)

    @property
    def compute(self) -> float:
        return sum(s.duration for s in self.spans if s.kind not in ("wait", "snapshot"))


class SpanTimer(Protocol):
    """Times spans on the device (:class:`baft.device.timer.DeviceTimer`)."""

    def begin_iteration(self, step: int) -> None: ...

    def start(self) -> Any: ...

    def stop(self, kind: str, index: int, start: Any) -> None: ...

    def end_iteration(self) -> list[IterationProfile]: ...


#: A wait shorter than this after inline work means it did not block: the work overran.
BLOCKED = 50e-6
OVERRUN_SHRINK = 0.75

WaitListener = Callable[[bool, int], None]
"""``listener(entering, window_index)``: called when a wait starts (True) and ends (False)."""


#: The torch releases whose ``torch.distributed.pipelining`` baft's profiler was run on (CI: 2.13; the lent
#: GPU machines and ``tox -e torch211``: 2.11). Another release is checked by :func:`check_pipelining` at attach.
TESTED_TORCH = ("2.11", "2.13")


def _names_in(code: Any) -> set[str]:
    """The global names a code object and every function nested in it look up."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names_in(const)
    return names


def check_pipelining(schedules: Any) -> None:
    """Raise :class:`BaftError` where this torch's pipelining lacks what the profiler wraps (a private
    helper): its waits would go unseen, and baft would copy in no bubble at all, silently. Two things must hold:
    ``schedules._wait_batch_p2p`` exists, and a schedule's code calls it by that module-level name (so the
    wrapper placed there is the one called)."""
    import torch

    version = torch.__version__.split("+")[0]
    helper = getattr(schedules, "_wait_batch_p2p", None)
    users = [f"{obj.__name__}.{name}" for obj in vars(schedules).values() if isinstance(obj, type)
             for name, fn in vars(obj).items()
             if hasattr(fn, "__code__") and "_wait_batch_p2p" in _names_in(fn.__code__)]
    if callable(helper) and users:
        return
    raise BaftError(
        f"baft's bubble profiler does not support torch {version}: it times a pipeline stage's waits by wrapping "
        "torch.distributed.pipelining.schedules._wait_batch_p2p, which this release "
        + ("lacks" if not callable(helper) else "has but no schedule calls")
        + f" (run on torch {', '.join(TESTED_TORCH)}); use one of those, or a strategy without bubbles "
        "(sync, async-dcp, checkfreq)")


def _check_stage(stage: Any) -> None:
    """A ``PipelineStage`` must have the compute methods the profiler times (else its spans go unseen)."""
    import torch

    try:
        from torch.distributed.pipelining.stage import _PipelineStageBase
    except ImportError:
        return
    if isinstance(stage, _PipelineStageBase) and not any(
            callable(getattr(stage, n, None)) for n in ("forward_one_chunk", "backward_one_chunk")):
        raise BaftError(f"baft's bubble profiler does not support torch {torch.__version__.split('+')[0]}: its "
                        f"{type(stage).__name__} has no forward_one_chunk/backward_one_chunk to time "
                        f"(run on torch {', '.join(TESTED_TORCH)})")


class _WaitHook:
    """The process-wide wrapper of ``torch.distributed.pipelining.schedules._wait_batch_p2p``.

    Waits go to one profiler: the one whose iteration is running (:meth:`activate`, at each
    ``begin_iteration``), so several checkpointers attached to one stage (a benchmark's arms
    taking turns) each see the waits of their own iterations."""

    _lock = threading.Lock()
    _original: Callable[..., Any] | None = None
    _active: BubbleProfiler | None = None
    _installed: list[BubbleProfiler] = []

    @classmethod
    def install(cls, profiler: BubbleProfiler) -> None:
        from torch.distributed.pipelining import schedules

        check_pipelining(schedules)
        with cls._lock:
            if cls._original is None:
                cls._original = schedules._wait_batch_p2p
                original = cls._original

                def wait(work: list[Any]) -> None:
                    prof = cls._active
                    if prof is None or not work:
                        original(work)
                        return
                    with prof.waiting():
                        original(work)

                schedules._wait_batch_p2p = wait
            if profiler not in cls._installed:
                cls._installed.append(profiler)
            cls._active = profiler

    @classmethod
    def activate(cls, profiler: BubbleProfiler) -> None:
        """Send the waits to ``profiler`` (one that is installed) from now on."""
        if cls._active is not profiler:
            with cls._lock:
                if profiler in cls._installed:
                    cls._active = profiler

    @classmethod
    def uninstall(cls, profiler: BubbleProfiler) -> None:
        from torch.distributed.pipelining import schedules

        with cls._lock:
            if profiler in cls._installed:
                cls._installed.remove(profiler)
            if cls._active is profiler:
                cls._active = cls._installed[-1] if cls._installed else None
            if cls._original is not None and not cls._installed:
                schedules._wait_batch_p2p = cls._original
                cls._original = None


class BubbleProfiler:
    """Profiles one pipeline stage. The wait hook is process-wide: with several profilers on one
    stage, the one whose iteration began last receives the waits."""

    def __init__(self, config: ProfilerConfig | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.config = config or ProfilerConfig()
        self.clock = clock
        self.listeners: list[WaitListener] = []
        self.history: list[IterationProfile] = []
        self.expected: list[float] | None = None
        """Moving average of each window's duration (None until warm-up is done)."""
        self.baseline: list[float] | None = None
        """The windows the current plan was made for."""
        self._current: IterationProfile | None = None
        self._t0 = 0.0
        self._wait_index = 0
        self._drifted = 0
        self.overruns = 0
        """Waits whose inline work outlasted the transfer (see :meth:`waiting`)."""
        self._originals: list[tuple[Any, str, Callable[..., Any]]] = []
        self._hooks: list[Any] = []
        self._opt_start = 0.0
        self._opt_mark: Any = None
        self.device: SpanTimer | None = None
        """Times the spans on the device instead of the host's clock (see :meth:`use_device`)."""
        self._next_device: SpanTimer | None = None
        self._fresh = True  # the last end_iteration brought a profile (the device's come one iteration late)

    def use_device(self, timer: SpanTimer) -> None:
        """Time the spans with ``timer`` from the next :meth:`begin_iteration` on."""
        self._next_device = timer

    # -- attaching -------------------------------------------------------------------------
    def attach(self, stage: Any) -> None:
        """Wrap the compute methods of a ``PipelineStage`` (or of each stage in a list, for
        interleaved schedules) and the schedule's wait helper."""
        for st in stage if isinstance(stage, (list, tuple)) else [stage]:
            _check_stage(st)
            for name, kind in (("forward_one_chunk", "forward"), ("backward_one_chunk", "backward"),
                               ("backward_weight_one_chunk", "backward_weight")):
                fn = getattr(st, name, None)
                if fn is None:
                    continue
                self._originals.append((st, name, fn))
                setattr(st, name, self._timed(fn, kind))
        _WaitHook.install(self)

    def attach_optimizer(self, optimizer: Any) -> None:
        """Time each optimizer step as an ``optimizer`` span (torch's step pre/post hooks)."""

        def pre(*_: Any) -> None:
            if self.device is not None:
                self._opt_mark = self.device.start()
                return
            self._opt_start = self.clock()

        def post(*_: Any) -> None:
            if self.device is not None:
                self.device.stop("optimizer", 0, self._opt_mark)
                return
            self._span("optimizer", 0, self._opt_start, self.clock())

        self._hooks += [optimizer.register_step_pre_hook(pre), optimizer.register_step_post_hook(post)]

    def detach(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for st, name, fn in self._originals:
            setattr(st, name, fn)
        self._originals.clear()
        _WaitHook.uninstall(self)

    def _timed(self, fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
        def wrapper(mb_index: int, *args: Any, **kwargs: Any) -> Any:
            device = self.device
            if device is not None:
                mark = device.start()
                try:
                    return fn(mb_index, *args, **kwargs)
                finally:
                    device.stop(kind, mb_index, mark)
            t = self.clock()
            try:
                return fn(mb_index, *args, **kwargs)
            finally:
                self._span(kind, mb_index, t, self.clock())

        return wrapper

    # -- recording -------------------------------------------------------------------------
    def _span(self, kind: str, index: int, start: float, end: float) -> None:
        if self._current is not None:
            self._current.spans.append(Span(kind, index, start - self._t0, end - self._t0))

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Mark the calling thread as idle (waiting on the pipeline) for the duration.

        Listeners may work inline when the wait starts (the inline copier). The
        window is then measured from the start: if the wait still blocked after
        the work, the transfer ended when it returned and the window is exact;
        if it returned at once, the work overran a window of unknown length, and
        the window is recorded as ``OVERRUN_SHRINK`` of the work time, so the
        next plan asks for less instead of feeding on its own overruns.
        """
        index = self._wait_index
        self._wait_index += 1
        if self.device is not None:
            with self._device_wait(self.device, index):
                yield
            return
        t0 = self.clock()
        for fn in self.listeners:
            fn(True, index)
        t1 = self.clock()
        try:
            yield
        finally:
            t2 = self.clock()
            for fn in self.listeners:
                fn(False, index)
            if t1 > t0:
                self._span("snapshot", index, t0, t1)
            if t1 > t0 and t2 - t1 < BLOCKED:
                self.overruns += 1
                self._span("wait", index, t0, t0 + (t1 - t0) * OVERRUN_SHRINK)
            else:
                self._span("wait", index, t0, t2)

    @contextmanager
    def _device_wait(self, device: SpanTimer, index: int) -> Iterator[None]:
        """:meth:`waiting` on the device: the wait's span is the stream's (the host's inline work is
        launches only, so no snapshot span and no overrun)."""
        for fn in self.listeners:
            fn(True, index)
        mark = device.start()
        try:
            yield
        finally:
            device.stop("wait", index, mark)
            for fn in self.listeners:
                fn(False, index)

    def begin_iteration(self, step: int) -> None:
        if self._next_device is not None:
            self.device, self._next_device = self._next_device, None
        if self.device is not None:
            self.device.begin_iteration(step)
        _WaitHook.activate(self)
        self._t0 = self.clock()
        self._wait_index = 0
        self._current = IterationProfile(step=step)

    def end_iteration(self) -> IterationProfile:
        """The iteration's profile; on the device, the newest one read back (an earlier iteration's;
        ``step`` -1 while none is)."""
        if self.device is not None:
            return self._end_device(self.device)
        prof = self._current or IterationProfile(step=-1)
        prof.seconds = self.clock() - self._t0
        self._current = None
        self.history.append(prof)
        if len(self.history) > 64:
            del self.history[:-64]
        self._update(prof.windows)
        return prof

    def _end_device(self, device: SpanTimer) -> IterationProfile:
        self._current = None
        ready = device.end_iteration()
        for prof in ready:
            self.history.append(prof)
            self._update(prof.windows)
        if len(self.history) > 64:
            del self.history[:-64]
        self._fresh = bool(ready)
        return ready[-1] if ready else IterationProfile(step=-1)

    def _update(self, windows: list[float]) -> None:
        a = self.config.smoothing
        if self.expected is None or len(self.expected) != len(windows):
            self.expected = list(windows)
        else:
            self.expected = [a * w + (1 - a) * e for w, e in zip(windows, self.expected)]

    # -- planning signals -------------------------------------------------------------------
    @property
    def warm(self) -> bool:
        return len(self.history) >= self.config.warmup

    def drift(self) -> str | None:
        """A reason to re-plan, or None. Call once per iteration, after :meth:`end_iteration`."""
        if not self.warm or self.expected is None or not self._fresh:
            return None
        if self.baseline is None:
            return "initial profile"
        last = self.history[-1].windows
        if len(last) != len(self.baseline):
            self._drifted = 0
            return f"window count changed: {len(self.baseline)} -> {len(last)}"
        # The plan depends on how much idle time there is to fill; single windows and
        # single iterations are noisy, so compare the smoothed idle total, and require
        # ``patience`` drifted iterations in a row.
        total = max(sum(self.baseline), 1e-6)
        change = abs(sum(self.expected) - sum(self.baseline)) / total
        self._drifted = self._drifted + 1 if change > self.config.drift_threshold else 0
        if self._drifted >= self.config.patience:
            self._drifted = 0
            return (f"windows drifted {change:.0%} for {self.config.patience} iterations: idle "
                    f"{sum(self.baseline) * 1e3:.1f} ms -> {sum(self.expected) * 1e3:.1f} ms per iteration")
        return None

    def accept(self) -> list[float]:
        """Adopt the current expected windows as the baseline of a new plan; returns them."""
        self.baseline = list(self.expected or [])
        return self.baseline
