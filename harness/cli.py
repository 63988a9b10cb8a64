"""The ``baft`` command line.

Exit codes: 0 every expectation held, 1 one failed (or the run could not
finish), 2 bad input (the message names file, key path, expected and found).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from harness.cliconfig import add_config_arguments, config_from_args, flag_error
from harness.errors import Cancelled, HarnessError, UsageError


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``baft``. The flags that come from a component's config dataclass (``bench``,
    ``deploy``) are added for that ``command`` only: reading the config imports the component, and
    with it torch, which the other commands need not wait for."""
    p = argparse.ArgumentParser(prog="baft", description="Fault-injection harness for distributed PyTorch training.")
    sub = p.add_subparsers(dest="command", required=True)
    _run_flags(sub)
    _campaign_flags(sub, command)
    _reading_flags(sub)
    _measuring_flags(sub, command)
    return p


def _run_flags(sub: Any) -> None:
    """The flags of ``baft run`` (local, or against a cluster with ``--target k8s``): from
    :class:`~harness.run.options.RunOptions` and :class:`~harness.cluster.config.ClusterOptions`."""
    from harness.cluster.config import ClusterOptions
    from harness.run.options import RunOptions

    run = sub.add_parser("run", help="run a scenario against its reference and print the verdict")
    run.add_argument("scenario", help="scenario YAML file")
    add_config_arguments(run, RunOptions)
    add_config_arguments(run.add_argument_group("--target k8s", "The job on the cluster and how the harness "
                                                "follows it (harness.cluster.config.ClusterOptions)."),
                         ClusterOptions)


def _campaign_flags(sub: Any, command: str | None) -> None:
    """The flags of ``baft deploy``, ``suite`` and ``fuzz``."""
    dep = sub.add_parser("deploy", help="print Kubernetes manifests running the scenario's workload with baft in a "
                                        "cluster (and, with --harness, the harness with its RBAC)")
    dep.add_argument("scenario", type=Path, help="scenario YAML file (its workload, checkpoint policy, faults)")
    if command == "deploy":
        from harness.cluster.deploy import DeployConfig

        add_config_arguments(dep, DeployConfig)
    suite = sub.add_parser("suite", help="run every scenario of a directory; write suite.json, junit.xml and a report")
    suite.add_argument("directory", type=Path, help="directory of scenario YAML files")
    suite.add_argument("--out", type=Path, help="output directory (default runs/suite-DIR-TIMESTAMP)")
    suite.add_argument("--cache", type=Path, help="reference cache (default $BAFT_CACHE_DIR or ~/.cache/baft-harness)")
    suite.add_argument("--no-report", dest="report", action="store_false", help="skip the HTML/Markdown reports")
    chk = sub.add_parser("check", help="audit a training script's resume under the faults clusters send: a battery "
                                       "of generated scenarios chosen from what the script does; a table, check.json")
    chk.add_argument("--nproc", type=int, default=1, help="processes per node (1)")
    chk.add_argument("--nodes", type=int, default=1, help="nodes; 2 or more add a node loss (1)")
    chk.add_argument("--launcher", choices=("python", "torchrun"), help="python for one process, torchrun above")
    chk.add_argument("--cwd", help="the directory the script runs in (default: each run's own)")
    chk.add_argument("--steps", type=int, help="its optimizer steps (default: counted by a first run)")
    chk.add_argument("--budget", type=float, help="seconds for the whole check; cases not started by then are not run")
    chk.add_argument("--out", type=Path, help="output directory (default runs/check-SCRIPT-TIMESTAMP)")
    chk.add_argument("--cache", type=Path, help="reference cache (default $BAFT_CACHE_DIR or ~/.cache/baft-harness)")
    chk.add_argument("script", help="the training script; then its arguments ({run_dir}: each run's own directory)")
    chk.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    fz = sub.add_parser("fuzz", help="search fault schedules (hypothesis) for one that fails; shrink it to a minimal scenario")
    fz.add_argument("scenario", type=Path, help="base scenario (workload, checkpoint, expect; its faults are replaced)")
    from harness.campaign.fuzz import FuzzConfig  # torch-free, as the parser must be

    add_config_arguments(fz, FuzzConfig)
    fz.add_argument("--out", type=Path, help="output directory (default runs/fuzz-NAME-TIMESTAMP)")
    fz.add_argument("--cache", type=Path, help="reference cache (default $BAFT_CACHE_DIR or ~/.cache/baft-harness)")


