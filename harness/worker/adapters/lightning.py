"""The PyTorch Lightning adapter: a Callback that Lightning loads itself, through the
``lightning.pytorch.callbacks_factory`` entry point of this package, in every Trainer. It is inert
unless the boot module's probe is installed and the adapter is enabled.

It hands the probe the ``LightningModule`` as the model, the ``global_step`` the Trainer starts from
(after ``fit(ckpt_path=...)`` restored it) and its ``global_step`` after every batch, to check the
probe's count against.
"""
from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl

from harness.worker import hooks
from harness.worker.spec import SPEC_VARIABLE


class HarnessCallback(pl.Callback):
    """Tells the active probe what the Trainer knows."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        probe = hooks.active()
        if probe is not None:
            probe.framework_started("lightning", int(trainer.global_step), [pl_module])

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        probe = hooks.active()
        if probe is not None:
            probe.framework_step("lightning", int(trainer.global_step))


def callbacks() -> list[pl.Callback]:
    """The entry point's factory: the callback under the harness with the adapter enabled, else none."""
    if SPEC_VARIABLE not in os.environ:  # a Trainer outside the harness: nothing to tell
        return []
    probe = hooks.active()
    return [HarnessCallback()] if probe is not None and probe.adapter_enabled("lightning") else []
