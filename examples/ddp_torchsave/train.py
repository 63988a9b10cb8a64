"""A plain PyTorch DDP training script with its own checkpoints, as people write them (no harness import).

    torchrun --nproc-per-node 2 train.py --ckpt-dir ckpt --steps 24 --save-every 5

Every ``--save-every`` steps rank 0 writes the model, optimizer, scheduler and step to
``CKPT_DIR/last.pt`` (a temporary file renamed into place) and every rank its own RNG states to
``CKPT_DIR/rng-RANK.pt``. On start it resumes from ``last.pt`` when there is one: the epoch and the
batches already seen in it are skipped (the DistributedSampler reshuffles each epoch from its seed).
``--torn`` plants a classic bug: the optimizer is saved one step after the model, to its own file.
``--rng-with-step`` fixes a quieter one: each rank's RNG file is written before ``last.pt``, so a save cut
short (rank 0 killed as it begins ``last.pt``) leaves RNG files newer than the model; named by the
micro-batch they were saved at, the resume reads the ones of ``last.pt``'s.

``--accumulate N`` takes an optimizer step every N micro-batches, and ``--save-every`` then counts
micro-batches: a save may fall between two optimizer steps, and then holds the gradient accumulated so
far, restored on resume (``--drop-grad`` plants the bug of leaving it out).

``--save-on-sigterm`` answers a preemption the way such scripts do: the SIGTERM handler only sets a
flag; after each micro-batch the ranks all-reduce it (they receive the signal at different moments), and
once any rank has it every rank saves and the script exits with 143 (``--sigterm-exit`` another code);
``--ignore-sigterm`` ignores the signal (only the grace's SIGKILL ends it). ``--save-seconds S`` makes writing
``last.pt`` take S seconds longer (it stands in for a large checkpoint on slow storage): with a grace
period shorter than that, the per-rank RNG files are new and ``last.pt`` is still the previous save.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def atomic_save(obj: object, path: str, seconds: float = 0.0) -> None:
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    time.sleep(seconds)  # a larger checkpoint would take this long to reach the disk
    os.replace(tmp, path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt-dir", default="ckpt")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--torn", action="store_true")
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--drop-grad", action="store_true", help="leave the accumulated gradient out of a save")
    p.add_argument("--save-on-sigterm", action="store_true",
                   help="on SIGTERM (a preemption) every rank saves after the current micro-batch and exits 143")
    p.add_argument("--save-seconds", type=float, default=0.0, help="extra seconds writing last.pt takes")
    p.add_argument("--rng-with-step", action="store_true",
                   help="name each rank's RNG file by the micro-batch it was saved at, and resume from the one of "
                        "last.pt's: a save cut short (a kill as rank 0 begins last.pt) leaves no newer RNG behind")
    p.add_argument("--sigterm-exit", type=int, default=128 + signal.SIGTERM,
                   help="with --save-on-sigterm: the exit code after the save (143 by default; many scripts exit 0)")
    p.add_argument("--ignore-sigterm", action="store_true",
                   help="ignore SIGTERM (as a script does whose handler never returns control): only the grace's "
                        "SIGKILL ends it")
    p.add_argument("--step-seconds", type=float, default=0.0,
                   help="extra seconds each micro-batch takes (a larger model would)")
    p.add_argument("--loader-generator", action="store_true",
                   help="give the DataLoader a generator of its own (else each new iterator draws its seed "
                        "from the global torch RNG)")
    args = p.parse_args()
    preempted = torch.zeros(1, dtype=torch.int64)  # set by the SIGTERM handler; acted on together
    if args.save_on_sigterm:
        signal.signal(signal.SIGTERM, lambda signum, frame: preempted.fill_(1))
    elif args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(256, 16, generator=g), torch.randn(256, 4, generator=g))
    sampler = DistributedSampler(data, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=8, sampler=sampler,
                        generator=torch.Generator().manual_seed(4) if args.loader_generator else None)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                    torch.nn.Linear(32, 4)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
    torch.manual_seed(100 + rank)  # dropout differs per rank

    os.makedirs(args.ckpt_dir, exist_ok=True)
    last = os.path.join(args.ckpt_dir, "last.pt")
    acc = args.accumulate
    micro = 0  # micro-batches done: acc per optimizer step

    def rng_path(at: int) -> str:
        return os.path.join(args.ckpt_dir, f"rng-{rank}-{at}.pt" if args.rng_with_step else f"rng-{rank}.pt")

    if os.path.exists(last):
        ck = torch.load(last, weights_only=True)
        model.module.load_state_dict(ck["model"])
        opt.load_state_dict(torch.load(os.path.join(args.ckpt_dir, "optim.pt"), weights_only=True)
                            if args.torn else ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        micro = ck.get("micro", ck["step"])
        for param, grad in zip(model.parameters(), ck.get("grads") or []):
            param.grad = grad  # the gradient accumulated before a save between optimizer steps
        rng = torch.load(rng_path(micro), weights_only=False)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        print(f"rank {rank}: resumed from step {micro // acc} (micro-batch {micro})", flush=True)

    def save() -> None:
        rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
        atomic_save(rng, rng_path(micro))
        if rank == 0:
            grads = None if micro % acc == 0 or args.drop_grad else [q.grad for q in model.parameters()]
            atomic_save({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                         "scheduler": sched.state_dict(), "step": micro // acc, "micro": micro, "grads": grads},
                        last, args.save_seconds)
        dist.barrier()

    per_epoch = len(loader)
    while micro < args.steps * acc:
        epoch, skip = divmod(micro, per_epoch)
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < skip:
                continue
            loss = torch.nn.functional.mse_loss(model(x), y)
            if acc > 1:
                loss = loss / acc
            loss.backward()
            time.sleep(args.step_seconds)
            micro += 1
            step = micro // acc
            if micro % acc == 0:
                opt.step()
                sched.step()
                opt.zero_grad()
                if args.torn and step % args.save_every == 1 and step > 1 and rank == 0:
                    atomic_save(opt.state_dict(), os.path.join(args.ckpt_dir, "optim.pt"))  # a step late
            if micro % args.save_every == 0:
                save()
            if args.save_on_sigterm:
                stop = preempted.clone()
                dist.all_reduce(stop, op=dist.ReduceOp.MAX)
                if stop.item():
                    if micro % args.save_every:
                        save()
                    print(f"rank {rank}: preempted; saved micro-batch {micro} (step {step})", flush=True)
                    dist.destroy_process_group()
                    sys.exit(args.sigterm_exit)
            if micro >= args.steps * acc:
                break
    dist.barrier()  # no rank tears its connections down while another still uses them
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
