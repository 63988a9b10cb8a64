"""The root exception of the injectors package."""
from __future__ import annotations


class InjectorError(Exception):
    """A fault could not be validated, injected or rolled back."""


class FaultConfigError(InjectorError, ValueError):
    """A fault's field is out of range; ``field`` names it for the scenario loader."""

    def __init__(self, field: str, expected: str, found: object) -> None:
        self.field, self.expected, self.found = field, expected, found
        super().__init__(f"{field}: expected {expected}, found {found!r}")


class HostUnsupported(InjectorError):
    """The host cannot inject this fault (no root, a missing tool or kernel module); the message says what is needed."""
