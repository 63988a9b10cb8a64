"""Publish a scenario run directory (``baft run --out OUT``) to Weights & Biases.

What one W&B run holds:

* config: the scenario YAML as written (``OUT/scenario.yaml``) plus the verdict's headline
  numbers under ``verdict``, so runs can be filtered by workload, fault and outcome;
* history, with ``step`` as the x axis: ``reference/loss`` and ``faulted/loss`` (each step's
  loss of its last execution, :func:`analysis.losscurve.loss_curve`);
* tables: ``faults`` (every fault that fired), ``restores`` (every checkpoint restore) and
  ``recoveries`` (what each fatal fault cost, from the verdict);
* summary: passed, bitwise_equal, lost_steps, recovery_seconds, faults_fired (and the
  loss-curve verdict when the scenario had one);
* an artifact ``<scenario>-report`` of type ``baft-report``: verdict.json, scenario.yaml and
  whichever of report.html, report.md and ``*.png`` exist.

Offline is the default: nothing leaves the machine, and every file W&B writes (the
run, its cache, staging copies of artifact files, its settings) stays under
``OUT/wandb``; ``wandb sync OUT/wandb/wandb/offline-run-*`` uploads it later.
:func:`read_offline_run` decodes such an offline run without network, so tests
(and users) can check what was written.

wandb is an optional dependency, imported only here and only when called.
"""
from __future__ import annotations

import contextlib
import json
import netrc
import os
import re
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from .errors import AnalysisError
from .journal import Journal
from .losscurve import loss_curve
from .metrics import fault_target
from .record import plain
from .verdict import load_verdict

INSTALL_HINT = "pip install 'baft-harness[wandb]'"
MODES = ("offline", "online")
#: Files of a run directory the report artifact carries when they exist (plus every ``*.png``).
REPORT_FILES = ("verdict.json", "scenario.yaml", "report.html", "report.md")
#: Verdict fields copied into the run's summary (and into config under ``verdict``).
SUMMARY_KEYS = ("passed", "bitwise_equal", "lost_steps", "recovery_seconds", "faults_fired", "faults_declared",
                "completed", "failures")
DEFAULT_HOST = "https://api.wandb.ai"
#: Seconds to wait for wandb's service to write out a finished run.
FLUSH_TIMEOUT = 60.0


class PublishError(AnalysisError):
    """Publishing to W&B cannot start or failed: wandb missing, no credentials, a bad run directory."""


@dataclass(kw_only=True, slots=True)
class PublishConfig:
    """Where and how a run directory is published."""

    project: str = "baft-harness"
    """The W&B project the run goes into."""
    entity: str | None = None
    """The W&B user or team (null: the default entity of the credentials)."""
    mode: str = "offline"
    """``offline`` (default: written under ``OUT/wandb`` only, upload later with ``wandb sync``)
    or ``online`` (uploads now; needs ``WANDB_API_KEY`` or a netrc entry for the W&B host)."""
    run_name: str | None = None
    """The W&B run's display name (null: the scenario name from the verdict)."""
    tags: list[str] = field(default_factory=list)
    """Tags of the W&B run (the verdict's PASSED / FAILED is added to them)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise PublishError(f"mode: expected one of {', '.join(MODES)}, found {self.mode!r}")
        if not isinstance(self.project, str) or not self.project.strip():
            raise PublishError(f"project: expected a non-empty string, found {self.project!r}")
        if not isinstance(self.tags, list) or not all(isinstance(t, str) and t for t in self.tags):
            raise PublishError(f"tags: expected a list of non-empty strings, found {self.tags!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishResult:
    """What :func:`publish` wrote."""

    run_id: str
    """The W&B run id."""
    mode: str
    """``offline`` or ``online``."""
    wandb_dir: Path
    """The W&B run directory written (``OUT/wandb/wandb/offline-run-<time>-<id>`` offline): what
    ``wandb sync`` takes and :func:`read_offline_run` reads."""
    url: str | None
    """The run's page (online only)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class _Payload:
    """Everything published, read and checked before wandb starts (bad input fails first)."""

    name: str
    config: dict[str, Any]
    curves: dict[str, dict[int, float]]
    faults: list[list[Any]]
    restores: list[list[Any]]
    recoveries: list[list[Any]]
    summary: dict[str, Any]
    files: list[Path]


FAULT_COLUMNS = ["step", "kind", "target", "phase", "fatal"]
RESTORE_COLUMNS = ["step", "tier", "incarnation", "ranks"]
RECOVERY_COLUMNS = ["fault", "step", "restored_step", "tier", "lost_steps", "recovery_seconds", "detection_seconds"]


