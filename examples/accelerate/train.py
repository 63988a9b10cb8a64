"""An accelerate training loop as its users write it (no harness import).

    accelerate launch train.py --project-dir runs/acc --steps 24 --save-every 5      (or torchrun, or python)

A small MLP regression on synthetic data. ``Accelerator.save_state`` writes a checkpoint every
``--save-every`` steps into ``PROJECT/checkpoints/checkpoint_<i>`` (automatic naming: model weights with
safetensors, optimizer, scheduler, the RNG states of every process, and the step count, registered with
``register_for_checkpointing``); on start the script loads the newest one with ``load_state`` and skips
the batches of the epoch it had already seen (``skip_first_batches``), the way accelerate's examples
resume. ``--seedable-sampler``: the loader's shuffle order is saved and restored too.
"""
from __future__ import annotations

import argparse
import os
import re

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed


class Progress:
    """The step count, saved with the checkpoint (``register_for_checkpointing``)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = state["step"]


def newest_checkpoint(project_dir: str) -> str | None:
    root = os.path.join(project_dir, "checkpoints")
    found = [d for d in os.listdir(root) if re.fullmatch(r"checkpoint_\d+", d)] if os.path.isdir(root) else []
    return os.path.join(root, max(found, key=lambda d: int(d.split("_")[1]))) if found else None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--project-dir", default="acc_runs")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--seedable-sampler", action="store_true",
                   help="DataLoaderConfiguration(use_seedable_sampler=True): the shuffle order is saved and restored")
    p.add_argument("--loader-generator", action="store_true",
                   help="the DataLoader gets a torch.Generator of its own (its iterators then draw their seeds from it)")
    args = p.parse_args()

    set_seed(0)
    newest = newest_checkpoint(args.project_dir)
    config = ProjectConfiguration(project_dir=args.project_dir, automatic_checkpoint_naming=True, total_limit=3,
                                  iteration=int(newest.rsplit("_", 1)[1]) + 1 if newest else 0)
    accelerator = Accelerator(cpu=True, project_config=config,
                              dataloader_config=DataLoaderConfiguration(use_seedable_sampler=args.seedable_sampler))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 16, generator=g)
    y = x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(256, 1, generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True,
                                         generator=torch.Generator().manual_seed(2) if args.loader_generator else None)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 5))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if newest is not None:
        accelerator.load_state(newest)
    per_epoch = len(loader)
    while progress.step < args.steps:
        epoch, seen = divmod(progress.step, per_epoch)
        loader.set_epoch(epoch)
        epoch_loader = accelerator.skip_first_batches(loader, seen) if seen else loader
        for xb, yb in epoch_loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            progress.step += 1
            if progress.step % args.save_every == 0:
                accelerator.save_state()
            if progress.step >= args.steps:
                break
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
