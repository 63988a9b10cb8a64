"""``baft bench --probe``: what the probe costs a step of an unmodified script, and how fast it fingerprints.

Each shipped example runs once, uninterrupted, under the boot module (``workload.command``, the same
launch as a reference run). The hooks time themselves: every ``step`` event carries ``probe_seconds``,
the time spent in the probe's hooks during that step (finding the state, fingerprinting it, journaling),
beside ``seconds``, the whole step. The table gives, per example, the median step and the median probe
time of the steps after the first (the first also finds the models among the live objects), and the
probe's share of those steps' time (a step's seconds include its probe's). A framework that is not
installed is left out, and said to be. Then the
fingerprint rate on a synthetic state of ``gigabytes`` (:func:`harness.bench.digest.digest_benchmark`):
what a large model's probe costs per step, without a model that large to train.
"""
from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path
from typing import Any

from baft import CheckpointConfig

from analysis.journal import Journal
from harness.bench.digest import digest_benchmark
from harness.run.launcher import LaunchConfig, launch
from harness.run.runner import script_command, work_dir
from harness.scenario import load
from harness.worker.spec import WorkerSpec

ROOT = Path(__file__).resolve().parents[2]
#: The shipped examples: name -> (scenario, the framework it needs, if any).
EXAMPLES: dict[str, tuple[str, str | None]] = {
    "ddp-torchsave": ("examples/ddp_torchsave/fixed.yaml", None),
    "lightning": ("examples/lightning/kill.yaml", "lightning"),
    "hf-trainer": ("examples/hf_trainer/kill.yaml", "transformers"),
    "accelerate": ("examples/accelerate/fixed.yaml", "accelerate"),
}


def example_cost(name: str, out: Path, timeout: float = 600.0) -> dict[str, Any]:
    """Run example ``name`` once under the boot module, uninterrupted; its steps' and the probe's seconds."""
    path, _ = EXAMPLES[name]
    scenario = load(ROOT / path)
    w = scenario.workload
    run_dir = out / name
    wd = work_dir(run_dir, w)
    spec = WorkerSpec(workload=w, checkpoint=CheckpointConfig(strategy="none"))
    result = launch(run_dir, spec, LaunchConfig(nodes=w.nodes, world_size=w.world_size, max_restarts=0,
                                                timeout=timeout, script=script_command(w, wd), cwd=wd))
    steps = [e for e in Journal.load(run_dir).events("step") if "probe_seconds" in e]
    later = [e for e in steps if e["step"] > 0]  # the first step's seconds also hold the start-up
    total = sum(e["seconds"] for e in later)
    return {
        "scenario": path, "ok": result.ok, "ranks": w.world_size, "steps": len(steps),
        "step_ms": 1e3 * statistics.median(e["seconds"] for e in later) if later else None,
        "probe_ms": 1e3 * statistics.median(e["probe_seconds"] for e in later) if later else None,
        "first_probe_ms": 1e3 * max((e["probe_seconds"] for e in steps if e["step"] == 0), default=0.0),
        "share": sum(e["probe_seconds"] for e in later) / total if total else None,
    }


def probe_benchmark(out: Path, gigabytes: float = 1.0) -> dict[str, Any]:
    """Every shipped example whose framework is installed, then the fingerprint rate on ``gigabytes``."""
    examples: dict[str, Any] = {}
    for name, (_, framework) in EXAMPLES.items():
        if framework is not None and importlib.util.find_spec(framework) is None:
            examples[name] = {"skipped": f"{framework} is not installed (pip install -c constraints.txt '.[frameworks]')"}
            continue
        examples[name] = example_cost(name, out)
    return {"examples": examples, "fingerprint": digest_benchmark(gigabytes)}


def probe_table(result: dict[str, Any]) -> str:
    lines = [f"{'example':<16}{'ranks':>6}{'steps':>7}{'step ms':>10}{'probe ms':>10}{'first ms':>10}{'share':>8}"]
    for name, r in result["examples"].items():
        if "skipped" in r:
            lines.append(f"{name:<16}  skipped: {r['skipped']}")
            continue
        share = f"{100 * r['share']:.1f}%" if r["share"] is not None else "-"
        lines.append(f"{name:<16}{r['ranks']:>6}{r['steps']:>7}{r['step_ms'] or 0:>10.2f}{r['probe_ms'] or 0:>10.2f}"
                     f"{r['first_probe_ms']:>10.1f}{share:>8}" + ("" if r["ok"] else "   (the run failed)"))
    fp = result["fingerprint"]
    probe = fp["methods"]["xxh3-128 digests + norms"]
    lines.append(f"fingerprint of {fp['gigabytes']:.2f} GB (digests + norms, 1 thread): {probe['seconds']:.3f} s, "
                 f"{probe['gb_per_s']:.2f} GB/s")
    return "\n".join(lines)
