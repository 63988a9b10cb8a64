"""``async-dcp``'s own settings: the ``checkpoint.async_dcp`` section (torch-free)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from baft.errors import BaftConfigError


@dataclass(kw_only=True, slots=True)
class AsyncDcpConfig:
    """``async-dcp``'s own settings: the ``checkpoint.async_dcp`` section."""

    mode: Literal["thread", "process"] = "thread"
    """Where DCP writes in the background: a thread of the training process, or a
    checkpoint process of DCP's own per rank (``AsyncCheckpointerType.PROCESS``; it is spawned, so the
    training script's entry point must be guarded by ``if __name__ == "__main__"``)."""
    stager: bool = True
    """Stage through DCP's ``DefaultStager`` (buffers cached across saves, the copy in a
    staging thread; shared memory in process mode, pinned memory where CUDA is present) instead of
    ``async_save``'s default copy into fresh memory each time."""

    def __post_init__(self) -> None:
        if self.mode not in ("thread", "process"):
            raise BaftConfigError("mode", "thread or process", self.mode)
        if not isinstance(self.stager, bool):
            raise BaftConfigError("stager", "true or false", self.stager)
