"""baft's own gloo groups: every agreement between ranks, and every host tensor baft sends, goes over them.

A job's groups are often NCCL's, and NCCL takes device tensors only: the restore's version, the persist's,
the layout check, the replicas' sum of a restored slot (read from shared memory), the state TP peers hold
alike when it comes from a slot — all host tensors — would fail there. So baft never sends them through
the job's groups: :func:`own_group` makes a gloo group over all ranks for the strategies' agreements, and
:func:`host_twin` a gloo group over the same ranks as one of the job's (a mesh dimension's) for the few
collectives over a subset. A group of the job's that takes host tensors through gloo already (a CPU job,
or a ``cpu:gloo,cuda:nccl`` group) serves as its own twin. Device tensors (a live state's) still go over
the job's group, where NCCL is the fast path.

Making groups is collective: every rank calls these functions, in the same order (the strategies do at
attach).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from baft.mesh.collective import all_gather, initialized


def own_group() -> Any:
    """A gloo group over all ranks, baft's alone (None without a process group)."""
    return dist.new_group(backend="gloo") if initialized() else None


def takes_host_tensors(group: Any) -> bool:
    """Whether ``group`` sends CPU tensors through gloo (None: the default group)."""
    pg: Any = group if group is not None else dist.group.WORLD
    try:
        return isinstance(pg._get_backend(torch.device("cpu")), dist.ProcessGroupGloo)
    except (RuntimeError, AttributeError, ValueError):  # no CPU backend (NCCL alone), or a group of another kind
        return False


def host_twin(group: Any, control: Any) -> Any:
    """A gloo group over the ranks of ``group`` (one of the job's, e.g. a mesh dimension's), or ``group``
    itself when it takes host tensors already. ``control``: a gloo group over all ranks
    (:func:`own_group`), over which the ranks learn each other's groups. Collective over all ranks: each
    passes its own group of the same partition (a mesh dimension), and all make every group of it.

    None is the default group (``attach(replicas=N)`` without a mesh: every rank a replica): its twin is
    ``control`` itself where the default group would refuse host tensors (NCCL), else None."""
    if not initialized():
        return group
    if group is None:
        return None if takes_host_tensors(None) else control
    mine = sorted(dist.get_process_group_ranks(group))
    everyone = all_gather((mine, takes_host_tensors(group)), control)
    if all(ok for _, ok in everyone):
        return group
    twin = None
    for ranks in sorted({tuple(r) for r, _ in everyone if r}):
        made = dist.new_group(list(ranks), backend="gloo")
        if list(ranks) == mine:
            twin = made
    return twin
