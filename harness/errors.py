"""The root exception of the harness, the errors for bad input (command line, scenario) and failed launches,
and the warning for a moved name (an import path, a YAML key, a flag) that still works for one release."""
from __future__ import annotations

from baft.errors import BaftDeprecationWarning
from baft.errors import deprecated as deprecated  # the one function that warns of a moved name


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


class Cancelled(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the harness: stop everything it started, then exit 128 + signal.

    A KeyboardInterrupt, so every ``finally`` and every ``except KeyboardInterrupt`` that undoes a
    fault (a Chaos Mesh object, a qdisc) runs for a SIGTERM exactly as for Ctrl-C.
    """

    def __init__(self, signum: int) -> None:
        import signal

        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"cancelled by {self.name}")

    @property
    def exit_code(self) -> int:
        """130 for SIGINT, 143 for SIGTERM: what a shell reports for a process ended by the signal."""
        return 128 + self.signum


#: The warning of a moved public name, and the one function that gives it (baft's: one for the whole tool).
HarnessDeprecationWarning = BaftDeprecationWarning
