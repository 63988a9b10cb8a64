"""The accelerate adapter: the boot module wraps three methods of ``accelerate.Accelerator`` when
``accelerate.accelerator`` is first imported.

- ``prepare``: the models it returns (wrapped for DDP where the job is distributed) are the model the
  probe fingerprints;
- ``save_state``: ``phase: save`` fires as it begins. Without the adapter the save phase is seen at the
  first ``torch.save`` of the checkpoint, which with accelerate's default ``safe_serialization`` comes
  after the model's weights were written with safetensors: a kill there could not land before them;
- ``load_state``: the directory it restored the job from is named in the resume point's description
  (accelerate keeps no training step of its own: where the job resumed comes from the state matched
  against the reference's, or the optimizer's own step count).
"""
from __future__ import annotations

import functools
import os
from typing import Any

import torch

from harness.worker import hooks


def _models(prepared: Any) -> list[torch.nn.Module]:
    items = prepared if isinstance(prepared, tuple) else (prepared,)
    return [m for m in items if isinstance(m, torch.nn.Module)]


def _shown(input_dir: Any) -> str:
    """The checkpoint directory as the script named it, relative to its working directory when inside it."""
    if input_dir is None:
        return "its newest checkpoint"
    path = os.path.abspath(os.fspath(input_dir))
    return os.path.relpath(path) if path.startswith(os.getcwd() + os.sep) else path


def patch_accelerator(module: Any) -> None:
    """Wrap ``prepare``, ``save_state`` and ``load_state`` of ``module.Accelerator`` (``accelerate.accelerator``,
    just imported); inert when no probe is active."""
    accelerator = module.Accelerator
    prepare, save_state, load_state = accelerator.prepare, accelerator.save_state, accelerator.load_state

    @functools.wraps(prepare)
    def prepared(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = prepare(self, *args, **kwargs)
        if (probe := hooks.active()) is not None:
            probe.framework_models(_models(out))
        return out

    @functools.wraps(save_state)
    def saved(self: Any, *args: Any, **kwargs: Any) -> Any:
        if (probe := hooks.active()) is not None:
            probe.saving()
        return save_state(self, *args, **kwargs)

    @functools.wraps(load_state)
    def loaded(self: Any, input_dir: Any = None, *args: Any, **kwargs: Any) -> Any:
        out = load_state(self, input_dir, *args, **kwargs)
        if (probe := hooks.active()) is not None:
            probe.framework_restored("accelerate", _shown(input_dir))
        return out

    accelerator.prepare, accelerator.save_state, accelerator.load_state = prepared, saved, loaded
