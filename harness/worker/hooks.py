"""The probe installed without the script's help: torch's own hooks tell the steps, losses and state.

:mod:`harness.worker.boot` installs :class:`ScriptProbe` before an unmodified training script runs:

- **the step**: torch's global optimizer step hooks. The first optimizer that steps in the process leads:
  one of its steps is one training step, and other optimizers' steps (a GAN's discriminator, a second
  parameter group's optimizer) belong to the step the leader takes next;
- **the loss**: what ``Tensor.backward`` is called on (a one-element tensor), summed over the backward
  calls of one step (gradient accumulation's micro-steps);
- **the state at every step**, fingerprinted in the leader's pre-step hook, when the gradients are ready
  and nothing is updated yet (a framework that steps with a closure, Lightning, runs the forward and
  backward inside the step: then before them): the models (the outermost modules holding the leader's
  parameters, found among the live objects at its first step), every optimizer's state dict, every LR scheduler (found when
  constructed), the process RNGs (python, numpy, torch, CUDA) and the batch the step trains on (the last
  one a ``DataLoader`` gave). The batch, not the loader's position: resume mechanisms that feed the same
  batches keep their positions differently (a sampler that resumes mid-epoch, a wrapper that skips the
  batches already seen, as accelerate's does), and what training reads is the batch. The state after the last step is fingerprinted in
  the leader's post-step hook. The same hooks run in the reference and in the faulted run, so both record
  the same things at the same moments;
- **faults** keyed to steps: ``iteration`` fires in the leader's pre-step hook, ``data`` when a
  ``DataLoader`` is asked for the batch, ``save`` when the script (or its framework: Lightning, the
  Hugging Face Trainer and accelerate all write through it) calls ``torch.save`` (or DCP's or safetensors'
  save) — before anything is written, so a kill there is a kill during the save. ``step`` is then the steps
  completed: a checkpoint of 10 steps is saved at step 10. ``restore`` (with ``at_restore``) fires at a
  restarted process's first load before its first step (``torch.load``, DCP's, safetensors'): a fault during
  the restart.

The step's number: counted from 0 in a fresh job. In a faulted run's restarted process the script has
restored itself from somewhere; its first state is matched against the reference's
(:func:`analysis.resume.locate`), the match is journaled (``resume_point``) and the count goes on from
the step it resumed from, so faults and records keep the reference's numbering.
"""
from __future__ import annotations

import gc
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import torch

from baft import events
from baft.state.train import rng_state

from analysis.journal import Journal
from analysis.resume import ResumePoint, locate

_ACTIVE: ScriptProbe | None = None


def active() -> ScriptProbe | None:
    """The probe the boot module installed in this process (None: not under the harness)."""
    return _ACTIVE


