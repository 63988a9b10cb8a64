"""``baft check [OPTIONS] SCRIPT [ARGS...]``: a training script's resume audited under the faults clusters send,
with no scenario to write.

1. **The reference.** The script runs uninterrupted under the harness (twice: is it reproducible?); without
   ``--steps`` a first run finds how many optimizer steps it takes.
2. **What the script does**, read from the reference's journals (:class:`Profile`): its optimizer steps, the
   backward calls per step (gradient accumulation), the steps at which it begins a save (``torch.save``, DCP,
   safetensors, a framework's save through them), the steps at which it starts a new pass over a
   ``DataLoader`` (epochs), whether it feeds batches from a ``DataLoader`` at all.
3. **A battery** chosen from that (:func:`battery`), each case a generated scenario: a kill after the first
   save (at a data fetch where there is one), a kill during a save, a kill in the middle of an accumulated
   step, a preemption with a generous grace and one with a short grace, a kill after a save in a later epoch,
   a second kill during the first restart's load, and on two nodes a node loss.
4. **Every case runs for real** (:mod:`harness.campaign.checkrun`) and gets its verdict and diagnosis;
   the terminal gets a progress line per case and one table; ``OUT`` gets ``check.json`` (every case with its
   scenario, verdict fields and diagnosis), ``junit.xml``, the report (``report.html``, each case's own
   report and plots under ``cases/<case>/``) and each case's scenario (``scenarios/<case>.yaml``: rerun it
   with ``baft run``).

Exit status: 0 when every case passed, 1 otherwise, 2 on bad input (nothing run).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from analysis.journal import Journal
from analysis.verdict import NotRun, Verdict
from harness.errors import ScenarioError

#: Steps a discovery run may take before it is taken for the script's own count (``--steps`` not given).
DISCOVERY_STEPS = 1_000_000
#: The graces of the two preemptions: one a save fits in, one that cuts most saves short.
GRACE_GENEROUS, GRACE_SHORT = 30.0, 1.0


@dataclass(kw_only=True, slots=True)
class CheckConfig:
    """What ``baft check`` is asked."""

    script: str
    """The training script (a path)."""
    args: list[str] = field(default_factory=list)
    """Its arguments; ``{run_dir}`` in one becomes each run's own directory (keep checkpoints there)."""
    nproc: int = 1
    """Processes per node."""
    nodes: int = 1
    """Nodes (each a torchrun agent; two or more add a node loss to the battery)."""
    launcher: str | None = None
    """``python`` or ``torchrun``; None: python for one process, torchrun above."""
    cwd: str | None = None
    """The directory the script runs in (None: each run's own directory)."""
    steps: int | None = None
    """The optimizer steps it takes (None: found by a first uninterrupted run)."""
    budget: float | None = None
    """Seconds for the whole check; cases not started by then are reported as not run."""

    def __post_init__(self) -> None:
        if not Path(self.script).is_file():
            raise ScenarioError(self.script, "SCRIPT", "an existing training script", self.script)
        for name in ("nproc", "nodes"):
            if getattr(self, name) < 1:
                raise ScenarioError("<command line>", f"--{name}", "an integer >= 1", str(getattr(self, name)))
        if self.launcher not in (None, "python", "torchrun"):
            raise ScenarioError("<command line>", "--launcher", "python or torchrun", str(self.launcher))
        if self.launcher == "python" and self.world_size != 1:
            raise ScenarioError("<command line>", "--launcher", "torchrun for more than one process (python runs "
                                "one)", "python")
        if self.cwd is not None and not Path(self.cwd).is_dir():
            raise ScenarioError("<command line>", "--cwd", "an existing directory", self.cwd)
        if self.steps is not None and self.steps < 2:
            raise ScenarioError("<command line>", "--steps", "an integer >= 2 (a fault needs a step to resume to)",
                                str(self.steps))
        if self.budget is not None and self.budget <= 0:
            raise ScenarioError("<command line>", "--budget", "a number of seconds > 0", str(self.budget))

    @property
    def world_size(self) -> int:
        return self.nproc * self.nodes

    def workload(self, steps: int) -> dict[str, Any]:
        """The scenario's ``workload`` mapping for this script (paths absolute: the scenarios live elsewhere)."""
        out: dict[str, Any] = {"command": [str(Path(self.script).resolve()), *self.args], "nproc": self.nproc,
                               "nodes": self.nodes, "steps": steps,
                               "launcher": self.launcher or ("python" if self.world_size == 1 else "torchrun")}
        if self.cwd is not None:
            out["cwd"] = str(Path(self.cwd).resolve())
        return out


