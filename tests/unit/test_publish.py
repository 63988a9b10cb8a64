"""Publishing a run directory to W&B (offline), read back from the transaction log it wrote.

The tests that publish start wandb's service process (wandb-core), hence ``e2e``; the
error paths start nothing.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from analysis.journal import JournalWriter, float_bits, rank_journal
from analysis.losscurve import LossVerdict
from analysis.metrics import Recovery
from analysis.publish import PublishConfig, PublishError, PublishResult, _require_credentials, publish, read_offline_run
from analysis.verdict import Verdict, WallSeconds, WorldSize

SCENARIO = "pub-kill"
STEPS = 10
KILL_AT, RESTORE_TO = 7, 5
REDONE = 0.5  # the faulted run's losses after the restore differ, so the two series can be told apart


def ref_loss(step: int) -> float:
    return 1.0 / (step + 1)


def write_journal(root: Path, steps: int, *, kill: bool) -> None:
    """One rank: ``steps`` steps; with ``kill``, a kill at KILL_AT, a restore of RESTORE_TO (from
    shm) and the rest redone with other losses, plus a non-fatal jitter window."""
    w = JournalWriter(rank_journal(root, 0), rank=0, attempt=0)
    w.write("start", node="node0", world_size=1)
    for s in range(KILL_AT if kill else steps):
        w.write("step", step=s, loss=ref_loss(s), loss_bits=float_bits(ref_loss(s)))
    if kill:
        w.write("fault", fault="kill", id=0, step=KILL_AT, phase="iteration", fatal=True, rank=0)
        w.write("start", node="node0", world_size=1)
        w.write("checkpoint_restored", step=RESTORE_TO, tier="shm", seconds=0.1)
        for s in range(RESTORE_TO, steps):
            if s == 8:
                w.write("fault", fault="jitter", id=1, step=8, phase="iteration", fatal=False, ranks="all", from_step=8)
            w.write("step", step=s, loss=ref_loss(s) + REDONE, loss_bits=float_bits(ref_loss(s) + REDONE))
    w.write("finish", step=steps)
    w.close()


def make_run_dir(out: Path, *, steps: int = STEPS, kill: bool = True, extras: bool = True) -> Path:
    """A run directory as ``baft run`` leaves it (plus the report files when ``extras``)."""
    write_journal(out / "reference", steps, kill=False)
    write_journal(out / "faulted", steps, kill=kill)
    recoveries = [Recovery(
        fault={"event": "fault", "fault": "kill", "id": 0, "step": KILL_AT, "rank": 0, "phase": "iteration"},
        progress_before=KILL_AT, restored_step=RESTORE_TO, restored_tier="shm", lost_steps=2,
        recovery_seconds=3.5, restore_seconds=0.1, detection_seconds=None,
    )] if kill else []
    loss = LossVerdict(from_step=RESTORE_TO, steps_compared=5, window=1, rtol=1.0, atol=0.0, missing_steps=[],
                       worst_window=None, equivalence=None, failures=[], passed=True)
    Verdict(
        scenario=SCENARIO, passed=kill, failures=[] if kill else ["only 0 of 1 faults fired"],
        bitwise_equal=not kill, first_divergence=None, lost_steps=2 if kill else 0,
        recovery_seconds=3.5 if kill else None, faults_fired=2 if kill else 0, faults_declared=2 if kill else 1,
        completed=True, recoveries=recoveries, windows=[], loss_curve=loss if kill else None,
        world_size=WorldSize(reference=1, final=1),
        wall_seconds=WallSeconds(reference=1.0, reference_cached=True, faulted=2.0),
    ).write(out)
    if extras:
        scenario = {"name": SCENARIO, "workload": {"model": "gpt-tiny", "stages": 1, "steps": steps},
                    "faults": [{"kill": {"rank": 0, "at_step": KILL_AT}}], "expect": {"bitwise": False}}
        (out / "scenario.yaml").write_text(yaml.safe_dump(scenario))
        (out / "report.md").write_text("# report\n")
        (out / "report.html").write_text("<h1>report</h1>\n")
        (out / "loss.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    return out


def wandb_children() -> list[str]:
    """Command names of this process's children that belong to wandb (its service)."""
    names = []
    for children in Path("/proc/self/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                names.append(Path(f"/proc/{pid}/comm").read_text().strip())
            except OSError:
                continue
    return [n for n in names if "wandb" in n]


def isolated(mp: pytest.MonkeyPatch, base: Path) -> tuple[Path, Path]:
    """An empty HOME and working directory, no user W&B settings in the environment."""
    home, cwd = base / "home", base / "cwd"
    home.mkdir()
    cwd.mkdir()
    mp.setenv("HOME", str(home))
    for k in [k for k in os.environ if k.startswith("WANDB_") or k.startswith("XDG_")] + ["NETRC"]:
        mp.delenv(k, raising=False)
    mp.chdir(cwd)
    return home, cwd


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One offline publish of the full fake run, in an isolated HOME and cwd."""
    pytest.importorskip("wandb")
    base = tmp_path_factory.mktemp("publish")
    run_dir = make_run_dir(base / "out")
    before = sorted(p.name for p in run_dir.iterdir())
    with pytest.MonkeyPatch.context() as mp:
        home, cwd = isolated(mp, base)
        env = dict(os.environ)
        result = publish(run_dir)
        env_after = dict(os.environ)
        outside = sorted(str(p) for p in [*home.rglob("*"), *cwd.rglob("*")])
    return {"run_dir": run_dir, "before": before, "result": result, "env": env, "env_after": env_after,
            "outside": outside, "children": wandb_children(), "read": read_offline_run(run_dir / "wandb")}


@pytest.mark.e2e
def test_result_names_the_offline_run(published: dict[str, Any]) -> None:
    r: PublishResult = published["result"]
    assert r.mode == "offline" and r.url is None and r.run_id
    assert r.wandb_dir.name.startswith("offline-run-") and r.wandb_dir.name.endswith(r.run_id)
    assert r.wandb_dir.is_relative_to(published["run_dir"] / "wandb")
    assert (r.wandb_dir / f"run-{r.run_id}.wandb").is_file()
    assert read_offline_run(r.wandb_dir)["run"]["id"] == r.run_id


@pytest.mark.e2e
def test_history_has_both_loss_curves_by_step(published: dict[str, Any]) -> None:
    rows = published["read"]["history"]
    ref = {row["step"]: row["reference/loss"] for row in rows if "reference/loss" in row}
    run = {row["step"]: row["faulted/loss"] for row in rows if "faulted/loss" in row}
    assert ref == pytest.approx({s: ref_loss(s) for s in range(STEPS)}, rel=1e-12)
    # a step redone after the restore counts with its last execution
    expected = {s: ref_loss(s) + (REDONE if s >= RESTORE_TO else 0.0) for s in range(STEPS)}
    assert run == pytest.approx(expected, rel=1e-12)


@pytest.mark.e2e
def test_summary_config_and_run(published: dict[str, Any]) -> None:
    got = published["read"]
    s = got["summary"]
    assert s["passed"] is True and s["lost_steps"] == 2 and s["bitwise_equal"] is False
    assert s["faults_fired"] == 2 and s["recovery_seconds"] == 3.5 and s["loss_curve"]["passed"] is True
    c = got["config"]
    assert c["name"] == SCENARIO and c["workload"]["steps"] == STEPS and c["faults"] == [{"kill": {"rank": 0, "at_step": 7}}]
    assert c["verdict"]["passed"] is True and c["verdict"]["lost_steps"] == 2
    assert got["run"]["name"] == SCENARIO and got["run"]["project"] == "baft-harness" and "passed" in got["run"]["tags"]
    assert got["exit_code"] == 0


@pytest.mark.e2e
def test_fault_restore_and_recovery_tables(published: dict[str, Any]) -> None:
    files = published["result"].wandb_dir / "files"

    def table(key: str) -> list[list[Any]]:
        meta = published["read"]["summary"][key]
        assert meta["_type"] == "table-file" and meta["path"] in published["read"]["files"]
        return json.loads((files / meta["path"]).read_text())["data"]

    assert table("faults") == [[7, "kill", "rank 0", "iteration", True], [8, "jitter", "all ranks", "iteration", False]]
    assert table("restores") == [[5, "shm", 1, 1]]
    assert table("recoveries") == [["kill rank 0", 7, 5, "shm", 2, 3.5, None]]


@pytest.mark.e2e
def test_report_artifact_holds_what_exists(published: dict[str, Any]) -> None:
    got = published["read"]
    assert f"{SCENARIO}-report" in got["artifacts"]
    assert sorted(got["artifact_files"][f"{SCENARIO}-report"]) == [
        "loss.png", "report.html", "report.md", "scenario.yaml", "verdict.json"]


@pytest.mark.e2e
def test_nothing_written_outside_the_run_directory(published: dict[str, Any]) -> None:
    assert published["outside"] == []  # no ~/.cache/wandb, ~/.config/wandb, ./wandb, ./artifacts
    after = sorted(p.name for p in published["run_dir"].iterdir())
    assert after == sorted([*published["before"], "wandb"])
    assert published["env_after"] == published["env"]  # WANDB_DIR etc. were set for the call only
    assert published["children"] == []  # wandb's service was shut down


@pytest.mark.e2e
def test_minimal_run_long_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No scenario.yaml, no report, no fault; a history long enough to span many 32 KiB blocks
    of the transaction log (records split across blocks are reassembled)."""
    pytest.importorskip("wandb")
    steps = 1500
    run_dir = make_run_dir(tmp_path / "out", steps=steps, kill=False, extras=False)
    isolated(monkeypatch, tmp_path)
    r = publish(run_dir, PublishConfig(run_name="custom", tags=["ci"], project="p2"))
    assert (r.wandb_dir / f"run-{r.run_id}.wandb").stat().st_size > 4 * 32768
    got = read_offline_run(run_dir / "wandb")
    assert got["run"]["name"] == "custom" and got["run"]["project"] == "p2"
    assert sorted(got["run"]["tags"]) == ["ci", "failed"]
    assert got["config"]["name"] == SCENARIO and "workload" not in got["config"]
    run = {row["step"]: row["faulted/loss"] for row in got["history"] if "faulted/loss" in row}
    assert len(run) == steps and run[steps - 1] == pytest.approx(ref_loss(steps - 1), rel=1e-12)
    assert got["summary"]["passed"] is False and "loss_curve" not in got["summary"]
    assert got["artifact_files"][f"{SCENARIO}-report"] == ["verdict.json"]
    assert table_rows(r.wandb_dir, got, "faults") == [] and table_rows(r.wandb_dir, got, "recoveries") == []


@pytest.mark.e2e
def test_a_callers_run_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the caller's own W&B run active, publish makes a separate run, leaves the caller's
    open (and its service running), and still returns only once its own run is on disk."""
    wandb = pytest.importorskip("wandb")
    run_dir = make_run_dir(tmp_path / "out")
    isolated(monkeypatch, tmp_path)
    (tmp_path / "user").mkdir()
    user = wandb.init(mode="offline", dir=str(tmp_path / "user"), project="user",
                      settings=wandb.Settings(console="off", x_disable_stats=True, silent=True))
    try:
        user.log({"x": 1})
        r = publish(run_dir)
        assert wandb.run is user and r.run_id != user.id
        got = read_offline_run(r.wandb_dir)  # complete although the shared service still runs
        assert got["exit_code"] == 0 and got["summary"]["lost_steps"] == 2
        user.log({"x": 2})
    finally:
        user.finish()
        wandb.teardown()
    assert [row["x"] for row in read_offline_run(tmp_path / "user")["history"]] == [1, 2]


def table_rows(wandb_dir: Path, got: dict[str, Any], key: str) -> list[Any]:
    return json.loads((wandb_dir / "files" / got["summary"][key]["path"]).read_text())["data"]


def test_missing_wandb_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = make_run_dir(tmp_path / "out")
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(PublishError, match=r"pip install 'baft-harness\[wandb\]'"):
        publish(run_dir)
    assert not (run_dir / "wandb").exists()


def test_online_without_credentials_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = make_run_dir(tmp_path / "out")
    isolated(monkeypatch, tmp_path)
    with pytest.raises(PublishError, match="WANDB_API_KEY"):
        publish(run_dir, PublishConfig(mode="online"))
    assert not (run_dir / "wandb").exists()  # refused before wandb started


def test_netrc_entry_counts_as_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isolated(monkeypatch, tmp_path)
    rc = tmp_path / "netrc"
    rc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    rc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(rc))
    _require_credentials()
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.com")
    with pytest.raises(PublishError, match="wandb.example.com"):
        _require_credentials()


def test_bad_input_fails_first(tmp_path: Path) -> None:
    with pytest.raises(PublishError, match="mode"):
        PublishConfig(mode="cloud")
    with pytest.raises(PublishError, match="tags"):
        PublishConfig(tags="ci")  # type: ignore[arg-type]
    with pytest.raises(PublishError, match="verdict.json"):
        publish(tmp_path)
    (tmp_path / "offline-run-x").mkdir()
    (tmp_path / "offline-run-x" / "run-x.wandb").write_bytes(b"not a log")
    with pytest.raises(PublishError, match="not a W&B transaction log"):
        read_offline_run(tmp_path)
    with pytest.raises(PublishError, match="no W&B run"):
        read_offline_run(tmp_path / "offline-run-x" / "files")
