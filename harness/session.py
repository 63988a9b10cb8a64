"""Deprecated: the probe API's old path. ``from harness import Session`` (or ``harness.worker.session``)."""
from __future__ import annotations

from harness.errors import deprecated
from harness.worker.session import Session, place_on_node
from harness.worker.spec import SPEC_VARIABLE

__all__ = ["SPEC_VARIABLE", "Session", "place_on_node"]

deprecated("harness.session", "from harness import Session", stacklevel=2)