@dataclass(kw_only=True, slots=True)
class Profile:
    """What the reference says the script does."""

    steps: int
    """Optimizer steps it took."""
    saves: list[int]
    """Steps at which it began writing a checkpoint (the steps completed then), in order."""
    save_ways: list[str]
    """How: ``torch.save``, ``dcp``, ``safetensors``."""
    micro_batches: int
    """Backward calls per optimizer step (the most seen): above 1 it accumulates gradients."""
    epochs: list[int]
    """Steps at which a new pass over a ``DataLoader`` began."""
    loader: bool
    """It feeds batches from a ``DataLoader`` (a fault can then hit the fetch of a step's batch)."""
    reproducible: bool | None = None
    """Two uninterrupted runs equal bit for bit (None: not known yet)."""

    @classmethod
    def of(cls, reference: Journal) -> Profile:
        finish = reference.events("finish")
        steps = max((int(e["step"]) for e in finish), default=0)
        saves = sorted({int(e["step"]) for e in reference.events("script_save")})
        ways = sorted({str(e.get("how", "torch.save")) for e in reference.events("script_save")})
        micro = max((int(e.get("backwards") or 1) for e in reference.events("step")), default=1)
        epochs = sorted({int(e["step"]) for e in reference.events("script_epoch")})
        loader = any((e.get("digests") or {}).get("data") for e in reference.events("state"))
        return cls(steps=steps, saves=saves, save_ways=ways, micro_batches=micro, epochs=epochs, loader=loader)

    def describe(self) -> str:
        saves = (f"saves at steps {', '.join(map(str, self.saves[:6]))}{' ...' if len(self.saves) > 6 else ''} "
                 f"({', '.join(self.save_ways)})") if self.saves else "never saves"
        accum = f", {self.micro_batches} micro-batches per step" if self.micro_batches > 1 else ""
        epochs = f", {len(self.epochs)} epochs" if len(self.epochs) > 1 else ""
        return f"{self.steps} optimizer steps{accum}{epochs}; {saves}"


@dataclass(kw_only=True, slots=True)
class Case:
    """One fault scenario of the battery."""

    name: str
    why: str
    """What it asks of the script, in a line."""
    faults: list[dict[str, Any]]
    max_lost_steps: int | None = None
    restarts: int = 2

    def scenario(self, config: CheckConfig, profile: Profile) -> dict[str, Any]:
        expect: dict[str, Any] = {"bitwise": True}
        if self.max_lost_steps is not None:
            expect["max_lost_steps"] = self.max_lost_steps
        return {"name": f"check-{self.name}", "description": self.why, "workload": config.workload(profile.steps),
                "checkpoint": {"strategy": "none"}, "faults": self.faults, "expect": expect,
                "run": {"max_restarts": self.restarts}}


def _interval(profile: Profile) -> int:
    """The steps between two saves (the largest gap; the first save's step when there is one save)."""
    points = [0, *profile.saves]
    return max((b - a for a, b in zip(points, points[1:])), default=profile.steps) or 1


