"""``baft bench --device-check GB``: baft on one accelerator, in one run of a few minutes (issue 37, item 5).

What a lent GPU is asked, in one go, on a model whose parameters and Adam moments make ``GB`` gigabytes:

- **cost**: training with pipeline-like waits, baft snapshotting every iteration against no checkpoint,
  paired in alternating blocks on the same model (as ``baft bench`` pairs its arms), the ratio with a
  bootstrap interval;
- **where the copies ran**: the share of the snapshot's bytes copied inside the waits, and baft's copy
  rate beside the device's own (a plain device-to-host copy of the same bytes into pinned memory, timed
  in the same run);
- **exactness**: a snapshot equal bit for bit to the state it was taken of; a process SIGKILLed in the
  middle of an iteration, restored from shared memory by a fresh process, continuing bit for bit as an
  uninterrupted run does;
- **fingerprints on the device**: :func:`baft.state.devicedigest.device_fingerprint` of the state where
  it lives against the same function over a host copy (equal digests), and its rate beside the host
  digest's (xxh3 over a host copy).

The waits: a stage of a pipeline waits for activations and gradients from its neighbours; here each wait
is a transfer that takes a set time. On CUDA it is a sleep kernel on a stream of its own that the compute
stream waits for (as NCCL's receive is: the host does not block); on a CPU the thread sleeps. Each goes
through ``torch.distributed.pipelining``'s wait helper, where baft's profiler sees pipeline waits.

Without a GPU the same check runs on the CPU at the size given (a rehearsal: ``--device-check 0.02``), so
the script is tested here before a lent device runs it; with ``simulate`` (``--simulate-device
tests.fakes.streams:rehearsal_device`` from a checkout) baft's device path runs there too, on a simulated
device whose copies complete only some time after they were issued (``scripts/device-check --cpu-rehearsal``).
"""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import signal
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: The model's layer width at full size (a square Linear: 4096² weights and 4096 biases).
WIDTH = 4096

#: Iterations of each arm before the timed cycles (baft's profiler measures 3 before its first plan).
WARMUP = 6

#: Bytes of training state per parameter: the float32 parameter and Adam's two moments.
STATE_BYTES_PER_PARAM = 12


@dataclass(frozen=True)
class CheckShape:
    """The check's model and schedule, derived from the state size asked for (:func:`shape_for`)."""

    gigabytes: float
    width: int
    layers: int
    batch: int
    microbatches: int
    wait_seconds: float
    """Each of the iteration's ``2 * microbatches`` waits (before each forward and each backward)."""

    @property
    def parameters(self) -> int:
        return self.layers * (self.width * self.width + self.width)

    @property
    def state_bytes(self) -> int:
        return self.parameters * STATE_BYTES_PER_PARAM


def shape_for(gigabytes: float, device: str) -> CheckShape:
    """A stack of square Linear layers whose parameters and Adam moments make ``gigabytes``. The waits are
    sized so that the copy of the whole state fits in them at a plausible device-to-host rate (about
    10 GB/s on a GPU, 2 GB/s on a CPU), with room to spare."""
    if not gigabytes > 0 or not math.isfinite(gigabytes):
        raise ValueError(f"the state's size in GB: expected a positive number, found {gigabytes!r}")
    params = gigabytes * 1e9 / STATE_BYTES_PER_PARAM
    width = WIDTH if params >= 4 * WIDTH * WIDTH else max(64, int(math.sqrt(params / 4)))
    layers = max(2, round(params / (width * width + width)))
    rate = 10e9 if device == "cuda" else 2e9
    microbatches = 4
    copy_seconds = layers * (width * width + width) * STATE_BYTES_PER_PARAM / rate
    return CheckShape(gigabytes=gigabytes, width=width, layers=layers, batch=8, microbatches=microbatches,
                      wait_seconds=max(0.002, 1.5 * copy_seconds / (2 * microbatches)))


