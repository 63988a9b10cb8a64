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

#: The phases the checkpointing strategies announce as ``emit("phase", phase=NAME, step=S)`` (``step``
#: is the version): ``snapshot`` (a slot is being written), ``replicate`` (a node store starts copying a
#: version to a peer), ``persist`` (a write to the persistent tier starts) and ``restore``. A training
#: loop may announce its own phases the same way (the harness's workload does: its names are
#: ``injectors.trigger.TRAINING_PHASES``); baft itself never reads a phase.
#:
#: A write to the persistent tier that fails (a full disk, a storage error) is announced as
#: ``emit("checkpoint_failed", step=S, tier="persistent", reason=...)``: training goes on, ``latest``
#: keeps pointing at the last good checkpoint.
PHASES = ("snapshot", "replicate", "persist", "restore", "restore_locate", "restore_pull", "restore_load")
#: The steps of a restore a fault can be keyed to (with ``at_restore``): ``restore_locate`` (a restarted rank starts
#: looking for copies: its own memory, its node's store), ``restore_pull`` (it pulls a replica from a peer node's
#: store), ``restore_load`` (it loads a persistent checkpoint); ``restore`` itself is the chosen version's load,
#: from any tier.
RESTORE_PHASES = ("restore", "restore_locate", "restore_pull", "restore_load")

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
