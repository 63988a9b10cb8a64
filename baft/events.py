"""Public event hooks: how ``baft`` and a training loop tell the world what happens.

``baft`` never imports the harness, the injectors or the analysis. Instead it
emits named events with plain-data fields; whoever cares (the harness's probe
that writes the journal, an injector waiting for a step and phase) subscribes.
Subscribers run synchronously in the emitting thread, in subscription order, so
an injector that fires at ``("forward", step 17)`` acts before the forward pass
of step 17 starts.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

#: Phases announced as ``emit("phase", phase=NAME, step=S)``; injector triggers use these names.
#: ``iteration``, ``data`` (about to fetch the batch), ``forward``/``backward`` (per microbatch) and
#: ``optimizer`` come from the training loop; ``snapshot``, ``replicate``, ``persist`` (a write to the
#: persistent tier starts) and ``restore`` from the checkpointing strategies (``step`` is then the version).
#:
#: A write to the persistent tier that fails (a full disk, a storage error) is announced as
#: ``emit("checkpoint_failed", step=S, tier="persistent", reason=...)``: training goes on, ``latest``
#: keeps pointing at the last good checkpoint.
PHASES = ("iteration", "data", "forward", "backward", "optimizer", "snapshot", "replicate", "persist", "restore")

Subscriber = Callable[[str, dict[str, Any]], None]

_lock = threading.Lock()
_subscribers: list[Subscriber] = []


def subscribe(fn: Subscriber) -> Callable[[], None]:
    """Register ``fn(kind, fields)`` for every event; returns a function that unsubscribes."""
    with _lock:
        _subscribers.append(fn)

    def unsubscribe() -> None:
        with _lock:
            if fn in _subscribers:
                _subscribers.remove(fn)

    return unsubscribe


def emit(kind: str, **fields: Any) -> None:
    """Deliver an event to every subscriber. Cheap when nobody listens."""
    if not _subscribers:
        return
    with _lock:
        targets = list(_subscribers)
    for fn in targets:
        fn(kind, fields)


def clear() -> None:
    """Drop every subscriber (tests, and a worker that re-initialises)."""
    with _lock:
        _subscribers.clear()