class _Transfer:
    """One pipeline transfer of ``seconds``: what the stage waits on (a ``dist.Work`` to the wait helper)."""

    def __init__(self, seconds: float, device: Any, streams: dict[str, Any]) -> None:
        self.seconds, self.device, self.streams = seconds, device, streams

    def wait(self) -> bool:
        import torch

        if self.device.type != "cuda":
            time.sleep(self.seconds)
            return True
        comm = self.streams["comm"]
        with torch.cuda.stream(comm):
            torch.cuda._sleep(int(self.seconds * self.streams["cycles_per_second"]))
            done = comm.record_event()
        torch.cuda.current_stream().wait_event(done)  # the host goes on at once, as with NCCL's receive
        return True


class _Stage:
    """The model as one pipeline stage: the compute methods a ``PipelineStage`` has, which baft's profiler
    times, and the waits of a stage in the middle of a pipeline between them."""

    def __init__(self, model: Any, shape: CheckShape, device: Any, streams: dict[str, Any]) -> None:
        self.model, self.shape, self.device, self.streams = model, shape, device, streams
        self._outputs: dict[int, Any] = {}

    def _wait(self) -> None:
        from torch.distributed.pipelining import schedules

        transfer: Any = _Transfer(self.shape.wait_seconds, self.device, self.streams)  # as a dist.Work
        schedules._wait_batch_p2p([transfer])

    def forward_one_chunk(self, index: int, x: Any) -> Any:
        self._outputs[index] = self.model(x).pow(2).mean()
        return self._outputs[index]

    def backward_one_chunk(self, index: int, *args: Any) -> None:
        self._outputs.pop(index).backward()

    def iteration(self, step: int) -> None:
        """The iteration's compute and waits: each microbatch's input waited for, then its forward; then each
        gradient waited for, then its backward."""
        import torch

        m = self.shape.microbatches
        for i in range(m):
            self._wait()
            g = torch.Generator().manual_seed(step * m + i)
            x = torch.randn(self.shape.batch, self.shape.width, generator=g).to(self.device)
            self.forward_one_chunk(i, x)
        for i in range(m):
            self._wait()
            self.backward_one_chunk(i)


def _model(shape: CheckShape, device: Any, seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    layers: list[Any] = []
    for _ in range(shape.layers):
        layers += [torch.nn.Linear(shape.width, shape.width), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers).to(device)


def _streams(device: Any) -> dict[str, Any]:
    """The transfers' stream and the sleep kernel's cycles per second (measured: clocks vary by card)."""
    import torch

    if device.type != "cuda":
        return {}
    comm = torch.cuda.Stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 50_000_000
    torch.cuda._sleep(1000)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return {"comm": comm, "cycles_per_second": cycles / (start.elapsed_time(end) / 1e3)}


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _config(root: Path, name: str) -> Any:
    from baft import CheckpointConfig

    return CheckpointConfig(strategy="baft" if name == "baft" else "none", every=10**12,
                            dir=str(root / "ckpt" / name)).with_baft(shm_dir=str(root / "shm" / name))


def plug_simulated(simulate: str | None) -> None:
    """Run baft's device path on the simulated device ``simulate`` names (``module:factory``; None: nothing)."""
    if not simulate:
        return
    import importlib

    from baft.device.streams import simulate as plug

    module, _, name = simulate.partition(":")
    try:
        factory = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"simulated device {simulate!r}: expected module:factory importable here ({e})") from None
    plug(factory)


def _step(ckpt: Any, stage: _Stage, state: Any, kill_after_seal: bool = False) -> None:
    """One training iteration with a checkpointer's hooks, in the order a training loop calls them."""
    ckpt.begin_iteration()
    stage.iteration(state.step)
    ckpt.before_optimizer_step()
    if kill_after_seal:  # the version of this boundary is sealed: die before the optimizer step
        os.kill(os.getpid(), signal.SIGKILL)
    state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)
    state.step += 1
    ckpt.after_step()