def _reading_flags(sub: Any) -> None:
    """The flags of the commands that read runs (``report``, ``findings``, ``advise``, ``publish``), ``validate``
    and ``cleanup``."""
    rep = sub.add_parser("report", help="write report.html, report.md and plots for a run (or suite) directory")
    rep.add_argument("path", type=Path, help="a run directory of `baft run`, or a suite directory of `baft suite`")
    rep.add_argument("--mtbf", default="1,6,24", help="hours between failures for the interval advice (default 1,6,24)")
    fnd = sub.add_parser("findings", help="a Markdown table of runs' resumes and their likely causes (the docs' "
                         "findings), from their verdicts")
    fnd.add_argument("paths", type=Path, nargs="+", help="run directories of `baft run`, or suite directories")
    adv = sub.add_parser("advise", help="checkpoint interval (Young/Daly) from a run's measured checkpoint cost")
    adv.add_argument("path", type=Path, help="a run directory of `baft run`")
    adv.add_argument("--mtbf", required=True, help="mean time between failures in hours (several: comma-separated)")
    adv.add_argument("--restart", type=float, help="seconds a restart costs (default: the run's worst recovery)")
    pub = sub.add_parser("publish", help="log a run to Weights & Biases (offline into RUN_DIR/wandb by default)")
    pub.add_argument("path", type=Path, help="a run directory of `baft run`")
    pub.add_argument("--online", action="store_true", help="publish online (needs WANDB_API_KEY or a netrc login)")
    pub.add_argument("--project", default="baft-harness", help="W&B project (default baft-harness)")
    pub.add_argument("--entity", help="W&B entity (team or user)")
    val = sub.add_parser("validate", help="validate scenario files without running anything")
    val.add_argument("scenarios", nargs="+")
    clean = sub.add_parser("cleanup", help="remove what killed runs left: /dev/shm/baft-* snapshots and baft-* "
                                           "network namespaces whose run is gone")
    clean.add_argument("--dry-run", dest="dry_run", action="store_true", help="list what would go; remove nothing")
    clean.add_argument("--force", action="store_true",
                       help="also what live runs own (stop every baft run first)")


