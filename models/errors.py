"""Typed errors shared by every package: each carries the one line a user needs to fix the input."""

from __future__ import annotations


class ScepsyError(Exception):
    """Base class of every error scepsy reports to a user (never shown as a traceback)."""

    exit_code = 1


class InputError(ScepsyError):
    """Bad input: names the file, the field and the fix. The CLI exits with code 2."""

    exit_code = 2

    def __init__(self, file: str | None, field: str | None, problem: str, fix: str | None = None):
        self.file = file
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(self.line())

    def line(self) -> str:
        where = ": ".join(part for part in (self.file, self.field) if part)
        text = f"{where}: {self.problem}" if where else self.problem
        return f"{text}; fix: {self.fix}" if self.fix else text


class InfeasibleError(ScepsyError):
    """No plan satisfies the constraints; `reason` names the binding one. The CLI exits with code 3."""

    exit_code = 3

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


class TimeLimitError(ScepsyError):
    """The time limit passed before a result was found (or before the search could start: the
    instance is too large for the limit). The CLI exits with code 3."""

    exit_code = 3