def _digests(state: Any) -> dict[str, dict[str, str]]:
    from baft.state.fingerprint import digest_components

    return digest_components(state.capture(only=("model", "optimizer")))


# -- the kill and restore, in processes of their own ------------------------------------------------------
def _process_group(backend: str | None, port: int, device_name: str) -> bool:
    """A process group of world size 1 (``backend``: ``nccl`` on a GPU; ``refusecpu``, the tests' stand-in of
    NCCL that refuses baft's host tensors, from a checkout) the job runs in; False for none."""
    if not backend:
        return False
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    if backend == "refusecpu":  # a test's backend: from a checkout only (not followed by the type checker)
        import importlib

        importlib.import_module("tests.refusing_backend").register()
    if device_name == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(backend)
    return True


def _child(role: str, shape: CheckShape, device_name: str, root: str, steps: int, kill_at: int, out: str,
           simulate: str | None = None, backend: str | None = None, port: int = 0) -> None:
    """``reference``: ``steps`` iterations uninterrupted; ``killed``: baft every iteration, SIGKILLed in iteration
    ``kill_at`` once its boundary's version is sealed; ``restored``: a fresh model (another seed), restored by
    baft from shared memory, trained on to ``steps``. Each writes the state's digests after every step."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, before CUDA starts
    import torch

    from baft import Checkpointer, TrainState

    plug_simulated(simulate)
    grouped = _process_group(backend, port, device_name)
    if device_name == "cuda":
        torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    device = torch.device(device_name)
    model = _model(shape, device, seed=0 if role != "restored" else 1)
    state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-4))
    stage = _Stage(model, shape, device, _streams(device))
    ckpt = Checkpointer(_config(Path(root), "baft" if role != "reference" else "none"), state)
    ckpt.attach(stage)
    seen: dict[int, Any] = {}
    if role == "restored":
        ckpt.restore_latest()
        seen[state.step] = _digests(state)
    for _ in range(state.step, steps):
        _step(ckpt, stage, state, kill_after_seal=role == "killed" and state.step == kill_at)
        _sync(device)
        seen[state.step] = _digests(state)
        Path(out).write_text(json.dumps(seen))  # as it goes: the killed one leaves what it had
    ckpt.close()
    if grouped:
        import torch.distributed as dist

        dist.destroy_process_group()


def _run_child(*args: Any) -> int | None:
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_child, args=args, name=f"device-check-{args[0]}")
    p.start()
    p.join(600)
    if p.exitcode is None:
        p.kill()
        p.join()
    return p.exitcode


def kill_and_restore(shape: CheckShape, device: str, root: Path, steps: int = 6, kill_at: int = 3,
                     simulate: str | None = None, backend: str | None = None) -> dict[str, Any]:
    """The uninterrupted reference, the killed run and the restored one; whether the restored run continued
    bit for bit (every step's digests after the restore equal the reference's). ``backend``: each runs in a
    process group of world size 1 of that backend (:func:`_process_group`)."""
    from harness.run.nodeenv import free_port

    root.mkdir(parents=True, exist_ok=True)
    files = {role: root / f"{role}.json" for role in ("reference", "killed", "restored")}
    codes = {role: _run_child(role, shape, device, str(root), steps, kill_at, str(files[role]), simulate, backend,
                              free_port() if backend else 0)
             for role in files}
    seen = {role: json.loads(f.read_text()) if f.exists() else {} for role, f in files.items()}
    restored_at = min((int(s) for s in seen["restored"]), default=None)
    compared = sorted(int(s) for s in seen["restored"])
    differ = [s for s in compared if seen["restored"][str(s)] != seen["reference"].get(str(s))]
    # the version of the boundary it died at, or on a device (sealed once its copies completed) the one before
    fresh = restored_at is not None and kill_at - 1 <= restored_at <= kill_at
    return {"process_group": backend, "exit_codes": codes, "killed_at_iteration": kill_at, "restored_step": restored_at,
            "steps_compared": compared, "steps_differing": differ,
            "bit_for_bit": bool(compared) and not differ and codes["killed"] == -signal.SIGKILL and fresh}


# -- cost, copies and fingerprints in this process ----------------------------------------------------------
def _copy_floor(state: Any, device: Any) -> float:
    """GB/s of a plain device-to-host copy of the state's tensors into pinned host memory (the device's
    rate for the bytes baft copies), median of three."""
    import torch

    tensors = _state_tensors(state)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    pin = device.type == "cuda"
    dst = [torch.empty(t.numel() * t.element_size(), dtype=torch.uint8, pin_memory=pin) for t in tensors]
    rates = []
    for _ in range(3):
        _sync(device)
        t0 = time.perf_counter()
        for d, t in zip(dst, tensors):
            d.copy_(t.detach().reshape(-1).view(torch.uint8), non_blocking=pin)
        _sync(device)
        rates.append(nbytes / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates)


def _state_tensors(state: Any) -> list[Any]:
    """The model's and the optimizer's non-empty tensors, where they live (detached)."""
    import torch

    from baft.state.fingerprint import flatten

    return [t.detach() for _, t in flatten(state.capture(only=("model", "optimizer")))
            if isinstance(t, torch.Tensor) and t.numel()]


def _fingerprints(state: Any, device: Any) -> dict[str, Any]:
    """The state's digests on the device against the same function over host copies, and the two rates."""

    from baft.state.devicedigest import device_fingerprint
    from baft.state.fingerprint import fingerprint_leaf

    tensors = _state_tensors(state)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    _sync(device)
    t0 = time.perf_counter()
    on_device = [device_fingerprint(t) for t in tensors]
    _sync(device)
    device_s = time.perf_counter() - t0
    hosts = [t.cpu() for t in tensors]
    t0 = time.perf_counter()
    for h in hosts:
        fingerprint_leaf(h)
    host_s = time.perf_counter() - t0
    on_host = [device_fingerprint(h) for h in hosts]
    equal = all(a[0] == b[0] for a, b in zip(on_device, on_host))
    norms = [abs(a[1] - b[1]) / max(abs(b[1]), 1e-30) for a, b in zip(on_device, on_host) if a[1] is not None and b[1] is not None]
    return {"tensors": len(tensors), "bytes": nbytes, "digests_equal": equal,
            "norm_max_relative_difference": max(norms, default=0.0),
            "device_gbytes_per_s": nbytes / device_s / 1e9, "host_xxh3_gbytes_per_s": nbytes / host_s / 1e9}


