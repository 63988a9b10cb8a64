"""The built-in workload's answer to a preemption: note SIGTERM, agree on it at a step boundary, persist, leave.

A SIGTERM arrives at each rank at a slightly different moment, so no rank may act on it alone: the
handler only notes it, and at every step boundary the ranks ask each other whether any of them got one
(one small collective, over a gloo group of its own). Once they agree, every rank flushes its checkpointer — the strategy persists the
state after the last completed step, synchronously (``Checkpointer.flush``) — journals ``preempt_flush``
and exits with 143 (128 + SIGTERM), as a process ended by the signal does: torchrun then restarts the
workers of the nodes that stay, and the harness kills whatever is still alive when the grace ends.
"""
from __future__ import annotations

import signal
import threading
import time
from typing import Any

from baft.mesh.collective import all_gather, initialized
from baft.mesh.control import own_group

#: The exit status of a worker that left because of a preemption (128 + SIGTERM).
PREEMPTED_EXIT = 128 + signal.SIGTERM


class TermSignal:
    """Notes the first SIGTERM this process receives (installed in the main thread)."""

    def __init__(self) -> None:
        self.at: float | None = None
        """``time.time()`` of the first SIGTERM (None: none yet)."""
        self._group: Any = None  # a gloo group of its own, made at the first agreement (the job's may be NCCL's)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._note)

    def _note(self, signum: int, frame: Any) -> None:
        if self.at is None:
            self.at = time.time()

    def agreed(self) -> bool:
        """Whether any rank has received SIGTERM (collective: every rank calls it at the same boundary), agreed
        over a gloo group of its own: the job's groups may take device tensors only."""
        if self._group is None and initialized():
            self._group = own_group()
        return any(all_gather(self.at is not None, self._group))


def flush_and_leave(ckpt: Any, session: Any, term: TermSignal, step: int) -> int:
    """Persist the state at boundary ``step`` now, journal it, release the checkpointer; the exit status."""
    session.disarm()  # no fault fires inside the flush (a second preemption would wait for this one's grace)
    t0 = time.perf_counter()
    persisted = ckpt.flush()
    seconds = time.perf_counter() - t0
    session.probe.record("preempt_flush", step=step, persisted=persisted, seconds=round(seconds, 4),
                         since_signal=round(time.time() - term.at, 4) if term.at is not None else None,
                         signaled=term.at is not None)
    ckpt.close()
    session.probe.record("exit", code=PREEMPTED_EXIT)
    return PREEMPTED_EXIT
