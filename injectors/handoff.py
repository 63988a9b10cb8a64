"""Faults the harness carries out for a worker: a request file in the run's fault directory, an acknowledgement.

Some faults fire at an exact point inside a worker but act outside it: a preemption signals the worker's own
node, a joining node is started by the harness. The worker posts a request (written atomically: the harness
never reads half of one) and waits until the harness acknowledges it; a request nobody takes is withdrawn
(renamed away first, so that no harness acts on it later, at another point of the run) and the worker fails
saying what serves it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, TypeVar

from .errors import InjectorError

R = TypeVar("R", bound="Request")


class Request:
    """Base of a request dataclass: written as the JSON mapping of its fields, read back from it."""

    __slots__ = ()

    def dumps(self) -> str:
        return json.dumps(dataclasses.asdict(self))  # type: ignore[call-overload]

    @classmethod
    def loads(cls: type[R], text: str) -> R:
        data: dict[str, Any] = json.loads(text)
        return cls(**data)


def ack_path(request: Path) -> Path:
    """The file the harness writes once it has acted on ``request``."""
    return request.with_suffix(".acked")


def post(path: Path, text: str) -> Path:
    """Write the request ``text`` at ``path`` atomically."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def take(path: Path) -> Path | None:
    """The harness's side: claim the request at ``path`` (renamed to ``.taken``); None if it was withdrawn."""
    taken = path.with_suffix(".taken")
    try:
        os.replace(path, taken)
    except FileNotFoundError:
        return None
    return taken


def await_ack(path: Path, timeout: float, what: str) -> str:
    """Wait until the request at ``path`` is acknowledged and return what the acknowledgement says (empty: done;
    else why the harness could not); after ``timeout`` seconds untaken, withdraw it and raise
    :class:`InjectorError` naming ``what`` serves such requests."""
    ack = ack_path(path)
    deadline = time.monotonic() + timeout
    while not ack.exists():
        if time.monotonic() > deadline:
            try:
                os.replace(path, path.with_suffix(".abandoned"))
            except FileNotFoundError:
                deadline += timeout  # taken meanwhile: the harness is acting on it
                continue
            raise InjectorError(f"no harness took the request {path} within {timeout:g} s ({what})")
        time.sleep(0.005)
    return ack.read_text()


def acknowledge(request: Path, failure: str = "") -> None:
    """The harness's side: it has acted on ``request`` (``failure``: why it could not, for the worker to raise)."""
    post(ack_path(request), failure)
