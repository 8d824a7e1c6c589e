"""The `scepsy` command: one module per group of commands, each command a thin adapter over one
function of the public API (scepsy/api/; tests/test_cli_api.py); nothing imports it. The command
reference docs/cli.md is generated from it (scepsy/cli/reference.py).

Exit codes: 0 success; 2 bad input (one line naming file, field and fix); 3 infeasible (the binding
reason) or no plan within the time limit; 1 an internal error (set SCEPSY_DEBUG=1 for a traceback).
"""

from __future__ import annotations

import sys

import typer

# importing a module registers its commands, in the order `scepsy --help` lists them
from scepsy.cli import planning  # noqa: F401, I001
from scepsy.cli import simulation  # noqa: F401
from scepsy.cli import profiles  # noqa: F401
from scepsy.cli import measure  # noqa: F401
from scepsy.cli import deploy  # noqa: F401
from scepsy.cli import control  # noqa: F401
from scepsy.cli.app import app
from scepsy.cli.common import say

__all__ = ["app", "main"]


def main(argv: list[str] | None = None) -> None:
    """Run the command line; a usage error (bad option value, missing argument) is one plain line
    with exit code 2 like any other bad input, not a framed box."""
    try:
        code = app(args=argv, prog_name="scepsy", standalone_mode=False)
    except _usage_errors() as exc:
        context = getattr(exc, "ctx", None)
        where = f" (see {context.command_path} --help)" if context is not None else ""
        format_message = getattr(exc, "format_message", None)
        message = format_message() if callable(format_message) else str(exc)
        say(f"error: {message}{where}")
        sys.exit(getattr(exc, "exit_code", 2))
    except typer.Abort:
        say("aborted")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


def _usage_errors() -> tuple[type[Exception], ...]:
    """The exception classes of usage errors: click's, or typer's own where it vendors click."""
    import click

    vendored = getattr(typer, "TyperException", None)
    return (click.ClickException,) + ((vendored,) if isinstance(vendored, type) else ())