def publish(run_dir: Path, config: PublishConfig | None = None) -> PublishResult:
    """Publish the scenario run in ``run_dir`` as one W&B run; returns where it went.

    The run directory is read completely first, so a missing verdict or an unreadable
    journal fails before W&B is started. Online mode is refused unless credentials
    exist (W&B would otherwise prompt for them).
    """
    cfg = config or PublishConfig()
    run_dir = Path(run_dir).resolve()
    payload = _collect(run_dir)
    if cfg.mode == "online":
        _require_credentials()
    wandb = _import_wandb()
    root = run_dir / "wandb"
    root.mkdir(parents=True, exist_ok=True)
    # A run of the caller's (wandb.run) keeps its service process; otherwise ours is shut down
    # when done, so that nothing it writes later lands outside this run directory.
    own_service = wandb.run is None
    with _wandb_environment(root):
        try:
            try:
                run = wandb.init(
                    project=cfg.project, entity=cfg.entity, name=cfg.run_name or payload.name, mode=cfg.mode,
                    dir=str(root), config=payload.config, job_type="baft-scenario",
                    tags=[*cfg.tags, "passed" if payload.summary.get("passed") else "failed"],
                    settings=_settings(wandb, cfg.mode),
                )
            except Exception as e:  # wandb's own errors (no network, bad entity) say what went wrong
                raise PublishError(f"wandb.init ({cfg.mode}) failed: {e}") from e
            try:
                _log(wandb, run, payload)
            except BaseException:
                run.finish(exit_code=1)
                raise
            run_id, sync_dir = run.id, Path(run.dir).parent
            url = run.url if cfg.mode == "online" else None
            run.finish()
        finally:
            if own_service:
                with contextlib.suppress(SystemExit):  # teardown exits with the service's nonzero code
                    wandb.teardown()
    # wandb's service writes the transaction log in the background: run.finish() can return
    # before it is on disk (teardown flushes it; a caller's service keeps running).
    _wait_for_exit_record(sync_dir, FLUSH_TIMEOUT)
    return PublishResult(run_id=run_id, mode=cfg.mode, wandb_dir=sync_dir, url=url)


def _wait_for_exit_record(sync_dir: Path, timeout: float) -> None:
    """Wait until the run's transaction log ends with its exit record (the run is complete on disk)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(PublishError):
            if read_offline_run(sync_dir)["exit_code"] is not None:
                return
        if time.monotonic() > deadline:
            raise PublishError(f"{sync_dir}: wandb had not finished writing the run after {timeout:.0f} s")
        time.sleep(0.05)


def _import_wandb() -> Any:
    """The wandb module, or a :class:`PublishError` that says how to install it."""
    try:
        import wandb
    except ImportError as e:
        raise PublishError(f"publishing to Weights & Biases needs wandb: {INSTALL_HINT} ({e})") from None
    return wandb


def _require_credentials() -> None:
    """Online mode needs an API key: ``WANDB_API_KEY`` or a netrc entry for the W&B host."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or DEFAULT_HOST).hostname or ""
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc").expanduser()
    try:
        if path.is_file() and netrc.netrc(path).authenticators(host):
            return
    except (netrc.NetrcParseError, OSError):
        pass
    raise PublishError(f"online mode needs W&B credentials: set WANDB_API_KEY, or run `wandb login` (a netrc entry "
                       f"for {host} in {path}); or publish offline and `wandb sync` later")


@contextlib.contextmanager
def _wandb_environment(root: Path) -> Iterator[None]:
    """Point every directory wandb writes to (run files, cache, staging, settings) under ``root``
    and silence it, for the duration of the block only."""
    values = {
        "WANDB_DIR": root,
        "WANDB_CACHE_DIR": root / "cache",
        "WANDB_DATA_DIR": root / "data",
        "WANDB_CONFIG_DIR": root / "config",
        "WANDB_ARTIFACT_DIR": root / "artifacts",
        "WANDB_SILENT": "true",
    }
    saved = {k: os.environ.get(k) for k in values}
    try:
        os.environ.update({k: str(v) for k, v in values.items()})
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _settings(wandb: Any, mode: str) -> Any:
    """Settings that keep a publish quiet and local: no console capture, no code or git
    capture, no system metrics or machine metadata (the publishing machine's are not the
    run's), no requirements file. Fields an older wandb lacks are left out."""
    wanted: dict[str, Any] = {
        "mode": mode, "console": "off", "silent": True, "disable_code": True, "save_code": False,
        "disable_git": True, "disable_job_creation": True, "reinit": "create_new",
        "x_disable_stats": True, "x_disable_meta": True, "x_disable_machine_info": True,
        "x_save_requirements": False,
    }
    known = getattr(wandb.Settings, "model_fields", None)
    if known is not None:
        wanted = {k: v for k, v in wanted.items() if k in known}
    return wandb.Settings(**wanted)


