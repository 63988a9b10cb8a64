"""``baft bench --digest GB``: how fast the probe fingerprints a multi-GB state.

The probe fingerprints every component at every step boundary, so on a large
model the bitwise comparison is only affordable if hashing runs at memory speed.
This benchmark builds a model-like state of float32 tensors, times
:func:`baft.state.fingerprint.fingerprint_components` with norms (what the probe does) and
without, and times the blake2b hashing the digests used before (the 'before'
number), all in one process, one intra-op thread (as the workers run), medians
of ``repeats`` passes. The speedup is a ratio measured in the same run.

Given a ``device`` (``"cuda"``), it also times
:func:`baft.state.devicedigest.device_fingerprint` over a copy of the state on
that device, digests and norms computed there (what the probe does with a GPU
state), and checks a tensor's device digest against the same function over its
host copy. ``device="cpu"`` times that function on the host (a rehearsal: the
function is the same, the speed is not a GPU's).
"""
from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from baft.state.devicedigest import device_fingerprint
from baft.state.fingerprint import fingerprint_components, flatten

from harness.errors import ConfigValueError

#: Columns of a tensor in the benchmark state (rows make up the size).
COLUMNS = 1024

#: The method name of the on-device digest in the result and the table.
DEVICE_METHOD = "device digests + norms"


def _blake2b_digests(components: dict[str, Any]) -> dict[str, str]:
    """The pre-xxh3 fingerprint of every tensor: blake2b-64 over dtype, shape and bytes."""
    out = {}
    for key, t in flatten(components):
        h = hashlib.blake2b(digest_size=8)
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        out[key] = h.hexdigest()
    return out


def _device_fingerprints(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[str, float | None]]:
    """:func:`device_fingerprint` of every tensor where it lies (each returns only after its device finished)."""
    return {key: device_fingerprint(t) for key, t in tensors.items()}


def _device_check(host: dict[str, torch.Tensor], fingerprints: dict[str, tuple[str, float | None]],
                  host_norms: dict[str, float]) -> bool:
    """The device digest of the first tensor equals the same function's over its host copy, and every
    device norm agrees with the host path's to 1e-6 relative (the host sums float32 blocks)."""
    key = next(iter(host))
    if device_fingerprint(host[key])[0] != fingerprints[key][0]:
        return False
    return all((n := fingerprints[k][1]) is not None and abs(n - h) <= 1e-6 * abs(h) for k, h in host_norms.items())


def _median_seconds(fn: Callable[[], object], repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def _state(gigabytes: float, tensors: int, seed: int) -> dict[str, dict[str, torch.Tensor]]:
    """A ``model`` component of ``tensors`` 2-D float32 weights adding up to ~``gigabytes`` (1e9 bytes).

    Filled with normal noise: all-zero tensors would take the norm's float64 fallback
    and flatter the hash, so they would measure something the probe rarely sees.
    """
    gen = torch.Generator().manual_seed(seed)
    rows = max(1, round(gigabytes * 1e9 / tensors / (4 * COLUMNS)))
    return {"model": {f"layers.{i}.weight": torch.empty(rows, COLUMNS).normal_(generator=gen) for i in range(tensors)}}


def digest_benchmark(gigabytes: float = 2.0, tensors: int = 64, repeats: int = 3, seed: int = 0,
                     device: str | None = None) -> dict[str, Any]:
    """Throughput of state fingerprinting on a ``gigabytes`` state of ``tensors`` float32 tensors.

    Returns ``bytes``, ``gigabytes`` (actual, 1e9 bytes), ``tensors``, ``repeats``,
    ``threads`` (1: intra-op threads while timing), ``consistent`` (both xxh3 passes
    gave the same digests, the norms are finite and positive), ``methods`` mapping a
    method name to ``{"seconds": median, "runs": [...], "gb_per_s": ...}`` for
    ``xxh3-128 digests + norms`` (what the probe does), ``xxh3-128 digests`` and
    ``blake2b digests (before)``, and ``speedup`` (blake2b seconds / probe seconds).
    Memory: the state itself plus a few MiB (nothing is copied).

    ``device`` (None: none; ``"cuda"``, ``"cpu"``, ...): the state is also copied
    there and :func:`device_fingerprint` timed over it, as the method
    :data:`DEVICE_METHOD`; the result then has ``device`` (its name) and
    ``device_consistent`` (see :func:`_device_check`). Device memory: the state plus
    the digest's temporaries (about ten times its piece size).
    """
    if not gigabytes > 0:
        raise ConfigValueError("gigabytes", "> 0", gigabytes)
    if tensors < 1:
        raise ConfigValueError("tensors", ">= 1", tensors)
    if repeats < 1:
        raise ConfigValueError("repeats", ">= 1", repeats)
    state = _state(gigabytes, tensors, seed)
    nbytes = sum(t.numel() * t.element_size() for t in state["model"].values())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        digests, norms = fingerprint_components(state)  # warm-up, and the reference for the check
        runs = {
            "xxh3-128 digests + norms": lambda: fingerprint_components(state),
            "xxh3-128 digests": lambda: fingerprint_components(state, with_norms=False),
            "blake2b digests (before)": lambda: _blake2b_digests(state),
        }
        methods: dict[str, dict[str, Any]] = {}
        for name, fn in runs.items():
            median, times = _median_seconds(fn, repeats)
            methods[name] = {"seconds": median, "runs": times, "gb_per_s": nbytes / 1e9 / median}
        plain, _ = fingerprint_components(state, with_norms=False)
        device_result: dict[str, Any] = {}
        if device is not None:
            on_device = {k: t.to(device) for k, t in state["model"].items()}
            fingerprints = _device_fingerprints(on_device)  # warm-up (the device's tables), and the check's
            median, times = _median_seconds(lambda: _device_fingerprints(on_device), repeats)
            methods[DEVICE_METHOD] = {"seconds": median, "runs": times, "gb_per_s": nbytes / 1e9 / median}
            device_result = {"device": str(next(iter(on_device.values())).device),
                             "device_consistent": _device_check(state["model"], fingerprints, norms["model"])}
            del on_device
    finally:
        torch.set_num_threads(threads)
    consistent = plain == digests and all(0 < n < float("inf") for n in norms["model"].values())
    return {
        "bytes": nbytes,
        "gigabytes": nbytes / 1e9,
        "tensors": tensors,
        "repeats": repeats,
        "threads": 1,
        "consistent": consistent,
        "methods": methods,
        "speedup": methods["blake2b digests (before)"]["seconds"] / methods["xxh3-128 digests + norms"]["seconds"],
        **device_result,
    }


def digest_table(result: dict[str, Any]) -> str:
    """The benchmark result as a few lines for the terminal."""
    lines = [
        f"state fingerprint: {result['gigabytes']:.2f} GB in {result['tensors']} float32 tensors, "
        f"{result['threads']} thread, median of {result['repeats']}",
        f"{'method':<28}{'seconds':>10}{'GB/s':>9}",
    ]
    for name, m in result["methods"].items():
        lines.append(f"{name:<28}{m['seconds']:>10.3f}{m['gb_per_s']:>9.2f}")
    lines.append(f"probe (digests + norms) vs blake2b: {result['speedup']:.1f}x faster"
                 + ("" if result["consistent"] else "   WARNING: inconsistent digests or norms"))
    if "device" in result:
        lines.append(f"{DEVICE_METHOD} on {result['device']}: the host copy's digest "
                     + ("matches, norms agree" if result["device_consistent"]
                        else "or norms DIFFER   WARNING: inconsistent device digest"))
    return "\n".join(lines)
