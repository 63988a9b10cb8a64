"""The root exception of the analysis package."""
from __future__ import annotations


class AnalysisError(Exception):
    """A journal is missing, unreadable or inconsistent."""


class ConfigFieldError(AnalysisError, ValueError):
    """An analysis config field (an expectation) is out of range; ``field`` names it for the scenario loader."""

    def __init__(self, field: str, expected: str, found: object) -> None:
        self.field, self.expected, self.found = field, expected, found
        super().__init__(f"{field}: expected {expected}, found {found!r}")
