"""Typed errors shared by every package: each carries the one line a user needs to fix the input.

An error names an argument of a call as the Python API spells it (`clusters`, `time_limit_s`): as
the `field` of an InputError about that argument, and in backquotes where a message mentions one
("raise `time_limit_s`"; backquotes in messages are for argument names only). The command line
prints its option instead (`--clusters`, `--time-limit-s`) through `render`: a notebook user is
never told about options they did not pass, a command-line user is told the option to change.
"""

from __future__ import annotations

import re
import time
from typing import Callable

Rename = Callable[[str], str]  # an argument's name -> how the reader knows it (the CLI: its option)
_MENTION = re.compile(r"`([a-z][a-z0-9_]*)`")


def renamed(text: str, rename: Rename) -> str:
    """`text` with every backquoted argument name as `rename` gives it (unchanged names keep their
    backquotes)."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        shown = rename(name)
        return match.group(0) if shown == name else shown

    return _MENTION.sub(one, text)


class ScepsyError(Exception):
    """Base class of every error scepsy reports to a user (never shown as a traceback)."""

    exit_code = 1

    def render(self, rename: Rename) -> str:
        """The message with every backquoted argument name as `rename` gives it."""
        return renamed(str(self), rename)


class InputError(ScepsyError):
    """Bad input: names the file, the field and the fix. The CLI exits with code 2.

    `field` is a field of `file` (`llms[2].tp`, `cluster.nodes`), or, for an error about an
    argument of the call (`argument`; the default when there is no file), the argument's name
    (`clusters`, `backend`); `file` may then name the file the argument gave (an output path, the
    instance a cluster size does not fit)."""

    exit_code = 2

    def __init__(self, file: str | None, field: str | None, problem: str, fix: str | None = None,
                 argument: bool | None = None):
        self.file = file
        self.field = field
        self.problem = problem
        self.fix = fix
        self.argument = file is None if argument is None else argument
        super().__init__(self.line())

    def line(self, rename: Rename | None = None) -> str:
        """file: field: problem; fix: fix. `rename` shows the argument names (the field of an
        argument error, and the backquoted names in the text) as their reader knows them."""
        field, problem, fix = self.field, self.problem, self.fix
        if rename is not None:
            if field is not None and self.argument:  # a file's fields keep their names
                field = rename(field)
            problem = renamed(problem, rename)
            fix = None if fix is None else renamed(fix, rename)
        where = ": ".join(part for part in (self.file, field) if part)
        text = f"{where}: {problem}" if where else problem
        return f"{text}; fix: {fix}" if fix else text

    def render(self, rename: Rename) -> str:
        return self.line(rename)


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


def too_large_for_limit(doing: str, limit: str = "time_limit_s") -> TimeLimitError:
    """The error of a step a call's time limit covers (reading the instance, loading profiles,
    building options, placement) that ran out: `doing` says where, `limit` names the argument that
    sets the limit, so the message says what to do."""
    return TimeLimitError(
        f"the time limit passed while {doing}: the instance is too large for the limit; "
        f"raise `{limit}`, or plan a smaller instance (fewer GPUs, nodes or LLMs)"
    )


def check_deadline(deadline: float | None, doing: str, limit: str = "time_limit_s") -> None:
    """The one deadline check of every step the time limit covers (see too_large_for_limit)."""
    if past_deadline(deadline):
        raise too_large_for_limit(doing, limit)