def _measuring_flags(sub: Any, command: str | None) -> None:
    """The flags of ``baft bench`` and ``project``."""
    bench = sub.add_parser("bench", help="measure each checkpointing strategy's cost against none (paired)")
    bench.add_argument("--out", type=Path, default=Path("runs/bench"), help="output directory (default runs/bench)")
    if command == "bench":
        from harness.bench.bench import BenchConfig

        add_config_arguments(bench, BenchConfig)
    bench.add_argument("--digest", type=float, metavar="GB",
                       help="instead: time the state fingerprint (xxh3-128 + norms vs blake2b) over GB of float32 tensors")
    bench.add_argument("--digest-device", dest="digest_device", metavar="DEVICE",
                       help="with --digest: also time the device digest (baft.state.devicedigest) on DEVICE "
                            "(cuda, cpu), beside the host pass")
    bench.add_argument("--device-check", dest="device_check", type=float, metavar="GB", nargs="?", const=2.0,
                       help="instead: baft on one GPU (the CPU without one) with GB of parameters and Adam state "
                            "(default 2): cost against none with pipeline-like waits, the copies' share inside the "
                            "waits and rate against a plain device-to-host copy, a snapshot and a SIGKILLed "
                            "process's restore bit for bit, device fingerprints; writes device-check.json")
    bench.add_argument("--simulate-device", dest="simulate_device", metavar="MODULE:FACTORY",
                       help="with --device-check: run baft's device path on a simulated device that factory makes "
                            "(the CPU rehearsal of a GPU run; from a checkout: tests.fakes.streams:rehearsal_device)")
    bench.add_argument("--process-group", dest="process_group", metavar="BACKEND",
                       help="with --device-check: also SIGKILL and restore inside a process group of world size 1 "
                            "of BACKEND (nccl on a GPU; refusecpu, the tests' stand-in of NCCL, from a checkout)")
    bench.add_argument("--probe", action="store_true",
                       help="instead: the probe's cost per step on the shipped unmodified-script examples, and its "
                            "fingerprint rate on a 1 GB state")
    proj = sub.add_parser("project", help="each strategy's wasted share of training time on a target cluster: "
                                          "a model and a seeded simulation of it, a table, projection.json, plots")
    proj.add_argument("--out", type=Path, default=Path("runs/project"), help="output directory (default runs/project)")
    proj.add_argument("--run-hours", dest="run_hours", type=float, default=720.0,
                      help="hours of useful training the projection is for (default 720)")
    proj.add_argument("--seed", type=int, default=0, help="seed of the simulated failures (default 0)")
    proj.add_argument("--from", dest="from_run", type=Path, metavar="RUN_DIR|bench.json",
                      help="take what the target leaves unset from a measured run (a `baft run` directory) or a "
                           "`baft bench` result: bubble share, copy rate, detection, restart, and the iteration "
                           "time scaled by the state per GPU")
    proj.add_argument("--check", nargs="+", type=Path, metavar="RUN_DIR",
                      help="instead: predict these runs (or the runs of a suite's directory) from their own "
                           "profiles with the projection's rules, against what they measured; writes check.json")
    if command == "project":
        from analysis.projection import Target

        add_config_arguments(proj, Target)


def _project(args: argparse.Namespace) -> int:
    import dataclasses

    from analysis.errors import ConfigFieldError
    from analysis.projection import Target
    from harness.bench.project import run_projection, table
    from harness.cliconfig import flag

    if args.check:
        from harness.bench.projectcheck import check_table, run_check

        given = [flag(f.name) for f in dataclasses.fields(Target) if hasattr(args, f.name)]
        if given or args.from_run:
            raise UsageError(f"--check predicts the runs from their own profiles: it takes no target "
                             f"({', '.join(given + (['--from'] if args.from_run else []))} given)")
        result = run_check(args.check, args.out)
        print(check_table(result))
        print(f"check.json: {args.out / 'check.json'}")
        return 0
    provenance: list[str] = []
    try:
        if args.from_run:
            from analysis.errors import AnalysisError
            from analysis.profile import read_profile
            from harness.bench.project import target_from_profile

            try:
                profile = read_profile(args.from_run)
            except AnalysisError as e:
                raise UsageError(f"--from: {e}") from None
            values = {f.name: getattr(args, f.name) for f in dataclasses.fields(Target) if hasattr(args, f.name)}
            target, provenance = target_from_profile(profile, values)
        else:
            target = config_from_args(Target, args)
    except ConfigFieldError as e:
        raise UsageError(f"{flag(e.field)}: expected {e.expected}, found {e.found!r}") from None
    if not args.run_hours > 0:
        raise UsageError(f"--run-hours: expected a number > 0, found {args.run_hours!r}")
    result = run_projection(target, args.out, args.run_hours, args.seed, provenance)
    for line in provenance:
        print(line)
    print(table(result))
    print(f"projection.json: {args.out / 'projection.json'}; plots: " + ", ".join(result["plots"]))
    return 0


