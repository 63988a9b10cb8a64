"""Fakes of the harness's parts that several unit tests drive a controller with."""
from __future__ import annotations

from typing import Any


class FakeAgents:
    """The launch's agents as the preempt and join controllers see them (``harness.run.agents.AgentSet``'s
    surface): real processes in ``procs``; what the controller started and journaled as exited, recorded."""

    def __init__(self, procs: list[Any]) -> None:
        self.procs = procs
        self.started: list[tuple[int, dict[str, Any]]] = []
        self.exits: list[tuple[int, dict[str, Any]]] = []

    def start(self, node: int, **why: Any) -> None:
        self.started.append((node, why))

    def journal_exit(self, node: int, **why: Any) -> None:
        self.exits.append((node, why))

    def restart_all(self, skip: set[int] | None = None, **why: Any) -> None:
        self.started += [(n, why) for n in range(len(self.procs)) if n not in (skip or set())]
