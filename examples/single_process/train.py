"""A one-process training script in the shape of many public ones (nanoGPT's among them): it turns DDP on
when torch.distributed's ``RANK`` is in its environment, reads its settings from a file relative to where it
runs (``config/train.json``), and checkpoints itself (model, optimizer, RNG, step) every few steps.

    python train.py --out-dir out --steps 20 --save-every 4

Run under torchrun with one process it would take its DDP path (on CUDA, with NCCL); the harness runs it as
``python train.py`` would (``workload.launcher: python``) and in its own directory (``workload.cwd``).
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out-dir", default="out")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--save-every", type=int, default=4)
    args = p.parse_args()
    with open(os.path.join("config", "train.json")) as f:  # relative to where the script runs
        cfg = json.load(f)
    ddp = int(os.environ.get("RANK", -1)) != -1  # the common test: "was I started by torchrun?"
    if ddp:
        dist.init_process_group(backend="nccl")
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
    else:
        device = "cpu"
    torch.manual_seed(1337)
    model = torch.nn.Sequential(torch.nn.Linear(cfg["width"], cfg["width"]), torch.nn.ReLU(),
                                torch.nn.Dropout(cfg["dropout"]), torch.nn.Linear(cfg["width"], 1)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "ckpt.pt")
    step = 0
    if os.path.exists(path):
        ckpt = torch.load(path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["rng"])
        step = ckpt["step"]
        print(f"resuming from step {step}", flush=True)
    while step < args.steps:
        g = torch.Generator().manual_seed(step)  # the batch of a step depends on the step alone
        x = torch.randn(cfg["batch"], cfg["width"], generator=g)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))  # dropout draws from torch's RNG
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % args.save_every == 0:
            tmp = path + ".tmp"
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state(),
                        "step": step}, tmp)
            os.replace(tmp, path)
    print(f"done: step {step}, loss {loss.item():.4f}", flush=True)
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