def _snapshot_exact(ckpt: Any, stage: _Stage, state: Any) -> bool:
    """Take a snapshot of the state as it is now (its boundary's version, sealed before the optimizer step)
    and compare the slot with the live state, bit for bit."""
    strategy = ckpt.strategy
    ckpt.begin_iteration()
    stage.iteration(state.step)
    ckpt.before_optimizer_step()  # the version of this boundary is being sealed; the state is still that version
    ckpt.drain()  # (on a device, sealed once its copies' events completed)
    state.optimizer.zero_grad(set_to_none=True)
    _sync(stage.device)
    slot = strategy.snap.read_version(state.step)  # host tensors
    live = state.capture(only=("model", "optimizer"))  # where the state lives
    return _same_digests({k: slot[k] for k in ("model", "optimizer")}, live)


def _same_digests(a: Any, b: Any) -> bool:
    """Whether two trees hold the same leaves, bit for bit, wherever their tensors live: every tensor by the
    device digest (the same function on any device), anything else by value."""
    import torch

    from baft.state.devicedigest import device_fingerprint
    from baft.state.fingerprint import flatten

    left, right = dict(flatten(a)), dict(flatten(b))
    if left.keys() != right.keys():
        return False
    for key, x in left.items():
        y = right[key]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if device_fingerprint(x, with_norm=False)[0] != device_fingerprint(y, with_norm=False)[0]:
                return False
        elif x != y:
            return False
    return True