def _collect(run_dir: Path) -> _Payload:
    """Read the verdict, the scenario and both journals into what is published."""
    try:
        verdict = load_verdict(run_dir)
    except AnalysisError as e:
        raise PublishError(str(e)) from None
    scenario: dict[str, Any] = {}
    if (run_dir / "scenario.yaml").is_file():
        try:
            loaded = yaml.safe_load((run_dir / "scenario.yaml").read_text())
        except yaml.YAMLError as e:
            raise PublishError(f"{run_dir / 'scenario.yaml'}: not valid YAML: {e}") from None
        scenario = loaded if isinstance(loaded, dict) else {}
    name = str(verdict.scenario or scenario.get("name") or run_dir.name)
    reference, faulted = Journal.load(run_dir / "reference"), Journal.load(run_dir / "faulted")

    summary = {k: plain(getattr(verdict, k)) for k in SUMMARY_KEYS}
    if verdict.loss_curve is not None:
        summary["loss_curve"] = verdict.loss_curve.to_json()
    headline = {k: v for k, v in summary.items() if k not in ("failures", "loss_curve")}
    for k in ("world_size", "wall_seconds"):
        if getattr(verdict, k) is not None:
            headline[k] = plain(getattr(verdict, k))

    faults = [[f.get("step"), f.get("fault"), fault_target(f), f.get("phase"), bool(f.get("fatal", True))]
              for f in faulted.events("fault")]
    restores: dict[tuple[Any, Any, Any], set[Any]] = {}
    for ev in faulted.events("checkpoint_restored"):
        restores.setdefault((ev.get("step"), ev.get("tier"), ev.get("incarnation")), set()).add(ev.get("rank"))
    recoveries = []
    for r in verdict.recoveries:
        recoveries.append([f"{r.fault.get('fault')} {fault_target(r.fault)}", r.fault.get("step"), r.restored_step,
                           r.restored_tier, r.lost_steps, r.recovery_seconds, r.detection_seconds])
    files = [run_dir / f for f in REPORT_FILES if (run_dir / f).is_file()]
    files += sorted(p for p in run_dir.glob("*.png") if p.is_file())
    return _Payload(
        name=name,
        config={**scenario, "name": scenario.get("name", name), "verdict": headline},
        curves={"reference/loss": loss_curve(reference), "faulted/loss": loss_curve(faulted)},
        faults=faults,
        restores=[[s, t, i, len(ranks)] for (s, t, i), ranks in restores.items()],
        recoveries=recoveries,
        summary=summary,
        files=files,
    )


def _log(wandb: Any, run: Any, p: _Payload) -> None:
    """Write the payload into an initialised W&B run."""
    run.define_metric("step")
    run.define_metric("*", step_metric="step")
    for step in sorted(set().union(*(c.keys() for c in p.curves.values()))):
        row: dict[str, Any] = {"step": step}
        row.update({key: curve[step] for key, curve in p.curves.items() if step in curve})
        run.log(row)
    run.log({
        "faults": wandb.Table(columns=FAULT_COLUMNS, data=p.faults),
        "restores": wandb.Table(columns=RESTORE_COLUMNS, data=p.restores),
        "recoveries": wandb.Table(columns=RECOVERY_COLUMNS, data=p.recoveries),
    })
    for k, v in p.summary.items():
        run.summary[k] = v
    artifact = wandb.Artifact(_artifact_name(f"{p.name}-report"), type="baft-report",
                              description=f"verdict, scenario and report of {p.name}",
                              metadata={"passed": p.summary.get("passed")})
    for f in p.files:
        artifact.add_file(str(f), name=f.name)
    run.log_artifact(artifact)


