"""Known checkpoint bugs, planted on purpose to prove the harness catches each one.

``workload: {mutant: NAME}`` makes the faulted run's workers patch one piece of
``baft`` (or of the workload's data pipeline) before training starts; the
reference run and ``baft`` itself stay untouched. Each mutant is a real bug
class seen in training stacks, implemented where it would live:

=================================  ============================================================
``rng-not-restored``               the process RNGs (python, numpy, torch) are not set on restore
``loader-generator-not-restored``  the data loader's own ``torch.Generator`` is not set on restore
``sampler-position-lost``          the sampler restarts its epoch instead of resuming mid-epoch
``scheduler-lost``                 the LR scheduler's state is not loaded
``optimizer-lost``                 the optimizer's state (Adam moments, step) is not loaded
``torn``                           params of step S are saved with the optimizer of the previous save
``latest-before-durable``          ``latest`` moves before the shards are written, and restore trusts it
``stale-replica``                  baft restores a peer's replica although a newer persistent copy exists
``silent-bitflip``                 restore skips the shard checksums, so a flipped byte loads silently
``scaler-not-restored``            the fp16 loss scaler's scale and growth tracker are not loaded
=================================  ============================================================

``scenarios/mutants/`` holds one scenario per mutant whose ``expect.caught`` says
how the verdict must catch it (the component of the first divergence, or the
failure); the same scenario without the mutant passes.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

MUTANTS: dict[str, str] = {
    "rng-not-restored": "the process RNGs are not restored",
    "loader-generator-not-restored": "the data loader's generator is not restored",
    "sampler-position-lost": "the sampler's position is lost",
    "scheduler-lost": "the LR scheduler's state is lost",
    "optimizer-lost": "the optimizer's state is lost",
    "torn": "params and optimizer saved from two different steps",
    "latest-before-durable": "'latest' advanced before the shards are durable, and trusted on restore",
    "stale-replica": "a stale peer replica preferred over a newer persistent checkpoint",
    "silent-bitflip": "shard checksums not verified on restore",
    "scaler-not-restored": "the mixed-precision loss scaler's state is not loaded",
}


def _rng(skip_processes: bool) -> None:
    from baft.state import train as st

    original = st.set_rng_state

    def set_rng_state(state: Any, generators: Any = None) -> None:
        if skip_processes:  # only the named generators
            for name, gen in (generators or {}).items():
                gen.set_state(state[f"generator.{name}"])
        else:
            original(state, None)

    st.set_rng_state = set_rng_state


def _loader_generator_lost() -> None:
    """Neither the RNG restore nor the sampler (which shares the loader's generator and would set
    it to the start of its epoch) touches the loader's generator: it keeps its fresh state."""
    from harness.worker.data import ResumableBatchSampler

    _rng(skip_processes=False)

    def load_state_dict(self: ResumableBatchSampler, state: Any) -> None:
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
        self._epoch_generator_state, self._perm = None, None

    ResumableBatchSampler.load_state_dict = load_state_dict  # type: ignore[method-assign]


def _drop_on_restore(component: str) -> None:
    from baft.state.train import TrainState

    original = TrainState.restore

    def restore(self: TrainState, components: Any) -> None:
        original(self, {k: v for k, v in components.items() if k != component})

    TrainState.restore = restore  # type: ignore[method-assign]


def _sampler_lost() -> None:
    from harness.worker.data import ResumableBatchSampler

    ResumableBatchSampler.load_state_dict = lambda self, state: None  # type: ignore[method-assign]


def _torn() -> None:
    from baft.strategies.sync.strategy import SyncStrategy

    original = SyncStrategy.save
    previous: dict[int, Any] = {}

    def save(self: SyncStrategy, step: int) -> None:
        capture = self.state.capture

        def torn_capture(*args: Any, **kwargs: Any) -> dict[str, Any]:
            out = capture(*args, **kwargs)
            now = copy.deepcopy(out.get("optimizer"))
            if id(self) in previous and "optimizer" in out:
                out["optimizer"] = previous[id(self)]  # the optimizer as of the previous save
            previous[id(self)] = now
            return out

        self.state.capture = torn_capture  # type: ignore[method-assign]
        try:
            original(self, step)
        finally:
            del self.state.capture

    SyncStrategy.save = save  # type: ignore[method-assign]


def _latest_before_durable() -> None:
    from baft.mesh.collective import rank_world
    from baft.persist import commits as persist
    from baft.persist import storage
    from baft.strategies.sync.strategy import SyncStrategy

    original_save = SyncStrategy.save

    def save(self: SyncStrategy, step: int) -> None:
        if rank_world()[0] == 0:
            storage.at(self.root).write(persist.LATEST, str(step).encode())  # before anything is written
        original_save(self, step)

    def committed_steps(root: Any) -> list[int]:
        top = persist.latest(root)
        return [top] if top is not None else []  # "latest" is trusted as it is

    def read_shard(root: Any, step: int, rank: int, world_size: int) -> bytes:
        return storage.at(root).read(f"{persist.step_name(step)}/{persist.shard_name(rank)}")

    SyncStrategy.save = save  # type: ignore[method-assign]
    persist.committed_steps = committed_steps
    persist.read_shard = read_shard


def _stale_replica() -> None:
    from baft.strategies.baft import strategy

    strategy.persistent_floor = lambda root: -1  # any shared-memory or peer version beats the disk


def _silent_bitflip() -> None:
    from baft.persist import commits as persist
    from baft.persist import storage

    def read_shard(root: Any, step: int, rank: int, world_size: int) -> bytes:
        rec = persist.read_manifest(root, step)["shards"][str(rank)]
        return storage.at(root).read(f"{persist.step_name(step)}/{rec['file']}")  # no size or checksum check

    persist.read_shard = read_shard


_APPLY: dict[str, Callable[[], None]] = {
    "rng-not-restored": lambda: _rng(skip_processes=True),
    "loader-generator-not-restored": _loader_generator_lost,
    "sampler-position-lost": _sampler_lost,
    "scheduler-lost": lambda: _drop_on_restore("scheduler"),
    "optimizer-lost": lambda: _drop_on_restore("optimizer"),
    "torn": _torn,
    "latest-before-durable": _latest_before_durable,
    "stale-replica": _stale_replica,
    "silent-bitflip": _silent_bitflip,
    "scaler-not-restored": lambda: _drop_on_restore("scaler"),
}


def apply(name: str) -> None:
    """Plant mutant ``name`` in this process (a worker of the faulted run)."""
    _APPLY[name]()
