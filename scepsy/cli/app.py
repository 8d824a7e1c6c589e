"""The `scepsy` Typer application and its command groups; the command modules register on them."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="scepsy",
    help="GPU capacity planner for multi-LLM agentic workflows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
profiles_app = typer.Typer(
    help="Build profile CSVs (rows: gpu_type, tp, fraction, arrival_rate, throughput, latencies).", no_args_is_help=True
)
app.add_typer(profiles_app, name="profiles")
traces_app = typer.Typer(help="Inspect and export recorded traces.", no_args_is_help=True)
app.add_typer(traces_app, name="traces")
