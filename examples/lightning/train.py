"""A PyTorch Lightning training script as Lightning users write it (no harness import).

    torchrun --nproc-per-node 2 train.py --root runs/lit --max-steps 24 --every 5

A small regression model with dropout on CPU DDP (two processes), checkpointed by
``ModelCheckpoint(every_n_train_steps=...)`` (and ``last.ckpt``), resumed with
``fit(ckpt_path="last")``, which is Lightning's way to continue from the newest checkpoint.
"""
from __future__ import annotations

import argparse

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                       torch.nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):  # noqa: ANN201 - Lightning's own signature
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", default="lightning_runs")
    p.add_argument("--max-steps", type=int, default=24)
    p.add_argument("--every", type=int, default=5)
    args = p.parse_args()

    L.seed_everything(0, workers=True)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(256, 16, generator=g), torch.randn(256, 4, generator=g))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    ckpt = ModelCheckpoint(dirpath=f"{args.root}/checkpoints", every_n_train_steps=args.every, save_last=True,
                           save_top_k=-1)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=args.max_steps,
                        callbacks=[ckpt], default_root_dir=args.root, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, deterministic=True)
    trainer.fit(Regressor(), loader, ckpt_path="last")


if __name__ == "__main__":
    main()
