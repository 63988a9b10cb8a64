"""The root exception of the ``baft`` library, its configuration error, and the warning of a moved name."""
from __future__ import annotations

import warnings


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


class BaftDeprecationWarning(FutureWarning):
    """A public name moved (a module path, a class, a key, a flag): the old one still works for one release. A
    ``FutureWarning``, so Python shows it to a script's user by default (a plain ``DeprecationWarning`` is
    hidden outside ``__main__``)."""


_warned: set[str] = set()


def deprecated(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn once per process that ``old`` moved to ``new`` (and keeps working until the next release);
    ``stacklevel`` 3 points at the line that called the caller."""
    if old in _warned:
        return
    _warned.add(old)
    warnings.warn(f"{old} is deprecated and will be removed in the next release: use {new}",
                  BaftDeprecationWarning, stacklevel=stacklevel)
