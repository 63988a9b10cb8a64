"""The root exception of the ``baft`` library and its configuration error."""
from __future__ import annotations


class BaftError(Exception):
    """Anything the checkpointing library raises on purpose derives from this."""


class BaftConfigError(BaftError, ValueError):
    """A configuration value is out of range.

    ``field`` names the offending field so that a loader mapping YAML onto the
    config can report the full key path; ``expected`` and ``found`` say what was
    wanted and what was given.
    """

    def __init__(self, field: str, expected: str, found: object) -> None:
        self.field = field
        self.expected = expected
        self.found = found
        super().__init__(f"{field}: expected {expected}, found {found!r}")


class CheckpointCorrupt(BaftError):
    """A checkpoint file does not match the checksum its manifest recorded."""
