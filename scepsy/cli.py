"""The `scepsy` command: parses options and dispatches to the packages; no logic of its own.

Exit codes: 0 success; 2 bad input (one line naming file, field and fix); 3 infeasible (the binding
reason) or no plan within the time limit; 1 an internal error (set SCEPSY_DEBUG=1 for a traceback).
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from scepsy.models.errors import InputError, ScepsyError

app = typer.Typer(
    name="scepsy",
    help="GPU capacity planner for multi-LLM agentic workflows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Wide enough for the tables when piped; a terminal keeps its own width.
stdout = Console() if sys.stdout.isatty() else Console(width=160)
stderr = Console(stderr=True)

# Shared options, defined once
InstanceArg = Annotated[Path, typer.Argument(help="Instance YAML (cluster, llms, workflows).", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="Also write the JSON result to this file.")]
BackendOpt = Annotated[str, typer.Option("--backend", help="Allocation search: cpsat, enumerate or bruteforce.")]
TimeLimitOpt = Annotated[float, typer.Option("--time-limit-s", min=0.01, help="Stop searching after this many seconds and return the best plan with its gap.")]
WorkersOpt = Annotated[int, typer.Option("--workers", min=1, help="Solver threads (results stay deterministic).")]


def _fail(error: ScepsyError) -> None:
    stderr.print(f"error: {error}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(error.exit_code)


@contextmanager
def _errors():
    """Map scepsy's typed errors to one line and an exit code; never show a traceback."""
    try:
        yield
    except ScepsyError as error:
        _fail(error)
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as error:  # noqa: BLE001 - last line of defence for the no-traceback promise
        if os.environ.get("SCEPSY_DEBUG"):
            raise
        stderr.print(f"internal error: {type(error).__name__}: {error} (set SCEPSY_DEBUG=1 for details)", markup=False)
        raise typer.Exit(1)


@contextmanager
def _working(message: str):
    """A spinner on stderr for work that may take over a second (only on a terminal)."""
    if stderr.is_terminal:
        with stderr.status(message):
            yield
    else:
        yield


def _emit_json(data: dict, out: Optional[Path], to_stdout: bool) -> None:
    text = json.dumps(data, indent=2) + "\n"
    if out is not None:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
        except OSError as exc:
            raise InputError(str(out), None, f"cannot write ({exc.strerror})", "choose a writable --out path") from None
    if to_stdout:
        sys.stdout.write(text)


@app.command()
def plan(
    instance: InstanceArg,
    backend: BackendOpt = "cpsat",
    time_limit_s: TimeLimitOpt = 60.0,
    workers: WorkersOpt = 1,
    json_output: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Choose GPU type, fraction, TP degree and replicas for every LLM, placed on the cluster."""
    from scepsy.models.instance import load_instance
    from scepsy.models.report import plan_view
    from scepsy.planner.search import BACKENDS, PlanSettings, make_plan

    with _errors():
        if backend not in BACKENDS:
            raise InputError(None, "--backend", f"unknown backend {backend!r}", f"use one of: {', '.join(BACKENDS)}")
        loaded = load_instance(instance)
        settings = PlanSettings(backend=backend, time_limit_s=time_limit_s, workers=workers)
        with _working(f"planning {instance} with {backend}"):
            result = make_plan(loaded, settings)
        _emit_json(result.to_json(), out, json_output)
        if not json_output:
            stdout.print(plan_view(result))


@app.command()
def predict(
    instance: InstanceArg,
    allocation: Annotated[Path, typer.Option("--allocation", help="Allocation YAML (or a plan JSON): llms: [{name, gpu_type, tp, fraction, replicas}].")],
    json_output: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Predict workflow latency and throughput of a given allocation (what-if)."""
    from scepsy.models.allocation import load_allocation
    from scepsy.models.alp import AllocationError, predict as run_predict
    from scepsy.models.instance import load_instance
    from scepsy.models.plan import prediction_to_json
    from scepsy.models.report import prediction_view

    with _errors():
        loaded = load_instance(instance)
        known = {m.name: set(loaded.cluster.gpu_types) for m in loaded.llms}
        chosen = load_allocation(allocation, loaded.cluster.fractions_per_gpu, known)
        try:
            prediction = run_predict(loaded, chosen)
        except AllocationError as exc:
            raise InputError(str(allocation), "llms", str(exc), "pick a profiled configuration that fits in memory") from None
        _emit_json(prediction_to_json(prediction), out, json_output)
        if not json_output:
            stdout.print(prediction_view(prediction))
            if not prediction.feasible:
                overloaded = ", ".join(p.llm for p in prediction.llms if p.overloaded)
                stderr.print(f"warning: overloaded llms (rate above max_utilization x capacity): {overloaded}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
