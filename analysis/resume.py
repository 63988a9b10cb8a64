"""Where a restarted script resumed: its first state matched against the reference's fingerprints.

An unmodified training script restores itself (``torch.save``, DCP, a framework's checkpoint); the harness
does not know from where. The first state it fingerprints after a restart is compared, component by
component, with the reference's state at every step: the step at which every component equals the
reference is where it resumed. When none does, the components say what happened — a torn checkpoint
(the model of one step, the optimizer of another), a component that was not restored (the model of step
10, the RNG of no step), or a state that matches no step at all.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .record import Record

Digests = Mapping[str, Mapping[str, str]]
"""``{component: {key: fingerprint}}`` as a ``state`` event journals it."""

#: Components that say nothing of where a run is: the step counter is the probe's own.
IGNORED = ("step",)
#: The component a resume is anchored on, first present wins.
ANCHORS = ("model", "optimizer")
#: What a checkpoint of the training state holds: one of them at another step than the model is torn.
TRAINING_STATE = ("model", "optimizer", "optimizers", "scheduler")


@dataclass(frozen=True, slots=True)
class ResumePoint(Record):
    """How a restarted run's first state relates to the reference's."""

    step: int | None
    """The step it resumed from: where every component equals the reference; else where the model
    (or, without one, the optimizer) does; None when that matches no step either."""
    exact: bool
    """Every component equals the reference at :attr:`step`."""
    description: str
    """In words: ``every component equals the reference at step 10``, ``torn: model equals step 10,
    optimizer equals step 11``, ``model equals step 5, but rng equals step 10``, ``model equals step 10;
    rng matches no step of the reference``, ``matches no step of the reference (...)``."""
    equal_at: dict[str, list[int]] = field(default_factory=dict)
    """Per component, the reference steps it equals."""


def locate(first: Digests, reference: Mapping[int, Digests]) -> ResumePoint:
    """The :class:`ResumePoint` of a run whose first state is ``first``, against the reference's state
    at each step (``{step: digests}``)."""
    comps = [c for c in first if c not in IGNORED]
    equal_at = {c: sorted(k for k, ref in reference.items() if c in ref and dict(ref[c]) == dict(first[c])) for c in comps}
    everywhere = set.intersection(*(set(v) for v in equal_at.values())) if equal_at else set()
    if everywhere:
        k = max(everywhere)
        return ResumePoint(step=k, exact=True, description=f"every component equals the reference at step {k}",
                           equal_at=equal_at)
    anchor = next((c for c in ANCHORS if c in equal_at), None)
    if anchor is None or not equal_at[anchor]:
        what = f"{anchor} state differs from every recorded step" if anchor else "no component to anchor on"
        return ResumePoint(step=None, exact=False, description=f"matches no step of the reference ({what})",
                           equal_at=equal_at)
    # the anchor may equal several steps (frozen weights, lr 0, an fp16 step the scaler skipped): take the one
    # most other components agree with, the latest of those
    k = max(equal_at[anchor], key=lambda s: (sum(s in v for c, v in equal_at.items() if c != anchor), s))
    elsewhere = {c: min(v, key=lambda s: (abs(s - k), -s)) for c, v in equal_at.items() if c != anchor and v and k not in v}
    lost = [c for c, v in equal_at.items() if not v]
    parts = [f"{anchor} equals step {k}"] + [f"{c} equals step {s}" for c, s in elsewhere.items()]
    torn = any(c in TRAINING_STATE for c in elsewhere)
    text = ("torn: " if torn else "") + ", ".join(parts[:1] if not torn else parts)
    if not torn and elsewhere:
        text += ", but " + ", ".join(parts[1:])
    if lost:
        text += "; " + ", ".join(lost) + (" matches" if len(lost) == 1 else " match") + " no step of the reference"
    return ResumePoint(step=k, exact=False, description=text, equal_at=equal_at)
