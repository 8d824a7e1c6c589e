"""The `scepsy` command: one module per group of commands, each a thin adapter over the public API
(scepsy/api.py) and the packages; nothing imports it.

Exit codes: 0 success; 2 bad input (one line naming file, field and fix); 3 infeasible (the binding
reason) or no plan within the time limit; 1 an internal error (set SCEPSY_DEBUG=1 for a traceback).
"""

from __future__ import annotations

# importing a module registers its commands, in the order `scepsy --help` lists them
from scepsy.cli import planning  # noqa: F401, I001
from scepsy.cli import simulation  # noqa: F401
from scepsy.cli import profiles  # noqa: F401
from scepsy.cli import measure  # noqa: F401
from scepsy.cli import deploy  # noqa: F401
from scepsy.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    app()
