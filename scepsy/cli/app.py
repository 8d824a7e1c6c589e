"""The `scepsy` Typer application and its command groups; the command modules register on them."""

from __future__ import annotations

import typer

# Help is printed as written: no Rich markup, in which `pip install 'scepsy[tracing]'` would lose
# `[tracing]` as a style tag (tests/test_cli_help.py). Every group of commands is made with it.
HELP_MARKUP = None

app = typer.Typer(
    name="scepsy",
    help="GPU capacity planner for multi-LLM agentic workflows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=HELP_MARKUP,
)
profiles_app = typer.Typer(
    help="Build profile CSVs (rows: gpu_type, tp, fraction, arrival_rate, throughput, latencies).", no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
)
app.add_typer(profiles_app, name="profiles")
traces_app = typer.Typer(help="Inspect and export recorded traces.", no_args_is_help=True, rich_markup_mode=HELP_MARKUP)
app.add_typer(traces_app, name="traces")
