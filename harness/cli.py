"""The ``baft`` command line.

Exit codes: 0 every expectation held, 1 one failed (or the run could not
finish), 2 bad input (the message names file, key path, expected and found).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .errors import HarnessError, ScenarioError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="baft", description="Fault-injection harness for distributed PyTorch training.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a scenario against its reference and print the verdict")
    run.add_argument("scenario", help="scenario YAML file")
    run.add_argument("--out", type=Path, help="output directory (default runs/NAME-TIMESTAMP)")
    run.add_argument("--cache", type=Path, help="reference cache (default $BAFT_CACHE_DIR or ~/.cache/baft-harness)")
    val = sub.add_parser("validate", help="validate scenario files without running anything")
    val.add_argument("scenarios", nargs="+")
    bench = sub.add_parser("bench", help="measure each checkpointing strategy's cost against none (paired)")
    bench.add_argument("--out", type=Path, default=Path("runs/bench"), help="output directory (default runs/bench)")
    bench.add_argument("--model", help="gpt-tiny (default), gpt-small or mlp")
    bench.add_argument("--stages", type=int)
    bench.add_argument("--nodes", type=int, help="hosts for the ranks (default 1; 2+ also times restores from a peer)")
    bench.add_argument("--microbatches", type=int)
    bench.add_argument("--microbatch-size", type=int, dest="microbatch_size")
    bench.add_argument("--schedule", help="1f1b (default) or gpipe")
    bench.add_argument("--strategies", help="comma-separated (default: none,sync,async-dcp,checkfreq,baft)")
    bench.add_argument("--cycles", type=int, help="paired cycles (default 30)")
    bench.add_argument("--block", type=int, help="iterations per block (default 4)")
    bench.add_argument("--warmup", type=int, help="untimed cycles first (default 2)")
    bench.add_argument("--persist-every", type=int, dest="persist_every", help="baft: persist every K iterations (default 20)")
    bench.add_argument("--replicate-every", type=int, dest="replicate_every", help="baft, 2+ nodes: replicate every K versions (default 1)")
    bench.add_argument("--baft-copier", dest="baft_copier", help="baft: inline (default) or thread")
    bench.add_argument("--link-rate", dest="link_rate", help="2+ nodes: nodes in network namespaces, links throttled to this tc rate (e.g. 50mbit; needs root)")
    bench.add_argument("--no-replication-yield", dest="replication_yield", action="store_const", const=False,
                       help="2+ nodes: stores send replicas even while pipeline traffic is in flight")
    bench.add_argument("--seed", type=int)
    return p


_BENCH_FIELDS = ("model", "stages", "nodes", "microbatches", "microbatch_size", "schedule", "strategies", "cycles", "block",
                 "warmup", "persist_every", "replicate_every", "baft_copier", "link_rate", "replication_yield", "seed")


def _bench(args: argparse.Namespace) -> int:
    from .bench import BenchConfig, run_bench, table
    from .schema import build

    given = {k: getattr(args, k) for k in _BENCH_FIELDS if getattr(args, k) is not None}
    if "strategies" in given:
        given["strategies"] = [x.strip() for x in given["strategies"].split(",") if x.strip()]
    try:
        cfg = build(BenchConfig, given, "<command line>", "bench")
    except ScenarioError as e:
        print(f"baft: error: {e}", file=sys.stderr)
        return 2
    print(f"baft: bench {cfg.model}, {cfg.stages} stages, {cfg.microbatches} microbatches, {cfg.schedule}; "
          f"{cfg.cycles} cycles x {len(cfg.strategies)} strategies x {cfg.block} iterations -> {args.out}", flush=True)
    try:
        result = run_bench(cfg, args.out)
    except HarnessError as e:
        print(f"baft: error: {e}", file=sys.stderr)
        return 1
    print(table(result))
    print(f"bench.json: {args.out / 'bench.json'} ({result['wall_seconds']:.0f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "bench":
        return _bench(args)
    from .scenario import load

    try:
        if args.command == "validate":
            for f in args.scenarios:
                s = load(f)
                print(f"{f}: ok ({s.name}: {s.workload.world_size} ranks, {len(s.faults)} faults)")
            return 0
        scenario = load(args.scenario)
    except ScenarioError as e:
        print(f"baft: error: {e}", file=sys.stderr)
        return 2
    from .runner import run_scenario, summary

    out = args.out or Path("runs") / f"{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"baft: running {scenario.name} ({scenario.workload.world_size} ranks on {scenario.workload.nodes} node(s)) -> {out}", flush=True)
    try:
        verdict = run_scenario(scenario, out, args.cache)
    except HarnessError as e:
        print(f"baft: error: {e}", file=sys.stderr)
        return 1
    print(summary(verdict, out))
    return 0 if verdict["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
