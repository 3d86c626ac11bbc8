"""One error hierarchy. Every error carries its CLI exit code and is caught once in
``sptrace.cli.main``, which prints a single line and returns the code."""

from __future__ import annotations


class SptraceError(Exception):
    """Base class: the message is one line meant for the user."""

    exit_code: int = 2


class UsageError(SptraceError):
    """Wrong flags or an impossible configuration (checked before anything is launched)."""


class ConfigError(UsageError, ValueError):
    """A model / step configuration that cannot be built (e.g. heads not divisible by P)."""


class LaunchError(SptraceError):
    """A distributed launch (torchrun) failed; the message names the failing rank's log."""


class TraceError(SptraceError):
    """An unusable trace file or run: the message names the file and the problem."""

    def __init__(self, path: object, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem

    def __reduce__(self) -> tuple[type, tuple[object, str]]:  # raised in loader worker processes
        return (type(self), (self.path, self.problem))