def _digest_bench(gigabytes: float, out: Path, device: str | None = None) -> int:
    import json

    from harness.bench.digest import digest_benchmark, digest_table
    from harness.errors import ConfigValueError

    try:
        result = digest_benchmark(gigabytes, device=device)
    except ConfigValueError as e:
        raise UsageError(f"--digest: {e}") from None
    out.mkdir(parents=True, exist_ok=True)
    (out / "digest.json").write_text(json.dumps(result, indent=2) + "\n")
    print(digest_table(result))
    print(f"digest.json: {out / 'digest.json'}")
    return 0


def _device_check(gigabytes: float, out: Path, simulate: str | None, process_group: str | None) -> int:
    from harness.bench.devicecheck import check_table, device_check, passed

    try:
        result = device_check(gigabytes, out, simulate=simulate, process_group=process_group)
    except ValueError as e:
        raise UsageError(f"--device-check: {e}") from None
    print(check_table(result))
    print(f"device-check.json: {out / 'device-check.json'}")
    failures = passed(result)
    for f in failures:
        print(f"  FAILED: {f}")
    return 1 if failures else 0


def _probe_bench(out: Path) -> int:
    import json

    from harness.bench.probecost import probe_benchmark, probe_table

    out.mkdir(parents=True, exist_ok=True)
    result = probe_benchmark(out)
    (out / "probe.json").write_text(json.dumps(result, indent=2) + "\n")
    print(probe_table(result))
    print(f"probe.json: {out / 'probe.json'}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from harness.bench.bench import BenchConfig, run_bench, table

    if args.digest is not None:
        return _digest_bench(args.digest, args.out, args.digest_device)
    if args.probe:
        return _probe_bench(args.out)
    if args.device_check is not None:
        return _device_check(args.device_check, args.out, args.simulate_device, args.process_group)
    cfg = config_from_args(BenchConfig, args)
    w = cfg.workload
    inside = "".join(f" x {label}{n}" for label, n in (("DP", w.data_parallel), ("FSDP", w.dp_shard), ("TP", w.tp)) if n > 1)
    print(f"baft: bench {w.model}, {w.stages} stages{inside} ({cfg.world_size} ranks), {w.microbatches} microbatches, {w.schedule}; "
          f"{cfg.cycles} cycles x {len(cfg.arms())} arms x {cfg.block} iterations -> {args.out}", flush=True)
    try:
        result = run_bench(cfg, args.out)
    except HarnessError as e:
        print(f"baft: error: {e}", file=sys.stderr)
        return 1
    print(table(result))
    print(f"bench.json: {args.out / 'bench.json'} ({result['wall_seconds']:.0f} s)")
    return 0


def _hours(text: str) -> tuple[float, ...]:
    """``--mtbf`` as hours; :class:`UsageError` when it is not a list of numbers > 0."""
    try:
        hours = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        hours = ()
    if hours and all(h > 0 for h in hours):
        return hours
    raise UsageError(f"--mtbf: expected hours > 0, comma-separated, found {text!r}")


def _report(args: argparse.Namespace) -> int:
    from analysis.errors import AnalysisError
    from analysis.report import report

    hours = _hours(args.mtbf)
    try:
        r = report(args.path, hours)
    except AnalysisError as e:
        raise UsageError(str(e)) from None
    print(f"{r.html}\n{r.markdown}" + "".join(f"\n{f}" for f in r.figures))
    return 0


def _findings(args: argparse.Namespace) -> int:
    from analysis.errors import AnalysisError
    from analysis.findings import table

    try:
        print(table(args.paths))
    except AnalysisError as e:
        raise UsageError(str(e)) from None
    return 0


def _advise(args: argparse.Namespace) -> int:
    from analysis.advisor import advise, measured_cost
    from analysis.errors import AnalysisError
    from analysis.journal import Journal
    from analysis.verdict import load_verdict

    hours = _hours(args.mtbf)
    try:
        v = load_verdict(args.path)
        run = Journal.load(args.path / "faulted")
        cost, how = measured_cost(run)
    except AnalysisError as e:
        raise UsageError(str(e)) from None
    steps = [e["seconds"] for e in run.events("step") if e.get("seconds") is not None]
    iteration = statistics.median(steps) if steps else None
    if cost is None or not iteration:
        raise UsageError(f"{args.path}: no measured checkpoint cost ({how})")
    restart = args.restart if args.restart is not None else (v.recovery_seconds or 0.0)
    print(f"checkpoint cost {cost * 1e3:.2f} ms ({how}), iteration {iteration * 1e3:.1f} ms, restart {restart:.1f} s")
    print(f"{'MTBF h':>8} {'Daly s':>9} {'Young s':>9} {'every':>6} {'waste':>8}")
    for h in hours:
        a = advise(cost, h * 3600, iteration, restart)
        print(f"{h:>8g} {a['daly_seconds']:>9.2f} {a['young_seconds']:>9.2f} {a['every_steps']:>6d} {100 * a['waste']:>7.3f}%")
    return 0


def _publish(path: Path, online: bool, project: str = "baft-harness", entity: str | None = None) -> int:
    from analysis.errors import AnalysisError
    from analysis.publish import PublishConfig, publish

    try:
        r = publish(path, PublishConfig(project=project, entity=entity, mode="online" if online else "offline"))
    except AnalysisError as e:
        raise UsageError(str(e)) from None
    print(f"wandb: {r.mode} run {r.run_id} -> {r.url or r.wandb_dir}")
    return 0


def _fuzz(args: argparse.Namespace) -> int:
    from harness.campaign.fuzz import FuzzConfig, fuzz

    config = config_from_args(FuzzConfig, args)
    out = args.out or Path("runs") / f"fuzz-{args.scenario.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    r = fuzz(args.scenario, config, out, args.cache)
    failed = sum(not t.passed for t in r.trials)
    unrealized = sum(t.unrealized for t in r.trials)
    print(f"{len(r.trials)} trials, {failed} failed" + (f", {unrealized} unrealized (a persist, replicate or restore "
          "fault whose moment never came: an earlier fault's restart went past its version, or the restore took "
          "another path)" if unrealized else "") + f"; fuzz.json: {out / 'fuzz.json'}")
    if r.minimal_file is None:
        print("no failing schedule found")
        return 0
    print(f"minimal failing schedule: {r.minimal_file}\n  reproduce: baft run {r.minimal_file}")
    return 1


def _run_options(args: argparse.Namespace) -> tuple[Any, Any]:
    """``baft run``'s options and, with ``--target k8s``, the cluster path's (None otherwise; a cluster flag
    given without ``--target k8s`` is refused)."""
    import dataclasses

    from harness.cluster.config import ClusterOptions
    from harness.run.options import RunOptions

    options = config_from_args(RunOptions, args)
    if options.target == "k8s":
        if getattr(args, "dry_run", False):  # printing the objects follows no job: those flags change nothing
            for name in [n for n in vars(args) if n.startswith("follow.")]:
                delattr(args, name)
        return options, config_from_args(ClusterOptions, args)
    cluster_flags = [f.name for f in dataclasses.fields(ClusterOptions) if hasattr(args, f.name)]
    cluster_flags += [name for name in vars(args) if name.startswith("follow.")]
    if cluster_flags:
        from harness.cliconfig import flag

        raise UsageError(f"{flag(cluster_flags[0].removeprefix('follow.'))} is for --target k8s (a job on a cluster); "
                         "this run is local")
    return options, None


def _k8s(scenario: Any, options: Any, cluster: Any) -> int:
    """``--target k8s``: the scenario's faults as Chaos Mesh objects, printed (``--dry-run``) or driven
    against the job on the cluster (:mod:`harness.cluster.run`)."""
    import dataclasses

    from analysis.summary import format_summary
    from harness.cluster.run import ClusterRunError, plan, run_on_cluster
    from injectors.chaosmesh.manifests import ClusterTarget, Crds, CrdUnavailable, Unmappable, to_yaml, validate
    from injectors.chaosmesh.schema import ManifestInvalid
    from injectors.errors import InjectorError

    crds = None  # on a cluster: the ones it serves, read through the client (ClusterRun validates against them)
    if cluster.dry_run:
        try:
            crds = Crds.from_user(cluster.crds)
        except CrdUnavailable as e:
            raise UsageError(str(e)) from None
    run_id = time.strftime("%m%d%H%M%S")
    try:
        extra = {"rank_label": cluster.rank_label} if cluster.rank_label else {}
        # One pod per scenario node (a torchrun agent each), so a pod holds world_size / nodes ranks.
        w = scenario.workload
        target = ClusterTarget(namespace=cluster.namespace, selector=cluster.labels(), ranks_per_pod=w.world_size // w.nodes,
                               **extra)
        firings = plan(scenario, target, run_id, crds)
    except (Unmappable, ManifestInvalid, InjectorError) as e:
        raise UsageError(f"{scenario.source}: {e}") from None
    if cluster.workflow:  # with --dry-run (ClusterOptions says so otherwise)
        from injectors.chaosmesh.workflow import workflow_manifest

        try:
            workflow = workflow_manifest([(i, f.kind, f.config) for i, f in enumerate(scenario.faults)], target, run_id)
            assert crds is not None  # --workflow needs --dry-run, which read them
            validate(workflow, crds)
        except (Unmappable, ManifestInvalid, InjectorError) as e:
            raise UsageError(f"{scenario.source}: {e}") from None
        sys.stdout.write(to_yaml([workflow]))
        return 0
    if cluster.dry_run:
        sys.stdout.write(to_yaml(obj for f in firings for obj in f.objects))
        return 0
    if cluster.reference is not None and not (cluster.reference / "journal").is_dir():
        raise UsageError(f"--reference {cluster.reference}: expected a run directory with a journal/ (an "
                         "uninterrupted run of the same job), found none")
    from injectors.chaosmesh.client import ChaosClient

    out = options.out or Path("runs") / f"{scenario.name}-k8s-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        config = dataclasses.replace(cluster.follow, timeout=scenario.run.timeout)
        client = ChaosClient(cluster.kubeconfig, context=cluster.context)
        source = f"W&B run {config.wandb_run}" if config.wandb_run else f"the job in {config.job_dir}"
        print(f"baft: following {source} ({len(firings)} firings on namespace {cluster.namespace}) -> {out}", flush=True)
        verdict = run_on_cluster(scenario, client, target, config, out, run_id, cluster.reference, report=options.report)
    except (ClusterRunError, InjectorError) as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"{e.filename or out}: {e.strerror or e}") from None
    print(format_summary(verdict, out))
    return 0 if verdict.passed else 1


