"""Bitwise comparison of a run against its reference, from journals alone.

Both runs fingerprint every state component at every step boundary (the
``state`` events) and record each iteration's loss as exact float bits (the
``step`` events). Every record of the run under test — before the fault, and
again after the restore — is compared with the reference's record of the same
rank and step (records written at another world size, after an elastic restart,
are counted apart: the loss curve judges those). The first divergence is the earliest (step, place) where they
differ: the state at boundary ``s`` comes before the loss of iteration ``s``,
and components are ordered as in :data:`COMPONENT_ORDER`. Where the journals
carry the L2 norms of floating tensors, a divergence also says how large it is.

A restarted process whose first optimizer step began before the restart (a save between two micro-batches
of gradient accumulation, the accumulated gradient restored) makes fewer backward calls in that step than
the reference did; its loss, summed over the calls this process saw, is *partial*: not compared (no
divergence), while the state after the step is, as always — it decides whether the resume was right.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .journal import Journal
from .record import Record

#: Mirrors ``baft.components.COMPONENTS`` (analysis reads journals, it does not import baft);
#: unknown components sort after these.
COMPONENT_ORDER = ("model", "optimizer", "scheduler", "rng", "data", "scaler", "step")


@dataclass(frozen=True, slots=True)
class Divergence(Record):
    """Where two runs first differ, and (for a floating tensor) by how much; in ``verdict.json``
    (``first_divergence``) with its :attr:`relative_norm_change`."""

    step: int
    """The step boundary of the state record (or the iteration of the loss record)."""
    component: str
    """The state component (:data:`COMPONENT_ORDER`), or ``loss``."""
    key: str
    """The leaf within the component (``loss`` for a loss record)."""
    rank: int
    """The rank whose record differs."""
    reference: str | None
    """The reference's fingerprint (None: the reference lacks the key)."""
    found: str | None
    """The run's fingerprint (None: the run lacks the key)."""
    reference_norm: float | None = None
    """L2 norm of the reference's tensor; None where not journaled (older journals, non-float leaves)."""
    found_norm: float | None = None
    """L2 norm of the run's tensor; None where not journaled."""

    @property
    def relative_norm_change(self) -> float | None:
        """``|found - reference| / reference`` of the norms: how large the first divergence is.

        None when a norm is unknown, not finite, or the reference's is 0.
        """
        if self.reference_norm is None or self.found_norm is None or self.reference_norm == 0:
            return None
        if not (math.isfinite(self.reference_norm) and math.isfinite(self.found_norm)):
            return None
        return abs(self.found_norm - self.reference_norm) / abs(self.reference_norm)

    def sort_key(self) -> tuple[Any, ...]:
        comp = COMPONENT_ORDER.index(self.component) if self.component in COMPONENT_ORDER else len(COMPONENT_ORDER)
        return (self.step, 1 if self.component == "loss" else 0, comp, self.key, self.rank)

    def to_json(self) -> dict[str, Any]:
        """The fields and the relative norm change (read back, it is computed again)."""
        return {**Record.to_json(self), "relative_norm_change": self.relative_norm_change}


@dataclass(frozen=True, slots=True)
class PartialStep(Record):
    """A step a restarted process resumed in the middle of: its loss record is partial, not compared."""

    rank: int
    step: int
    incarnation: int
    backwards: int
    """Backward calls the restarted process made in the step."""
    reference_backwards: int
    """Backward calls the reference made in it (the rest were restored with the gradient)."""

    def describe(self) -> str:
        restored = self.reference_backwards - self.backwards
        return (f"resumed mid-step {self.step} ({restored} of {self.reference_backwards} micro-batches restored with "
                f"the gradient)")


