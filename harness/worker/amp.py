"""Mixed precision of the reference workload: the fp16 loss scaler over pipeline stages and DTensor state.

Two things the stock ``torch.amp.GradScaler`` does not do for this workload:

- its overflow check is per process, and one model's step is split over the pipeline's stages, so
  one stage's inf must skip the step on every rank (:meth:`StageScaler.agreed_step`);
- it unscales each device's gradients of one dtype in one ``_amp_foreach_non_finite_check_and_unscale_``
  call, and that op refuses a list mixing DTensors with plain tensors (a finding about torch 2.13:
  tensor parallelism of part of a stage leaves norms and attention plain). Here every gradient is
  unscaled through its local shard (``to_local()`` of a DTensor is a view of the storage it owns, so
  the in-place unscale reaches the gradient itself), the same arithmetic on the same values.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist

from baft.state.dtensor import local_view


class StageScaler(torch.amp.GradScaler):
    """``GradScaler("cpu")`` with local-shard unscaling and a step whose skip every rank agrees on.
    Its state dict is the stock one (scale, growth tracker, factors), so every strategy checkpoints it."""

    def __init__(self, *, init_scale: float, growth_interval: int) -> None:
        super().__init__("cpu", init_scale=init_scale, growth_interval=growth_interval)
        self.scale(torch.zeros(()))  # creates its scale on every rank (only the last stage scales a loss)

    def _unscale_grads_(self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor,
                        allow_fp16: bool) -> dict[torch.device, torch.Tensor]:
        groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is None:
                        continue
                    if param.grad.is_sparse:
                        raise ValueError("the workload's scaler does not unscale sparse gradients")
                    if not allow_fp16 and param.grad.dtype == torch.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    grad = local_view(param.grad)
                    groups[grad.device, grad.dtype].append(grad)
            found: dict[torch.device, torch.Tensor] = {}
            for (device, _), grads in groups.items():
                if device not in found:
                    found[device] = found_inf.to(device, copy=True) if device != found_inf.device else found_inf
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found[device], inv_scale.to(device))
        return found

    def agreed_step(self, optimizer: torch.optim.Optimizer, on_skip: Any = None) -> None:
        """Unscale, agree on the overflow with every rank (an inf anywhere skips the step everywhere),
        step and update. The agreement goes into the found-inf tensors ``unscale_`` leaves for ``step``
        (``GradScaler`` keeps them per optimizer; torch 2.13). ``on_skip(scale)`` is told of a skip."""
        self.unscale_(optimizer)
        found = self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        any_inf = torch.stack([t.reshape(()) for t in found.values()]).amax() if found else torch.zeros(())
        dist.all_reduce(any_inf, op=dist.ReduceOp.MAX)
        for t in found.values():
            t.fill_(any_inf)
        if any_inf.item() and on_skip is not None:
            on_skip(float(self.get_scale()))
        self.step(optimizer)
        self.update()
