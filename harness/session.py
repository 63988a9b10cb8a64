"""Deprecated: the probe API's old path. ``from harness import Session`` (or ``harness.worker.session``)."""
from __future__ import annotations

from harness.errors import deprecated
from harness.worker.session import Session, place_on_node

__all__ = ["Session", "place_on_node"]

deprecated("harness.session", "from harness import Session", stacklevel=2)
