"""Reports (Markdown + self-contained HTML + PNG plots) and JUnit XML from hand-made run directories."""
from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from analysis.errors import AnalysisError
from analysis.journal import Journal
from analysis.junit import junit_xml
from analysis.losscurve import LossExpect
from analysis.metrics import Paired
from analysis.report import is_suite, report
from analysis.verdict import ExpectConfig, NotRun, Verdict, WallSeconds, judge
from harness.cli import main as cli_main

from .test_losscurve import write_elastic

PNG = b"\x89PNG\r\n\x1a\n"


def make_run(root: Path, *, offset: float = 0.001, name: str = "elastic") -> Verdict:
    ref = write_elastic(root / "reference", 4, 20)
    run = write_elastic(root / "faulted", 4, 20, lost_at=12, restore=11, offset=offset)
    v = judge(ref, run, ExpectConfig(max_lost_steps=1, loss=LossExpect(rtol=0.01, window=3)), steps=20, faults_declared=1)
    v = dataclasses.replace(v, scenario=name, wall_seconds=WallSeconds(reference=1.0, reference_cached=False, faulted=2.0))
    v.write(root)
    (root / "scenario.yaml").write_text(f"name: {name}\ncheckpoint: {{strategy: baft, every: 5}}\n")
    return v


def test_a_run_report_has_the_story_plot_first_and_every_section(tmp_path: Path) -> None:
    v = make_run(tmp_path)
    r = report(tmp_path)
    md, page = r.markdown.read_text(), r.html.read_text()
    names = [f.name for f in r.figures]
    assert names[:2] == ["loss.png", "progress.png"] and "recovery.png" in names
    for f in r.figures:
        assert f.read_bytes().startswith(PNG) and f.stat().st_size > 5000
    # Markdown: the loss plot comes before the verdict table; every image it names exists
    assert md.index("](loss.png)") < md.index("## Verdict")
    for img in re.findall(r"\]\(([^)]+\.png)\)", md):
        assert (tmp_path / img).is_file()
    for section in ("## Recoveries", "## Loss curve", "## Cost", "## Checkpoint interval advice"):
        assert section in md
    assert "4 → 2" in md and f"| {v.recoveries[0].lost_steps} |" in md
    # HTML: self-contained (every image inline, no file references)
    assert page.count("data:image/png;base64,") == len(r.figures)
    assert not re.search(r"src=['\"](?!data:)", page)
    assert "elastic: PASSED" in page


def test_the_report_lists_the_adaptive_intervals_changes_and_only_when_there_were_some(tmp_path: Path) -> None:
    from analysis.verdict import IntervalChange

    v = make_run(tmp_path)
    assert "## Adaptive persist interval" not in report(tmp_path).markdown.read_text()
    change = IntervalChange(step=10, every=7, before=10, cost_seconds=0.0333, why="Daly's interval for 33.30 ms ...")
    dataclasses.replace(v, interval_changes=[change]).write(tmp_path)
    md = report(tmp_path).markdown.read_text()
    assert "## Adaptive persist interval" in md and "| 10 | 10 | 7 | 33.3 | Daly's interval for 33.30 ms ... |" in md


def test_the_report_lists_where_replication_stopped_and_only_when_it_did(tmp_path: Path) -> None:
    from analysis.verdict import ReplicationChange

    v = make_run(tmp_path)
    assert "## Replication stopped" not in report(tmp_path).markdown.read_text()
    change = ReplicationChange(node="node0", step=17, stopped=True, reason="the link makes the newest peer copy 9.1 ...")
    dataclasses.replace(v, replication_changes=[change]).write(tmp_path)
    md = report(tmp_path).markdown.read_text()
    assert "## Replication stopped or resumed" in md and "| node0 | 17 | stopped | the link makes the newest" in md


def test_a_failed_run_says_why_at_the_top(tmp_path: Path) -> None:
    make_run(tmp_path, offset=0.05)
    md = report(tmp_path).markdown.read_text()
    head = md.split("## Verdict")[0]
    assert "FAILED" in head and "Why it failed: loss curve" in head


def test_a_suite_report_links_each_run(tmp_path: Path) -> None:
    make_run(tmp_path / "a", name="a")
    make_run(tmp_path / "b", offset=0.05, name="b")
    assert is_suite(tmp_path) and not is_suite(tmp_path / "a")
    r = report(tmp_path)
    page = r.html.read_text()
    assert "<a href='a/report.html'>a</a>" in page and "FAILED (1 of 2 scenarios passed)" in page
    assert (tmp_path / "a" / "report.html").is_file() and (tmp_path / "b" / "loss.png").is_file()


def test_not_a_run_directory_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(AnalysisError, match="no verdict.json"):
        report(tmp_path)
    assert cli_main(["report", str(tmp_path)]) == 2
    assert "no verdict.json" in capsys.readouterr().err
    assert cli_main(["report", str(tmp_path), "--mtbf", "x"]) == 2


