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
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
