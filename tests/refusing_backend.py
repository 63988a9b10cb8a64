"""A process-group backend that behaves like NCCL towards baft's control traffic, on a CPU.

NCCL takes device tensors only: a CPU tensor sent through a job's NCCL group fails. A CPU run cannot refuse
every CPU tensor (its training sends nothing else), so this backend (``refusecpu``) wraps gloo and refuses a
CPU tensor in a collective whose caller, the first frame outside torch, is in the ``baft`` package: there,
on a GPU job, that collective would have gone through NCCL with a host tensor. Training's own collectives
(DTensor, FSDP2, the pipeline's sends, called from the model and the loop) go through to gloo.

Each refusal is raised in the caller and appended to ``$BAFT_REFUSED_LOG`` (when set), one line per refusal
with the operation and the caller, so a test sees it even where baft catches the error and falls back.

:func:`register` makes the backend known; ``dist.init_process_group("refusecpu")`` then uses it for the
default group and for every group the job creates without naming a backend (a DeviceMesh's dimensions).
"""
from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

NAME = "refusecpu"
BAFT = str(Path(__file__).resolve().parents[1] / "baft") + os.sep
TORCH = str(Path(torch.__file__).resolve().parent) + os.sep
HERE = str(Path(__file__).resolve())

#: The operations a job's groups are asked for (the ProcessGroup methods gloo implements), each delegated.
OPS = ("allreduce", "allreduce_coalesced", "allgather", "_allgather_base", "allgather_coalesced",
       "allgather_into_tensor_coalesced", "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced",
       "broadcast", "reduce", "gather", "scatter", "alltoall", "alltoall_base", "send", "recv", "recv_anysource")


class Refused(RuntimeError):
    """A CPU tensor sent by baft through the job's own group."""


def _tensors(args: tuple[Any, ...]) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(_tensors(tuple(a)))
    return found


def _caller() -> str | None:
    """The file of the first frame outside torch and this module: who asked for the collective."""
    frame = inspect.currentframe()
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(TORCH) and name != HERE:
            return name
        frame = frame.f_back
    return None


def _delegate(op: str) -> Any:
    def call(self: RefusingGroup, *args: Any) -> Any:
        caller = _caller()
        if caller is not None and caller.startswith(BAFT) and any(t.device.type == "cpu" for t in _tensors(args)):
            line = f"{op} from {caller} on rank {self.rank()}"
            log = os.environ.get("BAFT_REFUSED_LOG")
            if log:
                with open(log, "a") as f:
                    f.write(line + "\n")
            raise Refused(f"{NAME}: a CPU tensor through the job's group ({line}); NCCL would refuse it")
        return getattr(self.inner, op)(*args)
    call.__name__ = op
    return call


class RefusingGroup(dist.ProcessGroup):
    """gloo underneath; a CPU tensor from baft's code refused (see the module's docstring)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: Any) -> None:
        super().__init__(rank, size)
        self.inner = ProcessGroupGloo(store, rank, size, timeout)
        self._name = ""

    def getBackendName(self) -> str:  # noqa: N802 (the C++ method's name)
        return NAME

    # A Python process group keeps its own name (the C++ one is not set for it)
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        return self._name

    def barrier(self, *args: Any) -> Any:
        return self.inner.barrier(*args)


for _op in OPS:
    setattr(RefusingGroup, _op, _delegate(_op))


def register() -> None:
    """Make ``refusecpu`` a backend name (once per process)."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, lambda store, rank, size, timeout: RefusingGroup(store, rank, size, timeout),
                                      devices=["cpu"])