@dataclass(slots=True)
class Comparison:
    """Result of comparing every record of a run against the reference."""

    states_compared: int = 0
    losses_compared: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    missing_reference: list[tuple[int, int]] = field(default_factory=list)
    """(rank, step) records of the run that the reference lacks."""
    resized: int = 0
    """Records written at another world size than the reference's (after an elastic restart), or after the
    world changed and came back: not comparable bit for bit; the loss curve judges them."""
    partial: list[PartialStep] = field(default_factory=list)
    """Loss records of steps a restarted process resumed in the middle of (not compared)."""

    @property
    def first(self) -> Divergence | None:
        return min(self.divergences, key=Divergence.sort_key) if self.divergences else None

    @property
    def equal(self) -> bool:
        return not self.divergences and not self.missing_reference


def _index(journal: Journal, kind: str, rank: int) -> dict[int, dict[str, Any]]:
    return {e["step"]: e for e in journal.events(kind, rank)}


def compare_digests(step: int, rank: int, ref: dict[str, dict[str, str]], got: dict[str, dict[str, str]],
                    ref_norms: dict[str, dict[str, float]] | None = None,
                    got_norms: dict[str, dict[str, float]] | None = None) -> list[Divergence]:
    """Every (component, key) whose fingerprint differs, including keys present on one side only.

    Each divergence carries the two tensors' norms where the journals have them.
    """
    ref_norms, got_norms = ref_norms or {}, got_norms or {}
    out = []
    for comp in sorted(set(ref) | set(got)):
        r, g = ref.get(comp), got.get(comp)
        if r is None or g is None:
            out.append(Divergence(step, comp, "<component missing>", rank,
                                  "present" if r is not None else None, "present" if g is not None else None))
            continue
        for key in sorted(set(r) | set(g)):
            if r.get(key) != g.get(key):
                out.append(Divergence(step, comp, key, rank, r.get(key), g.get(key),
                                      ref_norms.get(comp, {}).get(key), got_norms.get(comp, {}).get(key)))
    return out


def _resized(ev: dict[str, Any], world: int) -> bool:
    """Written at another world size than the reference's, or after the world changed and came back (a node
    left and joined again: the state went through another arithmetic meanwhile)."""
    return ev.get("world") not in (None, world) or bool(ev.get("resized"))


def compare(reference: Journal, run: Journal) -> Comparison:
    """Compare each state and loss record of ``run`` with ``reference`` (same rank, same step)."""
    result = Comparison()
    world = reference.world_size
    for rank in sorted(run.ranks):
        ref_states = _index(reference, "state", rank)
        ref_steps = _index(reference, "step", rank)
        for ev in run.events("state", rank):
            if _resized(ev, world):
                result.resized += 1
                continue
            ref = ref_states.get(ev["step"])
            if ref is None:
                result.missing_reference.append((rank, ev["step"]))
                continue
            result.states_compared += 1
            result.divergences.extend(compare_digests(ev["step"], rank, ref["digests"], ev["digests"],
                                                      ref.get("norms"), ev.get("norms")))
        steps = run.events("step", rank)
        firsts: dict[int, int] = {}  # incarnation -> the first step its process took
        for ev in steps:
            firsts.setdefault(ev.get("incarnation", 0), ev["step"])
        for ev in steps:
            if _resized(ev, world):
                result.resized += 1
                continue
            ref = ref_steps.get(ev["step"])
            if ref is None:
                result.missing_reference.append((rank, ev["step"]))
                continue
            inc = ev.get("incarnation", 0)
            got, want = ev.get("backwards"), ref.get("backwards")
            if inc > 0 and firsts[inc] == ev["step"] and type(got) is int and type(want) is int and got < want:
                result.partial.append(PartialStep(rank, ev["step"], inc, got, want))
                continue
            if ref.get("loss_bits") is None and ev.get("loss_bits") is None:
                continue  # stages without a loss
            result.losses_compared += 1
            if ref.get("loss_bits") != ev.get("loss_bits"):
                result.divergences.append(Divergence(ev["step"], "loss", "loss", rank, ref.get("loss_bits"), ev.get("loss_bits")))
    return result
