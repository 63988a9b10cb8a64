"""A worker's session with the harness: the probe API any training script calls.

``baft run`` starts every worker — the built-in workload or a user's script
(``workload: {script: train.py, nproc: 2}``) — with ``BAFT_SPEC`` naming the
run's worker spec. A script opens a session and reports through it::

    from harness import Session

    with Session.from_env() as run:             # process group, journal, faults armed
        ckpt = run.checkpointer(state)          # the scenario's checkpoint policy for a TrainState
        start = ckpt.restore_latest()
        run.restored(start, state)              # fingerprint the state it resumes from
        for step in range(start, run.steps):
            run.begin(step)                     # step-triggered faults fire here
            ...forward, backward, ckpt.before_optimizer_step(), optimizer step...
            state.step = step + 1
            run.end(step, loss, state)          # the loss and the fingerprints of every component
            ckpt.after_step()
        ckpt.close()

The objects whose state is fingerprinted are the ``baft.TrainState``'s: model,
optimizer, scheduler, RNGs and named generators, data position, step. Leaving
the ``with`` block disarms the faults (rolling back window faults) and, on a
normal exit, journals ``finish``.
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from baft import CheckpointConfig

from harness.errors import ScenarioError
from harness.worker.spec import SPEC_VARIABLE, LaunchFacts, WorkerSpec

__all__ = ["Session", "place_on_node"]


class Session:
    """One worker's view of the run: its spec, its journal (a :class:`~harness.worker.probe.Probe`) and
    the faults armed inside it."""

    def __init__(self, spec_path: Path) -> None:
        self.spec_path = spec_path
        self.spec = WorkerSpec.load(spec_path)
        """Everything the harness told this worker (its checkpoint config placed on this node)."""
        self.node, self.node_memory = place_on_node(self.spec.checkpoint, self.spec)
        self.probe: Any = None
        self.injectors: list[Any] = []
        self._t0 = 0.0
        self._step = 0

    @classmethod
    def from_env(cls) -> Session:
        path = os.environ.get(SPEC_VARIABLE)
        if not path:
            raise ScenarioError("<environment>", SPEC_VARIABLE, "the worker spec the harness passes (run this script "
                                "through `baft run` with workload: {script: ...})", None)
        return cls(Path(path))

    @property
    def run_dir(self) -> Path:
        return Path(self.spec.run_dir)

    @property
    def steps(self) -> int:
        """How many steps the scenario trains (``workload.steps``)."""
        return self.spec.workload.steps

    @property
    def checkpoint_config(self) -> CheckpointConfig:
        """The scenario's checkpoint policy (a ``baft.CheckpointConfig``), placed on this node."""
        return self.spec.checkpoint

    def start(self, join_group: bool = True) -> Session:
        """Join the process group (gloo, unless the script already did; not at all without
        ``join_group``: an unmodified script forms its own), open the journal, arm the faults."""
        import torch.distributed as dist

        from analysis.journal import rank_journal, read_events
        from harness.worker.probe import Probe
        from injectors import FAULTS, WorkerContext

        restart = 0  # this rank's processes before this one: read from its journal only for a fault in a restore
        if any(getattr(f.config, "at_restore", None) is not None for f in self.spec.faults):
            journal = rank_journal(self.run_dir, int(os.environ.get("RANK", "0")))
            restart = sum(e.get("event") == "start" for e in read_events(journal)) if journal.is_file() else 0
        init_seconds = 0.0
        if join_group and not dist.is_initialized():
            t = time.time()
            dist.init_process_group("gloo")
            init_seconds = time.time() - t
        self.probe = Probe.from_env(self.run_dir, init_seconds=init_seconds)
        cfg = self.checkpoint_config
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
        ctx = WorkerContext(rank=rank, fault_dir=self.run_dir / "faults", record=self.probe.record,
                            node=self.node, local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                            node_memory=self.node_memory, started_at=self.spec.started_at,
                            checkpoint_dir=Path(cfg.dir) if "://" not in cfg.dir else None, restart=restart)
        for i, fault in enumerate(self.spec.faults):
            if fault.config.site != "worker":
                continue  # driven by the harness (links between nodes)
            inj = FAULTS[fault.kind][1](fault.config, i, ctx)
            inj.arm()
            self.injectors.append(inj)
        return self

    def checkpointer(self, state: Any) -> Any:
        """A ``baft.Checkpointer`` for ``state`` with the scenario's checkpoint policy."""
        from baft import Checkpointer

        return Checkpointer(self.checkpoint_config, state)

    def restored(self, step: int, state: Any) -> None:
        """Fingerprint the state training resumes from (after ``restore_latest``)."""
        self.probe.state(step, state)

    def begin(self, step: int) -> None:
        """The start of iteration ``step``: faults keyed to (step, ``iteration``) fire here."""
        from baft import events

        self._step, self._t0 = step, time.perf_counter()
        events.emit("phase", phase="iteration", step=step)

    def end(self, step: int, loss: float | None, state: Any, seconds: float | None = None) -> None:
        """Iteration ``step`` is done: journal its loss (None on ranks without one) and fingerprint
        the state at the boundary after it."""
        elapsed = seconds if seconds is not None else time.perf_counter() - self._t0
        self.probe.step(step, loss, elapsed)
        if self.spec.probe.due(state.step, self.steps):  # ``probe.every`` (a restore is always fingerprinted)
            self.probe.state(state.step, state)
        self._step = step + 1

    def preemption(self) -> Any:
        """Note SIGTERM from now on instead of dying of it (a preemption; call it from the main thread):
        returns a ``harness.worker.preemption.TermSignal`` whose ``agreed()`` every rank calls at the same
        point of each step (one small collective) and which says whether any rank got the signal — then save
        and leave, together, as the built-in workload does::

            term = run.preemption()
            for step in range(start, run.steps):
                ...
                if term.agreed():
                    ckpt.flush()     # or the script's own save
                    break
        """
        from harness.worker.preemption import TermSignal

        return TermSignal()

    def disarm(self) -> None:
        for inj in self.injectors:
            inj.disarm()  # rolls back window faults, also on the way out of a crash
        self.injectors = []

    def close(self, step: int | None = None) -> None:
        """Disarm the faults, wait for every rank, journal ``finish``, leave the process group."""
        import torch.distributed as dist

        self.disarm()
        dist.barrier()
        self.probe.close(self._step if step is None else step)
        dist.destroy_process_group()

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self.disarm()


def place_on_node(ckpt_cfg: CheckpointConfig, spec: LaunchFacts) -> tuple[int, Path | None]:
    """This worker's node index and shared-memory directory; points a baft config at them.

    The launcher sets ``BAFT_NODE_INDEX`` and, when it runs node stores, puts their
    addresses and the run's memory directory into the spec; the per-node values are
    filled in here because only the worker knows its node.
    """
    node = int(os.environ.get("BAFT_NODE_INDEX", "0"))
    node_memory = Path(spec.node_memory) / f"node{node}" if spec.node_memory else None
    if node_memory is not None and spec.stores is not None:  # the spec has both or neither
        # a new section, not the one given changed: a config made by replace() shares its sections with another
        ckpt_cfg.baft = dataclasses.replace(ckpt_cfg.baft, shm_dir=str(node_memory), store=spec.stores[node], node=node)
    return node, node_memory