def battery(config: CheckConfig, profile: Profile) -> list[Case]:
    """The cases this script gets, from what it does (see the module)."""
    last = config.world_size - 1
    phase = "data" if profile.loader else "iteration"
    interval = _interval(profile)
    saves = [s for s in profile.saves if 0 < s < profile.steps]
    first = saves[0] if saves else None
    mid = max(1, profile.steps // 2)
    cases: list[Case] = []
    if first is not None and first + 1 < profile.steps:
        cases.append(Case(name="kill-after-save", faults=[{"kill": {"rank": last, "at_step": first + 1, "phase": phase}}],
                          max_lost_steps=1,
                          why=f"rank {last} killed as step {first + 1} {'fetches its batch' if phase == 'data' else 'begins'}, "
                              f"one step after the first save (step {first}): resumes from it, one step lost"))
    if saves:
        at = saves[1] if len(saves) > 1 else saves[0]
        cases.append(Case(name="kill-during-save", faults=[{"kill": {"rank": 0, "at_step": at, "phase": "save"}}],
                          max_lost_steps=at - (saves[saves.index(at) - 1] if saves.index(at) else 0),
                          why=f"rank 0 killed as it begins the save of step {at}: the torn save must not be "
                              "loaded; resumes from the save before"))
    else:
        cases.append(Case(name="kill-without-save", faults=[{"kill": {"rank": last, "at_step": mid, "phase": phase}}],
                          why=f"rank {last} killed at step {mid}: the script never saved in the reference, so it "
                              "can only start over (the verdict says what was lost)"))
    if profile.micro_batches > 1 and profile.loader and first is not None and first + 1 < profile.steps:
        cases.append(Case(name="kill-mid-accumulation",
                          faults=[{"kill": {"rank": last, "at_step": first + 1, "phase": "data",
                                            "microbatch": profile.micro_batches // 2}}],
                          max_lost_steps=1,
                          why=f"rank {last} killed as it fetches micro-batch {profile.micro_batches // 2} of the "
                              f"{profile.micro_batches} of step {first + 1}: the accumulated gradient goes with the "
                              f"process; resumes from the save of step {first}, one step lost"))
    cases.append(Case(name="preempt-generous-grace",
                      faults=[{"preempt": {"node": 0, "at_step": mid, "phase": phase, "grace_s": GRACE_GENEROUS}}],
                      max_lost_steps=interval,
                      why=f"node 0 preempted at step {mid}: SIGTERM, {GRACE_GENEROUS:g} s to save, SIGKILL; the "
                          "node comes back whatever the exit code"))
    cases.append(Case(name="preempt-short-grace",
                      faults=[{"preempt": {"node": 0, "at_step": mid, "phase": phase, "grace_s": GRACE_SHORT}}],
                      max_lost_steps=interval,
                      why=f"node 0 preempted at step {mid} with {GRACE_SHORT:g} s of grace: a save cut short "
                          "must not be loaded"))
    later = [e for e in profile.epochs if e > 0]
    after = next((s for s in saves if later and s >= later[0]), None)
    if after is not None and after + 1 < profile.steps:
        cases.append(Case(name="kill-later-epoch", faults=[{"kill": {"rank": last, "at_step": after + 1, "phase": phase}}],
                          max_lost_steps=1,
                          why=f"rank {last} killed one step after the save of step {after}, in epoch "
                              f"{1 + sum(1 for e in later if e <= after)}: the sampler's epoch and position resume"))
    if first is not None and first + 1 < profile.steps:
        cases.append(Case(name="kill-during-restart",
                          faults=[{"kill": {"rank": last, "at_step": first + 1, "phase": phase}},
                                  {"kill": {"rank": last, "at_restore": 1, "phase": "restore"}}],
                          max_lost_steps=1, restarts=3,
                          why=f"rank {last} killed at step {first + 1}, then again as its restarted process loads "
                              "its checkpoint: the second restart must resume as the first would have"))
    if config.nodes >= 2:
        cases.append(Case(name="node-loss", faults=[{"node_loss": {"node": config.nodes - 1, "at_step": mid}}],
                          max_lost_steps=interval,
                          why=f"node {config.nodes - 1} lost at step {mid} with its processes, replaced by a fresh one"))
    return cases


@dataclass(kw_only=True, slots=True)
class CaseResult:
    """One case as run: its scenario and what the verdict said (or why it did not run)."""

    name: str
    why: str
    scenario: dict[str, Any]
    passed: bool
    seconds: float
    verdict: dict[str, Any] | None = None
    not_run: str | None = None

    def row(self) -> list[str]:
        """case, resumed at, bit for bit, lost steps, first divergence, likely cause, usual fix."""
        if self.verdict is None:
            return [self.name, "-", "-", "-", "-", f"not run: {self.not_run}", "-"]
        v = self.verdict
        recs = v.get("recoveries") or []
        resumed = ", ".join(str(r["restored_step"]) for r in recs) or "-"
        first = v.get("first_divergence")
        where = f"step {first['step']} {first['component']}/{first['key']}" if first else "-"
        causes = v.get("diagnosis") or v.get("latent") or []
        cause = causes[0]["code"] + (" (latent)" if not v.get("diagnosis") and causes else "") if causes else "-"
        fix = (causes[0].get("fix") or "-") if causes else "-"
        bits = "yes" if v.get("bitwise_equal") else ("loss curve" if v.get("loss_curve") else "no")
        return [self.name, resumed, bits, str(v.get("lost_steps", "-")), where, cause, fix]


def table(results: list[CaseResult]) -> str:
    """The terminal table of a check."""
    head = ["case", "resumed at", "bit for bit", "lost", "first divergence", "likely cause", "usual fix"]
    rows = [head, *(r.row() for r in results)]
    widths = [min(max(len(r[i]) for r in rows), 48 if i < 6 else 200) for i in range(len(head))]
    lines = []
    for r in rows:
        cells = [(c if len(c) <= widths[i] else c[: widths[i] - 1] + "…").ljust(widths[i]) for i, c in enumerate(r)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def write_outputs(results: list[CaseResult], profile: Profile, config: CheckConfig, out: Path) -> Path:
    """``check.json`` and the scenarios (``scenarios/<case>.yaml``); returns the json's path."""
    (out / "scenarios").mkdir(parents=True, exist_ok=True)
    for r in results:
        (out / "scenarios" / f"{r.name}.yaml").write_text(yaml.safe_dump(r.scenario, sort_keys=False))
    data = {"script": config.script, "args": config.args, "profile": asdict(profile),
            "passed": all(r.passed for r in results), "cases": [asdict(r) for r in results]}
    path = out / "check.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def verdicts_of(results: list[CaseResult]) -> list[Verdict | NotRun]:
    """Each case's verdict (for the JUnit file and the report), or why it did not run."""
    out: list[Verdict | NotRun] = []
    for r in results:
        if r.verdict is not None:
            out.append(Verdict.from_json(r.verdict))
        else:
            out.append(NotRun(scenario=f"check-{r.name}", error=r.not_run or "not run"))
    return out