def test_cli_report_and_advise(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_run(tmp_path)
    assert cli_main(["report", str(tmp_path), "--mtbf", "2"]) == 0
    assert "report.html" in capsys.readouterr().out
    # hand-made journals hold no checkpoint cost: advise says so, exit 2
    assert cli_main(["advise", str(tmp_path), "--mtbf", "6"]) == 2
    assert "no measured checkpoint cost" in capsys.readouterr().err


def test_junit_counts_failures_and_errors() -> None:
    def took(faulted: float) -> WallSeconds:
        return WallSeconds(reference=1.0, reference_cached=True, faulted=faulted)

    results: list[Verdict | NotRun] = [
        Verdict(scenario="ok", passed=True, failures=[], wall_seconds=took(3.5)),
        Verdict(scenario="bad", passed=False, failures=["lost 4 steps, at most 1 allowed", "x"], wall_seconds=took(2)),
        NotRun(scenario="broken", error="the reference run failed"),
    ]
    root = ET.fromstring(junit_xml("ci", results).split("?>", 1)[1])
    (suite,) = root.findall("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "1")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["bad"].find("failure").get("message") == "lost 4 steps, at most 1 allowed"
    assert "x" in cases["bad"].find("failure").text and cases["broken"].find("error") is not None
    assert cases["ok"].get("time") == "3.500" and cases["ok"].find("failure") is None


def test_verdict_metrics_report_goodput_and_overhead(tmp_path: Path) -> None:
    v = make_run(tmp_path)
    m = v.metrics
    assert m is not None and m.goodput_steps_per_second.reference and m.goodput_ratio is not None
    assert m.iteration_seconds == Paired(reference=None, faulted=None)  # hand-made steps carry no seconds
    assert Journal.load(tmp_path / "faulted").world_size == 2


def test_a_bit_for_bit_ddp_run_plots_the_same_rank_with_identical_arrays(tmp_path: Path) -> None:
    """Each DDP rank reports its own batch's loss; the plot took whichever rank's record came first per step, so
    a bit-for-bit run (PASSED) drew a faulted curve unlike the reference's before any fault."""
    from analysis.plots import _steps_by_incarnation, loss_figure, loss_rank

    def ddp(killed_at: int | None) -> Journal:
        ranks: dict[int, list] = {0: [], 1: []}
        t, inc = 0.0, 0
        steps = list(range(10)) if killed_at is None else list(range(killed_at + 1)) + list(range(5, 10))
        for i, step in enumerate(steps):
            if killed_at is not None and i == killed_at + 1:
                inc = 1  # rank 1 killed after step 7, both restarted from step 5
            for rank in (1, 0) if (step + inc) % 2 else (0, 1):  # which rank's record comes first varies
                t += 0.01
                ranks[rank].append({"event": "step", "rank": rank, "step": step, "incarnation": inc, "t": t,
                                    "loss": 2.0 - 0.1 * step + (0.5 if rank else 0.0)})
        return Journal(run_dir=tmp_path, ranks=ranks)

    reference, faulted = ddp(None), ddp(7)
    assert loss_rank(reference) == (0, True) and loss_rank(faulted) == (0, True)
    ref, run = _steps_by_incarnation(reference), _steps_by_incarnation(faulted)
    ref_losses = {s: loss for s, loss, _ in ref[0]}
    for pts in run.values():  # every incarnation's points lie on the reference's curve
        assert all(loss == ref_losses[s] for s, loss, _ in pts), pts
    assert [s for s, _, _ in run[1]] == [5, 6, 7, 8, 9]
    verdict = Verdict(scenario="ddp", passed=True, failures=[])
    assert loss_figure(reference, faulted, verdict, tmp_path / "loss.png").read_bytes().startswith(PNG)


def test_a_partial_steps_loss_is_drawn_apart_and_left_out_of_the_difference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The verdict does not compare the loss of a step resumed mid-way (fewer micro-batches in the new process);
    the plot drew it on the run's line and as a -44% difference, so a PASSED run looked diverged."""
    import matplotlib.axes

    from analysis.compare import PartialStep
    from analysis.plots import loss_figure

    def journal(partial_loss: float | None) -> Journal:
        events = [{"event": "step", "rank": 0, "step": s, "incarnation": 0, "t": s, "loss": 1.0 + s} for s in range(6)]
        if partial_loss is not None:  # restarted at 3, mid-way through step 3
            events += [{"event": "step", "rank": 0, "step": s, "incarnation": 1, "t": 10 + s,
                        "loss": partial_loss if s == 3 else 1.0 + s} for s in range(3, 6)]
        return Journal(run_dir=tmp_path, ranks={0: events})

    drawn: list[tuple[list, list, dict]] = []
    real = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda ax, x, y, *a, **k: (drawn.append((list(x), list(y), k)), real(ax, x, y, *a, **k))[1])
    verdict = Verdict(scenario="acc", passed=True, failures=[],
                      partial_steps=[PartialStep(rank=0, step=3, incarnation=1, backwards=1, reference_backwards=2)])
    loss_figure(journal(None), journal(0.2), verdict, tmp_path / "loss.png")
    restarted = next((x, y) for x, y, k in drawn if k.get("label") == "after restart 1")
    assert restarted == ([4, 5], [5.0, 6.0])  # the partial step is not on the line
    hollow = next((x, y) for x, y, k in drawn if k.get("mfc") == "none")
    assert hollow == ([3], [0.2])
    difference = drawn[-1]  # the lower panel: every step's last whole execution against the reference
    assert difference[0] == [0, 1, 2, 3, 4, 5] and set(difference[1]) == {0.0}
