"""The harness: scenarios, launching runs under torchrun, verdicts, the ``baft`` CLI.

The probe API a training script reports through is ``from harness import Session``
(:class:`harness.worker.session.Session`; imported on first use, so ``import harness`` stays light).
"""
from __future__ import annotations

from typing import Any

__all__ = ["Session"]


def __getattr__(name: str) -> Any:
    if name == "Session":
        from harness.worker.session import Session

        return Session
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
