"""The Hugging Face Trainer adapter: a ``TrainerCallback`` the boot module adds to every ``Trainer`` the
script creates (it wraps ``Trainer.__init__`` when ``transformers.trainer`` is first imported).

It hands the probe the Trainer's model, the ``global_step`` training starts from (after
``resume_from_checkpoint`` restored it) and its ``global_step`` after every optimizer step.
"""
from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from harness.worker import hooks


class HarnessCallback(TrainerCallback):
    """Tells the active probe what the Trainer knows."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        probe = hooks.active()
        if probe is not None:
            probe.framework_started("transformers", int(state.global_step), [model] if model is not None else None)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        probe = hooks.active()
        if probe is not None:
            probe.framework_step("transformers", int(state.global_step))


def patch_trainer(module: Any) -> None:
    """Make every ``Trainer`` of ``module`` (``transformers.trainer``, just imported) carry the callback."""
    trainer = module.Trainer
    original = trainer.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.add_callback(HarnessCallback())

    trainer.__init__ = __init__