class ScriptProbe:
    """One worker's hooks into torch; journals through ``probe`` (a :class:`~harness.worker.probe.Probe`)."""

    def __init__(self, probe: Any, steps: int, reference: Path | None = None, every: int = 1,
                 adapters: tuple[str, ...] = ()) -> None:
        """``steps``: the steps the script is expected to take (the last one's state is recorded after
        it); ``reference``: the reference run's directory (faulted runs), matched against at the first step;
        ``every``: fingerprint every this many steps (and always at a process's first step and the end);
        ``adapters``: the framework adapters enabled (:mod:`harness.worker.adapters`)."""
        self.probe, self.steps, self.reference, self.every = probe, steps, reference, every
        self.adapters = adapters
        self._framework_start: tuple[str, int] | None = None
        self._restored_from: tuple[str, str] | None = None
        self._mismatched = False
        self.step = 0
        """The step the leader takes next (the reference's numbering)."""
        self.taken = 0
        """Steps the leader took in this process."""
        self.resume: ResumePoint | None = None
        self._leader: Any = None
        self._others: list[Any] = []
        self._schedulers: list[weakref.ref] = []
        self._roots: list[torch.nn.Module] | None = None
        self._names: tuple[tuple[tuple[int, ...], tuple[int, ...]], dict[int, str], list[Any]] | None = None
        """The leader's parameter names, keyed by the identities they were looked up for."""
        self._loss = 0.0
        self._losses = 0
        self._batch: Any = None
        self._t = time.perf_counter()
        self._spent = 0.0
        """Seconds the hooks spent in this step (fingerprints included): the probe's own cost."""
        self._undo: list[Any] = []
        self._saves: set[tuple[int, str]] = set()
        self._restore_announced = False
        self._iterator: weakref.ref | None = None
        self._fetches: dict[int, int] = {}
        self._saving = threading.local()  # .on: this thread is inside a save already

    # -- installing ----------------------------------------------------------------------------
    def install(self) -> ScriptProbe:
        global _ACTIVE
        _ACTIVE = self
        self._undo.append(_deactivate)
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        self._undo += [register_optimizer_step_pre_hook(self._pre_step), register_optimizer_step_post_hook(self._post_step)]
        self._patch(torch.Tensor, "backward", self._backward)
        from torch.optim.lr_scheduler import LRScheduler

        self._patch(LRScheduler, "__init__", self._scheduler_init)
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        self._patch(_BaseDataLoaderIter, "__next__", self._next_batch)
        original_save = torch.save
        self._patch(torch.serialization, "save", self._save)
        torch.save = torch.serialization.save  # the name scripts call
        self._undo.append(lambda: setattr(torch, "save", original_save))
        original_load = torch.load
        self._patch(torch.serialization, "load", self._load)
        torch.load = torch.serialization.load
        self._undo.append(lambda: setattr(torch, "load", original_load))
        return self

    def _patch(self, owner: Any, name: str, make: Any) -> None:
        original = owner.__dict__[name]
        setattr(owner, name, make(original))
        self._undo.append(lambda: setattr(owner, name, original))

    def uninstall(self) -> None:
        for undo in reversed(self._undo):
            undo.remove() if hasattr(undo, "remove") else undo()
        self._undo = []

    # -- what a framework adapter says ------------------------------------------------------------
    def adapter_enabled(self, name: str) -> bool:
        return name in self.adapters

    def framework_started(self, framework: str, step: int, models: list[torch.nn.Module] | None) -> None:
        """Training starts (after the framework restored itself) at ``step`` by the framework's count;
        ``models``: its model objects, fingerprinted as the model instead of the outermost modules."""
        self._framework_start = (framework, step)
        self.framework_models(models or [])

    def framework_models(self, models: list[torch.nn.Module]) -> None:
        """The framework's model objects (before the first step): fingerprinted as the model."""
        if models and self.taken == 0:
            self._roots = list(models)

    def framework_restored(self, framework: str, where: str) -> None:
        """The framework restored the job from ``where``: the resume point's description names it."""
        self._restored_from = (framework, where)

    def saving(self, how: str = "torch.save") -> None:
        """A checkpoint save begins, nothing written yet: a fault at ``phase: save`` of this step fires. The first
        save of each way in a step is journaled (``script_save``)."""
        if (self.step, how) not in self._saves:
            self._saves.add((self.step, how))
            self.probe.record("script_save", step=self.step, how=how)
        events.emit("phase", phase="save", step=self.step)

    def loading(self) -> None:
        """A restarted process loads something before its first step (its checkpoint, as a rule): the phase
        ``restore`` of this restart, once (a fault with ``at_restore`` fires there: a kill during the restart)."""
        if self.taken == 0 and getattr(self.probe, "attempt", 0) > 0 and not self._restore_announced:
            self._restore_announced = True
            events.emit("phase", phase="restore", step=self.step)

    def patch_loader(self, name: str) -> Any:
        """``then(module)`` for :func:`harness.worker.boot.after_import`: the module's ``name`` (DCP's load,
        safetensors') announces a restarted process's first load as :meth:`loading` does."""
        def then(module: Any) -> None:
            if callable(module.__dict__.get(name)):
                self._patch(module, name, self._wrap_load)
        return then

    def _load(self, original: Any) -> Any:
        return self._wrap_load(original)

    def _wrap_load(self, original: Any) -> Any:
        probe = self

        def load(*args: Any, **kwargs: Any) -> Any:
            probe.loading()
            return original(*args, **kwargs)

        return load

    def patch_saver(self, name: str, how: str) -> Any:
        """``then(module)`` for :func:`harness.worker.boot.after_import`: the module's ``name`` (a checkpoint
        writer other than ``torch.save``: DCP's, safetensors') announces its saves as :meth:`saving` does."""
        def then(module: Any) -> None:
            if callable(module.__dict__.get(name)):
                self._patch(module, name, lambda original: self._wrap_save(original, how))
        return then

    def framework_step(self, framework: str, step: int) -> None:
        """After a step: the framework's count, against the hooks' (journaled once if they disagree)."""
        if step != self.step and not self._mismatched:
            self._mismatched = True
            self.probe.record("step_mismatch", framework=framework, framework_step=step, counted=self.step)

    # -- what the hooks see --------------------------------------------------------------------
    def _backward(self, original: Any) -> Any:
        probe = self

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if tensor.numel() == 1:
                probe._loss += float(tensor.detach().float())
                probe._losses += 1
            return original(tensor, *args, **kwargs)

        return backward

    def _scheduler_init(self, original: Any) -> Any:
        probe = self

        def __init__(scheduler: Any, *args: Any, **kwargs: Any) -> None:
            original(scheduler, *args, **kwargs)
            if not any(r() is scheduler for r in probe._schedulers):
                probe._schedulers.append(weakref.ref(scheduler))

        return __init__

    def _next_batch(self, original: Any) -> Any:
        probe = self

        def __next__(it: Any) -> Any:
            fetched = probe._fetches.get(probe.step, 0)  # the step's batch fetches so far: its micro-batch
            probe._fetches = {probe.step: fetched + 1}
            events.emit("phase", phase="data", step=probe.step, microbatch=fetched)
            if probe._iterator is None or probe._iterator() is not it:  # a new pass over a loader: an epoch
                probe._iterator = weakref.ref(it)
                probe.probe.record("script_epoch", step=probe.step)
            batch = original(it)
            probe._batch = batch
            return batch

        return __next__

    def _save(self, original: Any) -> Any:
        return self._wrap_save(original, "torch.save")

    def _wrap_save(self, original: Any, how: str) -> Any:
        probe = self

        def save(*args: Any, **kwargs: Any) -> Any:
            if not getattr(probe._saving, "on", False):  # a writer calling another (DCP's metadata through
                probe._saving.on = True                   # torch.save) is one save
                try:
                    probe.saving(how)
                    return original(*args, **kwargs)
                finally:
                    probe._saving.on = False
            return original(*args, **kwargs)

        return save

    def _pre_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._leader is None:
            self._leader = optimizer
        if optimizer is not self._leader:
            if not any(o is optimizer for o in self._others):
                self._others.append(optimizer)
            return
        t0 = time.perf_counter()
        try:
            self._fingerprint_step()
        finally:
            self._spent += time.perf_counter() - t0
        events.emit("phase", phase="iteration", step=self.step)  # a fault keyed to this step fires here

    def _fingerprint_step(self) -> None:
        if self._roots is None:
            self._roots = find_models(self._leader)
        if self.taken == 0 or self.step % self.every == 0:
            components, names = self.components()
            if self.taken == 0 and self.reference is not None:
                self._locate(components, names)
            self.probe.components(self.step, components, names)

    def _post_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if optimizer is not self._leader:
            return
        now = time.perf_counter()
        self.probe.step(self.step, self._loss if self._losses else None, now - self._t, probe_seconds=self._spent,
                        backwards=self._losses)
        self.step += 1
        self.taken += 1
        if self.step == self.steps:  # the state after the last step: no pre-step hook will see it
            components, names = self.components()
            self.probe.components(self.step, components, names)
        self._t, self._loss, self._losses, self._spent = time.perf_counter(), 0.0, 0, 0.0

    # -- the state -------------------------------------------------------------------------------
    def components(self) -> tuple[dict[str, Any], dict[int, str]]:
        """The state as the hooks know it, in the probe's components; the leader's parameter names."""
        out: dict[str, Any] = {}
        if self._roots:
            many = len(self._roots) > 1
            model: dict[str, Any] = {}
            for i, root in enumerate(self._roots):
                prefix = f"{i}." if many else ""
                model.update({prefix + k: v for k, v in root.state_dict().items()})
            out["model"] = model
        names: dict[int, str] = {}
        if self._leader is not None:
            out["optimizer"] = self._leader.state_dict()
            names = self._param_names()
        if self._others:
            out["optimizers"] = {str(i + 1): o.state_dict() for i, o in enumerate(self._others)}
        schedulers = [s for r in self._schedulers if (s := r()) is not None]
        if schedulers:
            out["scheduler"] = {str(i): s.state_dict() for i, s in enumerate(schedulers)}
        out["rng"] = rng_state()
        if self._batch is not None:
            out["data"] = {"batch": self._batch}
        out["step"] = {"step": self.step}
        return out, names

    def _param_names(self) -> dict[int, str]:
        """The leader's parameters' names by their index in it (an index where no model holds one): labels of
        the optimizer's state keys, looked up again only when the leader's parameters or the models change."""
        params = [p for g in self._leader.param_groups for p in g["params"]]
        key = (tuple(map(id, params)), tuple(map(id, self._roots or ())))
        if self._names is None or self._names[0] != key:
            many = len(self._roots or ()) > 1
            by_id = {id(p): (f"{i}." if many else "") + n
                     for i, root in enumerate(self._roots or ()) for n, p in root.named_parameters()}
            # the objects ride along, so no id in the key is reused by another object while it is cached
            self._names = (key, {i: by_id.get(id(p), str(i)) for i, p in enumerate(params)},
                           [*params, *(self._roots or ())])
        return self._names[1]

    def _locate(self, components: dict[str, Any], names: dict[int, str]) -> None:
        """The first step of a process of the faulted run: where did the script resume?"""
        from baft.state.fingerprint import digest_components

        rank = self.probe.rank
        assert self.reference is not None  # asked only with a reference to match
        reference = {e["step"]: e["digests"] for e in Journal.load(self.reference).events("state", rank)}
        self.resume = locate(digest_components(components, names), reference)
        step, description = self.resume.step, self.resume.description
        if step is None and self._framework_start is not None:
            framework, step = self._framework_start
            description = f"{description}; at step {step} by {framework}'s global_step"
        if step is None and (hint := self._counted_steps()) is not None:
            step, description = hint, f"{description}; at step {hint} by the optimizer's own step count"
        if self._restored_from is not None:
            description = f"{description}; {self._restored_from[0]} restored {self._restored_from[1]}"
        if step is not None:
            self.step = step
            components["step"] = {"step": self.step}
        self.probe.record("resume_point", step=step, exact=self.resume.exact, description=description,
                          equal_at=self.resume.equal_at)

    def _counted_steps(self) -> int | None:
        """The steps the leader optimizer says it has taken (Adam's ``step``), else its first LR
        scheduler's ``last_epoch``: where a state that matches no reference step resumed, going by the
        restored counters (a job that is not deterministic matches none)."""
        counts = [int(st["step"]) for st in self._leader.state.values()
                  if isinstance(st.get("step"), (int, float, torch.Tensor))]
        if counts:
            return max(counts)
        schedulers = [s for r in self._schedulers if (s := r()) is not None]
        return int(schedulers[0].last_epoch) if schedulers else None


def _deactivate() -> None:
    global _ACTIVE
    _ACTIVE = None


def find_models(optimizer: torch.optim.Optimizer) -> list[torch.nn.Module]:
    """The outermost modules among the live objects that hold a parameter of ``optimizer`` (a DDP
    wrapper around the user's model, a LightningModule, a Trainer's model), ordered by their first such
    parameter's place in the optimizer: the same in every run of the same program."""
    order = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    owners = {id(o): o for o in gc.get_objects()
              if issubclass(type(o), torch.nn.Module) and any(id(p) in order for p in o.parameters())}
    inner = {id(c) for m in owners.values() for c in m.modules() if c is not m}
    roots = [m for m in owners.values() if id(m) not in inner]
    return sorted(roots, key=lambda m: min(order.get(id(p), len(order)) for p in m.parameters()))