def device_check(gigabytes: float, out: Path, device: str | None = None, cycles: int = 6, block: int = 4,
                 simulate: str | None = None, process_group: str | None = None) -> dict[str, Any]:
    """Run the check (see the module) and return its result (also written to ``out/device-check.json``).
    ``simulate``: ``module:factory`` of a simulated device baft's device path runs on (a CPU rehearsal);
    ``process_group``: also kill and restore inside a process group of that backend (``nccl``)."""
    import torch

    from baft.device.streams import simulate as unplug

    name = device or ("cuda" if torch.cuda.is_available() and not simulate else "cpu")
    dev = torch.device(name)
    shape = shape_for(gigabytes, name)
    plug_simulated(simulate)
    try:
        return _device_check(shape, dev, out, cycles, block, simulate, process_group)
    finally:
        unplug(None)


def _device_check(shape: CheckShape, dev: Any, out: Path, cycles: int, block: int, simulate: str | None,
                  process_group: str | None) -> dict[str, Any]:
    import torch

    from baft import Checkpointer, TrainState, events

    from analysis.benchstats import paired_ratios

    name = dev.type
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(dev) if name == "cuda" else "cpu",
                              "simulated_device": simulate, "torch": torch.__version__, "shape": asdict(shape),
                              "state_gbytes": shape.state_bytes / 1e9}
    with tempfile.TemporaryDirectory(prefix="baft-device-check-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        root = Path(tmp)
        model = _model(shape, dev, seed=0)
        state = TrainState(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-4))
        streams = _streams(dev)
        stage = _Stage(model, shape, dev, streams)
        arms = {arm: Checkpointer(_config(root, arm), state) for arm in ("none", "baft")}
        for ckpt in arms.values():
            ckpt.attach(stage)
        snaps: list[dict[str, Any]] = []
        unsubscribe = events.subscribe(lambda kind, f: snaps.append(dict(f)) if kind == "snapshot" else None)
        iterations: list[dict[str, Any]] = []
        try:
            for ckpt in arms.values():  # warm both: the first snapshots lay the slots out, the profiler plans
                for _ in range(WARMUP):
                    _step(ckpt, stage, state)
            snaps.clear()
            for cycle in range(cycles):
                order = list(arms) if cycle % 2 == 0 else list(reversed(arms))
                for arm in order:
                    for position in range(block):
                        _sync(dev)
                        t0 = time.perf_counter()
                        _step(arms[arm], stage, state)
                        _sync(dev)
                        iterations.append({"cycle": cycle, "strategy": arm, "position": position,
                                           "seconds": time.perf_counter() - t0})
            result["snapshot_exact"] = _snapshot_exact(arms["baft"], stage, state)
        finally:
            unsubscribe()
            for ckpt in arms.values():
                ckpt.close()
        ratios = paired_ratios(iterations)
        window = sum(e.get("window_bytes", 0) for e in snaps)
        stall = sum(e.get("stall_bytes", 0) for e in snaps)
        copy_s = sum(e.get("copy_seconds", 0.0) + e.get("stall_seconds", 0.0) for e in snaps)
        result["cost"] = {"baft_every_iteration_vs_none": ratios.get("baft"), "none": ratios.get("none"),
                          "cycles": cycles, "block": block}
        result["copies"] = {"snapshots": len(snaps), "in_window_share": window / (window + stall) if window + stall else None,
                            "baft_gbytes_per_s": (window + stall) / copy_s / 1e9 if copy_s else None,
                            "device_to_host_floor_gbytes_per_s": _copy_floor(state, dev)}
        result["fingerprints"] = _fingerprints(state, dev)
        del arms, stage, state, model
        if name == "cuda":
            torch.cuda.empty_cache()
        result["kill_and_restore"] = kill_and_restore(shape, name, root / "kill", simulate=simulate)
        if process_group:
            result["kill_and_restore_in_group"] = kill_and_restore(shape, name, root / "kill-group", simulate=simulate,
                                                                   backend=process_group)
    result["seconds"] = time.perf_counter() - t_start
    (out / "device-check.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _kill_line(kr: dict[str, Any]) -> str:
    group = f" (in a {kr['process_group']} process group)" if kr.get("process_group") else ""
    return (f"  SIGKILLed in iteration {kr['killed_at_iteration']}{group}, restored {kr['restored_step']} from shared "
            f"memory, steps {kr['steps_compared']} against the uninterrupted run: "
            + ("bit for bit" if kr["bit_for_bit"] else f"DIFFER at {kr['steps_differing']} (exit codes {kr['exit_codes']})"))


def passed(result: dict[str, Any]) -> list[str]:
    """What a device check's result fails on ([]: it passed): exactness, and the copies' rate and share known."""
    failures = []
    if not result["snapshot_exact"]:
        failures.append("the snapshot differs from the state")
    for key in ("kill_and_restore", "kill_and_restore_in_group"):
        if key in result and not result[key]["bit_for_bit"]:
            failures.append(f"{key}: the restored run did not continue bit for bit")
    if not result["fingerprints"]["digests_equal"]:
        failures.append("device digests differ from the host's")
    if result["copies"]["baft_gbytes_per_s"] is None or result["copies"]["in_window_share"] is None:
        failures.append("the copies' rate or share inside the waits is unknown")
    return failures


def check_table(result: dict[str, Any]) -> str:
    """The terminal summary of :func:`device_check`."""
    cost = result["cost"]["baft_every_iteration_vs_none"] or {}
    copies, fp, kr = result["copies"], result["fingerprints"], result["kill_and_restore"]
    ci = cost.get("ci95") or [float("nan")] * 2
    share = copies["in_window_share"]
    lines = [
        f"device check on {result['device']}"
        f"{' (simulated device: its copies and their rate are the simulation)' if result.get('simulated_device') else ''} "
        f"(torch {result['torch']}): {result['state_gbytes']:.2f} GB of parameters "
        f"and Adam state, {result['shape']['layers']} x Linear({result['shape']['width']}), "
        f"{2 * result['shape']['microbatches']} waits of {result['shape']['wait_seconds'] * 1e3:.1f} ms per iteration",
        f"  baft every iteration vs none: {cost.get('ratio_vs_none', float('nan')):.4f} (95% CI {ci[0]:.4f}-{ci[1]:.4f}, "
        f"n {cost.get('n', 0)})",
        f"  copies: {copies['snapshots']} snapshots, "
        f"{'-' if share is None else f'{100 * share:.1f}%'} of bytes inside the waits, baft "
        f"{copies['baft_gbytes_per_s'] or 0:.2f} GB/s against a plain device-to-host copy's "
        f"{copies['device_to_host_floor_gbytes_per_s']:.2f} GB/s",
        f"  snapshot equal to the state bit for bit: {'yes' if result['snapshot_exact'] else 'NO'}",
        *(_kill_line(k) for k in (kr, result.get("kill_and_restore_in_group")) if k),
        f"  fingerprints: device digests {'equal to' if fp['digests_equal'] else 'DIFFERENT from'} the host run's of "
        f"the same function ({fp['tensors']} tensors), norms within {fp['norm_max_relative_difference']:.1e}; "
        f"{fp['device_gbytes_per_s']:.2f} GB/s on the device, host xxh3 {fp['host_xxh3_gbytes_per_s']:.2f} GB/s",
        f"  ({result['seconds']:.0f} s)",
    ]
    return "\n".join(lines)