def _deploy(args: argparse.Namespace) -> int:
    from harness.cluster.deploy import DeployConfig, deployment
    from harness.errors import ConfigValueError
    from harness.scenario import load
    from injectors.chaosmesh.manifests import to_yaml

    scenario = load(args.scenario, host=False)
    cfg = config_from_args(DeployConfig, args)
    try:
        objects = deployment(scenario, cfg)
    except ConfigValueError as e:  # what the scenario asks of the config (a reference run for the harness)
        raise flag_error(e) from None
    sys.stdout.write(to_yaml(objects))
    return 0


def _suite(args: argparse.Namespace) -> int:
    from analysis.summary import format_table
    from harness.campaign.suite import run_suite

    out = args.out or Path("runs") / f"suite-{args.directory.resolve().name}-{time.strftime('%Y%m%d-%H%M%S')}"
    results = run_suite(args.directory, out, args.cache, report=args.report)
    print(format_table(results))
    print(f"suite.json: {out / 'suite.json'}\njunit.xml:  {out / 'junit.xml'}"
          + (f"\nreport:     {out / 'report.html'}" if args.report else ""))
    return 0 if all(r.passed for r in results) else 1


def _cleanup(args: argparse.Namespace) -> int:
    from harness.run.leftovers import sweep

    result = sweep(force=args.force, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for name in result.removed:
        print(f"{verb}  {name}")
    for why in result.kept:
        print(f"kept     {why}")
    for error in result.errors:
        print(f"baft: error: {error}", file=sys.stderr)
    if not result.removed:
        print("nothing left behind by killed runs")
    return 1 if result.errors else 0


def main(argv: list[str] | None = None) -> int:
    """Run one command. Bad input: one line, exit 2. SIGINT/SIGTERM: everything the command started is
    stopped and undone, exit 130/143."""
    from harness.run.processes import cancellation

    argv = sys.argv[1:] if argv is None else argv
    _plain_deprecations()
    # The command is the first word that is not an option (``baft`` itself has none but --help).
    args = _parser(next((a for a in argv if not a.startswith("-")), None)).parse_args(argv)
    try:
        with cancellation():
            return _command(args)
    except UsageError as e:  # bad input, a scenario file's included: one line, no traceback
        print(f"baft: error: {e}", file=sys.stderr)
        return 2
    except Cancelled as c:
        print(f"baft: {c}; stopped what the run had started", file=sys.stderr)
        return c.exit_code


def _plain_deprecations() -> None:
    """A moved key or flag said as ``baft: warning: ...`` on one line: the message names the user's file and key;
    the line of the harness that noticed it would only be noise."""
    import warnings

    from baft.errors import BaftDeprecationWarning

    default = warnings.formatwarning

    def formatwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      line: str | None = None) -> str:
        if issubclass(category, BaftDeprecationWarning):
            return f"baft: warning: {message}\n"
        return default(message, category, filename, lineno, line)

    warnings.formatwarning = formatwarning