def _artifact_name(name: str) -> str:
    """W&B artifact names allow letters, digits, ``-``, ``_`` and ``.`` only."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name)[:128]


# --- reading an offline run back -------------------------------------------------------
#
# The ``run-<id>.wandb`` file is wandb's transaction log: a 7-byte header (b":W&B",
# magic 0xBEE1, version), then a leveldb-style log of 32 KiB blocks (block offsets count
# from the start of the file, header included). Each chunk has a 7-byte header
# (crc32 of the type byte and the data, length, type FULL/FIRST/MIDDLE/LAST); the
# reassembled payload is a protobuf ``wandb.proto.wandb_internal_pb2.Record``. wandb
# 0.31 writes it from its Go core and has no Python reader any more, so this is one.

_HEADER = struct.Struct("<4sHB")
_CHUNK = struct.Struct("<IHB")
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_offline_run(wandb_dir: Path) -> dict[str, Any]:
    """Decode an offline W&B run without network.

    ``wandb_dir`` is the run directory (``.../offline-run-*``), or any folder above it
    (``OUT/wandb``): the newest ``run-*.wandb`` under it is read. Returns
    ``{"run": {id, project, entity, name, tags}, "config": {...}, "history": [{key: value}],
    "summary": {...}, "artifacts": [names], "artifact_files": {name: [paths]},
    "files": [paths], "exit_code": int | None}`` with values decoded from JSON, nested keys
    as nested dicts.
    """
    path = _transaction_log(Path(wandb_dir))
    pb = _import_wandb_proto()
    out: dict[str, Any] = {"run": {}, "config": {}, "history": [], "summary": {}, "artifacts": [],
                           "artifact_files": {}, "files": [], "exit_code": None}
    for payload in _records(path):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            out["run"] = {"id": r.run_id, "project": r.project, "entity": r.entity, "name": r.display_name,
                          "tags": list(r.tags)}
            _apply(out["config"], r.config.update, r.config.remove)
            _apply(out["summary"], r.summary.update, r.summary.remove)
        elif kind == "config":
            _apply(out["config"], record.config.update, record.config.remove)
        elif kind == "history":
            row: dict[str, Any] = {}
            _apply(row, record.history.item, [])
            out["history"].append(row)
        elif kind == "summary":
            _apply(out["summary"], record.summary.update, record.summary.remove)
        elif kind == "artifact":
            out["artifacts"].append(record.artifact.name)
            out["artifact_files"][record.artifact.name] = [c.path for c in record.artifact.manifest.contents]
        elif kind == "files":
            out["files"].extend(f.path for f in record.files.files if f.path not in out["files"])
        elif kind == "exit":
            out["exit_code"] = record.exit.exit_code
    return out


def _transaction_log(where: Path) -> Path:
    """The ``run-*.wandb`` file of a run directory, or the newest one below ``where``."""
    found = sorted(where.glob("run-*.wandb")) or sorted(where.glob("**/*run-*/run-*.wandb"))
    if not found:
        raise PublishError(f"{where}: no W&B run (run-*.wandb) in or below it")
    return max(found, key=lambda p: p.stat().st_mtime)


def _import_wandb_proto() -> Any:
    try:
        from wandb.proto import wandb_internal_pb2
    except ImportError as e:
        raise PublishError(f"reading a W&B run needs wandb: {INSTALL_HINT} ({e})") from None
    return wandb_internal_pb2


def _records(path: Path) -> Iterator[bytes]:
    """The record payloads of a wandb transaction log, checksums verified; a torn tail
    (a writer killed mid-record) ends the iteration."""
    data = path.read_bytes()
    if len(data) < _HEADER.size:
        raise PublishError(f"{path}: too short for a W&B transaction log")
    ident, magic, _version = _HEADER.unpack_from(data)
    if ident != b":W&B" or magic != 0xBEE1:
        raise PublishError(f"{path}: not a W&B transaction log (header {data[:7]!r})")
    pos, parts = _HEADER.size, b""
    while pos + _CHUNK.size <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK.size:  # a block trailer: zero padding
            pos += left
            continue
        crc, length, kind = _CHUNK.unpack_from(data, pos)
        if crc == 0 and length == 0 and kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk = data[pos + _CHUNK.size: pos + _CHUNK.size + length]
        if len(chunk) < length:
            return
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise PublishError(f"{path}: checksum mismatch at byte {pos}")
        pos += _CHUNK.size + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            parts = chunk
        elif kind == _MIDDLE:
            parts += chunk
        elif kind == _LAST:
            yield parts + chunk
            parts = b""
        else:
            raise PublishError(f"{path}: unknown chunk type {kind} at byte {pos}")


def _apply(target: dict[str, Any], updates: Any, removes: Any) -> None:
    """Apply wandb ``{key | nested_key, value_json}`` items (and removals) to a nested dict."""
    for item in updates:
        keys = [item.key] if item.key else list(item.nested_key)
        node = target
        for k in keys[:-1]:
            child = node.get(k)
            if not isinstance(child, dict):
                child = node[k] = {}
            node = child
        node[keys[-1]] = json.loads(item.value_json)
    for item in removes:
        keys = [item.key] if item.key else list(item.nested_key)
        node = target
        for k in keys[:-1]:
            node = node.get(k, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(keys[-1], None)
