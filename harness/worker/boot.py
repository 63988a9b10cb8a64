"""The boot module: how the harness runs an unmodified training script (``workload: {command: [...]}``).

torchrun starts ``python -m harness.worker.boot SCRIPT ARG...`` in every worker. It opens the rank's
journal, arms the worker's faults, installs :class:`~harness.worker.hooks.ScriptProbe` and then runs the
script as ``__main__`` (``runpy``), with ``sys.argv`` and ``sys.path[0]`` as ``python SCRIPT ARG...``
would give it. The script forms its own process group; it never imports the harness.

When the script returns, the journal gets ``finish`` with the steps it took. An exception in the script
propagates (the worker exits non-zero, torchrun sees a failure); ``SystemExit`` keeps its code. The boot
runs under torch's ``record`` (as torchrun's documentation asks of an entry point): an uncaught exception
goes into the worker's error file, which the agent journals (``worker_failed``) and the verdict quotes.
Python's, numpy's and torch's global generators are seeded first (:func:`seed_unseeded`).
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import runpy
import sys
from pathlib import Path
from typing import Any

from harness.worker.session import Session
from harness.worker.spec import SPEC_VARIABLE


def seed_unseeded(seed: int, rank: int) -> None:
    """Seed python's, numpy's and torch's global generators, which start from OS entropy (torch 2.13's
    default seed too): a script that never seeds one (and may never draw from it) would otherwise hold
    a different RNG state, or other initial weights, in any two runs, and every comparison would fail
    on it. A script that seeds them itself overrides this."""
    import random

    import numpy as np
    import torch

    random.seed(f"baft-{seed}-{rank}")
    np.random.seed((seed * 1_000_003 + rank) % 2**32)
    torch.manual_seed(seed * 1_000_003 + rank)


def enabled_adapters(wanted: list[str] | None) -> tuple[str, ...]:
    """The adapters to enable: those named, or (null) each one whose framework is installed."""
    from harness.worker.adapters import FRAMEWORKS, installed

    return tuple(wanted) if wanted is not None else tuple(n for n in FRAMEWORKS if installed(n))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` right after module ``name`` is first executed (found by the other finders)."""

    def __init__(self, name: str, then: Any) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once: the real finders find it
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self.then

        class Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                then(module)

        spec.loader = Loader()
        return spec


def after_import(name: str, then: Any) -> None:
    """Call ``then(module)`` when the script first imports module ``name`` (at once if it is imported)."""
    if name in sys.modules:
        then(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


def make_deterministic() -> None:
    """What ``workload.deterministic`` sets: deterministic kernels (an op without one raises), one
    intra-op thread (a reduction's order then does not depend on the thread count), and cuBLAS's
    fixed workspace (needed for deterministic cuBLAS; read when CUDA starts)."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m harness.worker.boot SCRIPT [ARG...] (started by baft run)", file=sys.stderr)
        return 2
    script = Path(args[0]).resolve()
    spec_path = os.environ.get(SPEC_VARIABLE)
    if not spec_path:
        print(f"harness.worker.boot: {SPEC_VARIABLE} is not set: run the script through `baft run` with "
              "workload: {command: [...]}", file=sys.stderr)
        return 2
    from harness.worker.hooks import ScriptProbe

    session = Session(Path(spec_path)).start(join_group=False)
    seed_unseeded(session.spec.workload.seed, session.probe.rank)
    if session.spec.workload.deterministic:
        make_deterministic()
    reference = Path(session.spec.reference) if session.spec.reference else None
    adapters = enabled_adapters(session.spec.workload.adapters)
    hooks = ScriptProbe(session.probe, session.steps, reference, every=session.spec.probe.every,
                        adapters=adapters).install()
    after_import("torch.distributed.checkpoint", hooks.patch_saver("save", "dcp"))
    after_import("torch.distributed.checkpoint", hooks.patch_saver("async_save", "dcp"))
    after_import("safetensors.torch", hooks.patch_saver("save_file", "safetensors"))
    after_import("torch.distributed.checkpoint", hooks.patch_loader("load"))
    after_import("safetensors.torch", hooks.patch_loader("load_file"))
    if "transformers" in adapters:
        from harness.worker.adapters.transformers import patch_trainer

        after_import("transformers.trainer", patch_trainer)
    if "accelerate" in adapters:
        from harness.worker.adapters.accelerate import patch_accelerator

        after_import("accelerate.accelerator", patch_accelerator)
    if session.spec.workload.launcher == "python":
        as_plain_python()
    sys.argv = [str(script), *args[1:]]
    sys.path.insert(0, str(script.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            # journaled: a preemption's verdict tells an exit of the script's own (143, 1, ...) from the signal's
            session.probe.record("exit", code=e.code if isinstance(e.code, int) else 1)
            raise
    finally:
        hooks.uninstall()
        session.disarm()
    session.probe.close(hooks.step)
    return 0


#: What torchrun (and its elastic agent) puts in a worker's environment; a script run as ``python script.py``
#: sees none of it (``workload.launcher: python``).
DISTRIBUTED_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                         "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                         "TORCH_NCCL_ASYNC_ERROR_HANDLING")


def as_plain_python() -> list[str]:
    """Remove torch.distributed's variables (and torchelastic's) from this process's environment, once the
    probe has read its rank: the script then runs as ``python script.py`` would. The names removed."""
    gone = [k for k in os.environ if k in DISTRIBUTED_VARIABLES or k.startswith("TORCHELASTIC_")]
    for k in gone:
        del os.environ[k]
    return gone


def leave(code: int) -> None:
    """End the worker with ``code`` once the script returned: its ``atexit`` handlers (logging, wandb,
    multiprocessing's children), a garbage collection (what the script dropped is finalised while the
    interpreter is whole: files flushed, process groups that a cycle kept alive destroyed), the standard
    streams flushed, then ``os._exit``: no interpreter teardown, in which torch's threads can abort it."""
    import atexit
    import gc

    atexit._run_exitfuncs()
    gc.collect()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    leave(record(main)() or 0)
