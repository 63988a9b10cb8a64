"""The root exception of the harness, and the errors for bad input (command line, scenario) and failed launches."""
from __future__ import annotations


class HarnessError(Exception):
    """Anything the harness raises on purpose derives from this."""


class UsageError(HarnessError):
    """Bad input to the command line: a flag, a file or a directory that cannot be used.

    ``baft`` catches it in one place, prints ``baft: error: <message>`` to stderr and exits 2; no
    traceback. Raised before anything starts.
    """


class ScenarioError(UsageError):
    """Bad input in a scenario (or config) file: names the file, the key path, what was expected and what
    was found."""

    def __init__(self, file: str, path: str, expected: str, found: object) -> None:
        self.file, self.path, self.expected, self.found = file, path, expected, found
        where = f"{file}: {path}" if path else file
        shown = found if isinstance(found, str) and found.startswith("<") else repr(found)
        super().__init__(f"{where}: expected {expected}, found {shown}")


class ConfigValueError(HarnessError, ValueError):
    """A harness config field is out of range; ``field`` names it for the scenario loader."""

    def __init__(self, field: str, expected: str, found: object) -> None:
        self.field, self.expected, self.found = field, expected, found
        super().__init__(f"{field}: expected {expected}, found {found!r}")


class LaunchError(HarnessError):
    """A run could not be started or did not finish (timeout, missing tool)."""
