"""Typed errors shared by every package: each carries the one line a user needs to fix the input."""

from __future__ import annotations

import time


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


class ScepsyWarning(UserWarning):
    """A result scepsy computes, but less well than the input could let it: one line naming the
    file, the field and the fix, issued with `warnings.warn` (the CLI prints it once on stderr)."""

    def __init__(self, file: str | None, field: str | None, problem: str, fix: str):
        super().__init__(InputError(file, field, problem, fix).line())


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


def past_deadline(deadline: float | None) -> bool:
    """Whether time.perf_counter() is past `deadline` (perf_counter seconds; None: no limit)."""
    return deadline is not None and time.perf_counter() > deadline


def too_large_for_limit(doing: str, limit: str = "--time-limit-s") -> TimeLimitError:
    """The error of a step a command's time limit covers (reading the instance, loading profiles,
    building options, placement) that ran out: `doing` says where, `limit` names the option that
    sets the limit, so the message says what to do."""
    return TimeLimitError(
        f"the time limit passed while {doing}: the instance is too large for the limit; "
        f"raise {limit}, or plan a smaller instance (fewer GPUs, nodes or LLMs)"
    )


def check_deadline(deadline: float | None, doing: str, limit: str = "--time-limit-s") -> None:
    """The one deadline check of every step the time limit covers (see too_large_for_limit)."""
    if past_deadline(deadline):
        raise too_large_for_limit(doing, limit)
