"""A job's progress read from its Weights & Biases run, for step triggers on a cluster without a shared volume.

``baft run --target k8s --wandb-run ENTITY/PROJECT/RUN_ID`` follows the job through W&B's
public API instead of the ranks' journal: the run's last history step is the last finished
iteration, so a trigger at step S fires once the job has logged step S-1. It reads one
GraphQL query per poll (``Run.load(force=True)``): the run's ``historyKeys.lastStep``, its
``state`` and ``createdAt``.

What the job must do: log one history row per iteration with the iteration as its step
(``wandb.log({...}, step=iteration)``) into one run that a restarted worker resumes
(``wandb.init(id=..., resume="allow")``). W&B drops rows whose step is below the run's
current one, so after a restore the step stays at its highest until the job passes it
again, as the journal's does. The job is done when the run's state is ``finished``; a
``crashed`` run is still followed (torchrun may restart its workers), until the harness's
timeout.

Credentials and server are W&B's own: ``WANDB_API_KEY`` and ``WANDB_BASE_URL`` (or
``--wandb-base-url``). Limits, said plainly: the step reaches the harness after the job's
W&B uploader sends it (seconds, batched), so faults land later than with the journal; the
run's ``createdAt`` (``wandb.init``) stands in for the job's start for time triggers; there
is no bitwise verdict without the ranks' journal. Tested against a local stand-in of the
few GraphQL queries used, through the real ``wandb`` client; never against W&B's servers.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

_PATH = re.compile(r"[^/\s]+/[^/\s]+/[^/\s]+")


def check_run_path(path: str) -> str:
    """``ENTITY/PROJECT/RUN_ID`` or ValueError saying what was found."""
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        raise ValueError(f"expected ENTITY/PROJECT/RUN_ID (the run's id, as in its URL), found {path!r}")
    return path


def _timestamp(text: Any) -> float | None:
    """Seconds since the epoch of W&B's ``createdAt`` (ISO 8601, UTC, with or without a zone)."""
    if not isinstance(text, str) or not text:
        return None
    when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


class WandbProgress:
    """The furthest step of a job as its W&B run reports it: a :class:`~harness.run.progress.Progress`
    source beside the journal's."""

    def __init__(self, path: str, *, base_url: str | None = None, timeout: float = 10.0, api: Any = None) -> None:
        self.path = check_run_path(path)
        self.base_url = base_url
        self.timeout = timeout
        self._api = api
        self._run: Any = None
        self.step = 0
        self.steps_seen = 0
        """Polls that saw the last step move (a W&B run gives no per-step events)."""
        self.state: str | None = None
        """The run's W&B state (``running``, ``finished``, ``crashed``, ``failed``); None until it exists."""
        self.world = 0
        self.finished: set[int] = set()
        self.started_at: float | None = None
        """The run's ``createdAt``: when the job's logging rank called ``wandb.init``."""

    def where(self) -> str:
        """Where the progress comes from, for messages."""
        return f"W&B run {self.path}" + (f" on {self.base_url}" if self.base_url else "")

    def _connect(self) -> Any:
        if self._api is None:
            try:
                import wandb
            except ImportError:
                raise OSError("following a job through W&B needs the wandb package: pip install "
                              "'baft-harness[wandb]'") from None
            overrides = {"base_url": self.base_url} if self.base_url else {}
            try:
                self._api = wandb.Api(overrides=overrides, timeout=int(max(1, self.timeout)))
            except Exception as e:  # bad key, unreachable server: wandb raises its own types
                raise OSError(f"cannot reach W&B ({self.where()}): {e}") from None
        return self._api

    def poll(self) -> int:
        """Read the run once; 0 steps while it does not exist yet. OSError when W&B cannot be read."""
        api = self._connect()
        try:
            if self._run is None:
                self._run = api.run(self.path)
            else:
                self._run.load(force=True)
        except Exception as e:
            if "could not find run" in str(e).lower() or type(e).__name__ == "RunNotFoundError":
                self._run = None  # not created yet (the job's logging rank has not called wandb.init)
                return self.step
            raise OSError(f"cannot read {self.where()}: {e}") from None
        self.state = self._run.state
        self.started_at = self.started_at or _timestamp(getattr(self._run, "created_at", None))
        keys = getattr(self._run, "history_keys", None) or {}
        last = keys.get("lastStep") if isinstance(keys, dict) else None
        if isinstance(last, int) and last + 1 > self.step:
            self.step = last + 1
            self.steps_seen += 1
        return self.step

    @property
    def done(self) -> bool:
        """Whether the run finished (W&B state ``finished``)."""
        return self.state == "finished"