def _command(args: argparse.Namespace) -> int:
    """Run the command ``args`` names; bad input raises :class:`UsageError`."""
    if args.command == "bench":
        return _bench(args)
    if args.command == "report":
        return _report(args)
    if args.command == "advise":
        return _advise(args)
    if args.command == "findings":
        return _findings(args)
    if args.command == "publish":
        return _publish(args.path, args.online, args.project, args.entity)
    if args.command == "suite":
        return _suite(args)
    if args.command == "deploy":
        return _deploy(args)
    if args.command == "fuzz":
        return _fuzz(args)
    if args.command == "cleanup":
        return _cleanup(args)
    if args.command == "project":
        return _project(args)
    if args.command == "check":
        from harness.campaign.checkrun import command

        return command(args)
    from harness.scenario import load

    if args.command == "validate":
        for f in args.scenarios:
            s = load(f)
            print(f"{f}: ok ({s.name}: {s.workload.world_size} ranks, {len(s.faults)} faults)")
        return 0
    # On a cluster Chaos Mesh injects the faults: this host need not be able to (root, tc, netem), and the
    # training script is in the pods' image, not beside the scenario (the harness Job's copy of it).
    options, cluster = _run_options(args)
    local = cluster is None
    scenario = load(args.scenario, host=local, files=local)
    if cluster is not None:
        return _k8s(scenario, options, cluster)
    from analysis.summary import format_summary
    from harness.run.runner import run_scenario

    out = options.out or Path("runs") / f"{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"baft: running {scenario.name} ({scenario.workload.world_size} ranks on {scenario.workload.nodes} node(s)) -> {out}", flush=True)
    try:
        verdict = run_scenario(scenario, out, options.cache, report=options.report)
    except HarnessError as e:
        print(f"baft: error: {e}", file=sys.stderr)
        return 1
    print(format_summary(verdict, out))
    if options.wandb or options.wandb_online:
        _publish(out, options.wandb_online)
    return 0 if verdict.passed else 1


def entry() -> None:
    """The ``baft`` console script."""
    code = main()
    if code in (130, 143):
        # Cancelled, and everything the run started is already undone: skip the interpreter's
        # teardown (seconds of torch's own under load) so the exit comes when the cleanup is done.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
