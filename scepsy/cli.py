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


# ---------------------------------------------------------------------------------------------
# Measurement: tracing proxy, traces, workflow statistics, replay profiling (docs/tracing.md)

TracesArg = Annotated[list[Path], typer.Argument(help="Trace files: proxy stores (.db), .jsonl/.parquet exports, OTLP JSON (.json).", show_default=False)]
GpuTypeOpt = Annotated[str, typer.Option("--gpu-type", help="GPU type the profile rows are for (a name of the instance's cluster.gpu_types).")]
TpOpt = Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel degree of the profiled replica.")]
FractionOpt = Annotated[float, typer.Option("--fraction", min=0.0, max=1.0, help="GPU fraction per shard of the profiled replica, in (0, 1].")]

traces_app = typer.Typer(help="Inspect and export recorded traces.", no_args_is_help=True)
profiles_app = typer.Typer(help="Build profile CSVs (rows: gpu_type, tp, fraction, arrival_rate, throughput, latencies).", no_args_is_help=True)
app.add_typer(traces_app, name="traces")
app.add_typer(profiles_app, name="profiles")


def _parse_upstreams(values: list[str]) -> dict[str, str]:
    upstreams: dict[str, str] = {}
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise InputError(None, "--upstream", f"{value!r} is not NAME=URL", "write e.g. --upstream gen=http://127.0.0.1:8001")
        if name in upstreams:
            raise InputError(None, "--upstream", f"llm {name!r} given twice", "name each upstream once")
        upstreams[name] = url
    if not upstreams:
        raise InputError(None, "--upstream", "no upstream given", "add --upstream NAME=URL for each LLM")
    return upstreams


def _parse_llm_names(values: list[str]) -> dict[str, str]:
    names = {}
    for value in values:
        model, sep, llm = value.partition("=")
        if not sep or not model or not llm:
            raise InputError(None, "--llm-name", f"{value!r} is not MODEL=LLM", "write e.g. --llm-name meta-llama/Llama-3.2-1B=gen")
        names[model] = llm
    return names


@app.command()
def proxy(
    upstream: Annotated[list[str], typer.Option("--upstream", help="LLM name and engine base URL, NAME=URL (repeat per LLM).")],
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on.")] = 9000,
    host: Annotated[str, typer.Option("--host", help="Address to bind (loopback unless told otherwise).")] = "127.0.0.1",
    store: Annotated[Path, typer.Option("--store", help="SQLite trace store (WAL mode).")] = Path("traces.db"),
    no_bodies: Annotated[bool, typer.Option("--no-bodies", help="Do not record request/response bodies (traces then cannot be replayed).")] = False,
    timeout_s: Annotated[float, typer.Option("--timeout-s", min=0.1, help="Answer 504 when an upstream sends nothing for this long.")] = 600.0,
) -> None:
    """Run the tracing proxy in front of OpenAI-compatible engines (until Ctrl-C)."""
    from scepsy.tracing.proxy import ProxyConfig, serve
    from scepsy.tracing.store import TraceStore

    with _errors():
        upstreams = _parse_upstreams(upstream)
        try:
            trace_store = TraceStore(store)
        except Exception as exc:  # noqa: BLE001 - sqlite errors become one line
            raise InputError(str(store), None, f"cannot open the trace store ({exc})", "choose a writable --store path") from None
        routes = ", ".join(f"{name}={url} (/{name}/v1/...)" for name, url in sorted(upstreams.items()))
        stderr.print(f"scepsy proxy on http://{host}:{port}: {routes}; recording to {store}", markup=False, highlight=False)
        try:
            serve(ProxyConfig(upstreams, store=trace_store, record_bodies=not no_bodies, timeout_s=timeout_s), host=host, port=port)
        finally:
            trace_store.close()
            stderr.print(f"recorded {trace_store.written} calls to {store}" + (f" ({trace_store.write_errors} failed to write)" if trace_store.write_errors else ""), markup=False)


@traces_app.command("export")
def traces_export(
    traces: TracesArg,
    out: Annotated[Path, typer.Option("--out", help="Output file.")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or parquet.")] = "jsonl",
    no_bodies: Annotated[bool, typer.Option("--no-bodies", help="Leave request/response bodies out.")] = False,
) -> None:
    """Export traces as JSONL (one call per line) or Parquet."""
    from scepsy.tracing.traces import export_traces, load_traces

    with _errors():
        if fmt not in ("jsonl", "parquet"):
            raise InputError(None, "--format", f"unknown format {fmt!r}", "use jsonl or parquet")
        count = export_traces(load_traces(traces), out, fmt, bodies=not no_bodies)
        stderr.print(f"wrote {count} calls to {out}", markup=False)


@app.command()
def aggregate(
    traces: TracesArg,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the statistics as YAML (each workflow's `stages` drops into an instance).")] = None,
    workflow: Annotated[str, typer.Option("--workflow", help="Workflow name for calls sent without an X-Workflow-Name header.")] = "workflow",
    llm_name: Annotated[list[str], typer.Option("--llm-name", help="OTLP spans: map a gen_ai.request.model to an LLM name, MODEL=LLM.")] = [],
    json_output: JsonOpt = False,
) -> None:
    """Per workflow and LLM: invocations n, parallelism p, their spread and time shares."""
    import yaml

    from scepsy.tracing.stats import aggregate as run_aggregate, stats_to_dict, stats_view
    from scepsy.tracing.traces import load_traces

    with _errors():
        stats = run_aggregate(load_traces(traces, _parse_llm_names(llm_name)), default_workflow=workflow)
        if not stats.workflows:
            raise InputError(", ".join(map(str, traces)), None, "no completed call carries a workflow request id",
                             "send X-Workflow-Id (or a W3C traceparent) with every LLM call of a workflow request")
        data = stats_to_dict(stats)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(f"# scepsy aggregate {' '.join(map(str, traces))}\n" + yaml.safe_dump(data, sort_keys=False))
        if json_output:
            sys.stdout.write(json.dumps(data, indent=2) + "\n")
        else:
            stdout.print(stats_view(stats))


def _parse_rates(value: str) -> tuple[float, ...] | None:
    if value.strip() == "auto":
        return None
    try:
        rates = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        rates = ()
    if not rates or any(not r > 0 for r in rates):
        raise InputError(None, "--rates", f"{value!r} is not auto or a list of positive rates", "write auto or e.g. 0.5,1,2,4")
    return rates


def _write_profile_rows(rows, out: Path) -> None:
    from scepsy.models.profile import read_profile_frame, write_profile
    from scepsy.tracing.replay import merge_profile_rows

    existing = read_profile_frame(out) if out.is_file() else None
    try:
        write_profile(merge_profile_rows(existing, rows), out)
    except OSError as exc:
        raise InputError(str(out), None, f"cannot write ({exc.strerror})", "choose a writable --out path") from None


@app.command()
def profile(
    traces: Annotated[list[Path], typer.Option("--traces", help="Trace files with request bodies (repeat for several).")],
    llm: Annotated[str, typer.Option("--llm", help="The LLM whose calls are replayed.")],
    endpoint: Annotated[str, typer.Option("--endpoint", help="Base URL of the engine to profile, e.g. http://127.0.0.1:8001.")],
    gpu_type: GpuTypeOpt,
    out: Annotated[Path, typer.Option("--out", help="Profile CSV; rows of other (gpu_type, tp, fraction) already in it are kept.")],
    tp: TpOpt = 1,
    fraction: FractionOpt = 1.0,
    rates: Annotated[str, typer.Option("--rates", help="auto (light load, doubling to saturation, then bisecting) or a list of calls/s, e.g. 0.5,1,2.")] = "auto",
    duration_s: Annotated[float, typer.Option("--duration-s", min=0.1, help="Nominal length of each rate point.")] = 60.0,
    min_requests: Annotated[int, typer.Option("--min-requests", min=1, help="At least this many workflow requests per rate point.")] = 5,
    model: Annotated[Optional[str], typer.Option("--model", help="Replace the `model` field of replayed requests (the engine's served name).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the arrival process and request order.")] = 0,
    arrivals: Annotated[str, typer.Option("--arrivals", help="Workflow request arrivals: poisson, or uniform (1 / rate apart).")] = "poisson",
    timeout_s: Annotated[float, typer.Option("--timeout-s", min=0.1, help="Per-call timeout.")] = 600.0,
    json_output: JsonOpt = False,
) -> None:
    """Replay an LLM's traced calls at a sweep of arrival rates and write its profile rows."""
    import asyncio

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from scepsy.tracing.replay import Sweep, SweepSettings, auto_start_rate, probe_service_time, profile_rows, replay_requests
    from scepsy.tracing.traces import load_traces

    with _errors():
        if not 0 < fraction <= 1:
            raise InputError(None, "--fraction", f"{fraction} is not in (0, 1]", "give the GPU share per shard, e.g. 0.5")
        if arrivals not in ("poisson", "uniform"):
            raise InputError(None, "--arrivals", f"unknown arrival process {arrivals!r}", "use poisson or uniform")
        settings = SweepSettings(rates_rps=_parse_rates(rates), duration_s=duration_s, min_requests=min_requests,
                                 seed=seed, timeout_s=timeout_s, model=model, arrivals=arrivals)
        calls = load_traces(traces)
        requests = replay_requests(calls, llm, model)
        start_rate = 1.0
        if settings.rates_rps is None:
            start_rate = auto_start_rate(asyncio.run(probe_service_time(requests, endpoint, timeout_s=timeout_s)))
        sweep = Sweep(requests, endpoint, settings, start_rate)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=stderr, disable=not stderr.is_terminal) as progress:
            task = {"id": None}

            def on_point(rate: float, expected: int) -> None:
                task["id"] = progress.add_task(f"{llm} at {rate:.3g} calls/s", total=expected)

            def on_call() -> None:
                progress.advance(task["id"])

            points = asyncio.run(sweep.run(on_point, on_call))
        rows = profile_rows(points, gpu_type, tp, fraction)
        _write_profile_rows(rows, out)
        data = [{"target_rate_rps": p.target_rate_rps, "arrival_rate_rps": p.arrival_rate_rps, "throughput_rps": p.throughput_rps,
                 "calls": p.calls, "failed": p.failed, "latency_mean_s": p.latency_s["mean"], "latency_p99_s": p.latency_s["p99"],
                 "saturated": p.saturated} for p in points]
        if json_output:
            sys.stdout.write(json.dumps({"llm": llm, "out": str(out), "points": data}, indent=2) + "\n")
        else:
            from rich.table import Table

            table = Table(title=f"Replay profile of {llm} ({gpu_type}, tp={tp}, fraction={fraction:g}) -> {out}")
            for column in ("arrival_rate_rps", "throughput_rps", "calls", "failed", "latency_mean_s", "latency_p99_s", "saturated"):
                table.add_column(column, justify="right")
            for p in sorted(data, key=lambda p: p["arrival_rate_rps"]):
                table.add_row(f"{p['arrival_rate_rps']:.3f}", f"{p['throughput_rps']:.3f}", str(p["calls"]), str(p["failed"]),
                              f"{p['latency_mean_s']:.3f}", f"{p['latency_p99_s']:.3f}", "yes" if p["saturated"] else "no")
            stdout.print(table)


@profiles_app.command("import")
def profiles_import(
    files: Annotated[list[Path], typer.Argument(help="vllm bench serve result JSON files and/or sglang.bench_serving JSONL files.", show_default=False)],
    gpu_type: GpuTypeOpt,
    out: Annotated[Path, typer.Option("--out", help="Profile CSV; rows of other (gpu_type, tp, fraction) already in it are kept.")],
    tp: TpOpt = 1,
    fraction: FractionOpt = 1.0,
) -> None:
    """Import benchmark results (one row per run) into the profile CSV format."""
    from scepsy.tracing.benchimport import import_bench_results

    with _errors():
        if not 0 < fraction <= 1:
            raise InputError(None, "--fraction", f"{fraction} is not in (0, 1]", "give the GPU share per shard, e.g. 0.5")
        result = import_bench_results(files, gpu_type, tp, fraction)
        _write_profile_rows(result.rows, out)
        for line in result.notes + [f"skipped {s}" for s in result.skipped]:
            stderr.print(f"note: {line}", markup=False, highlight=False)
        stderr.print(f"wrote {len(result.rows)} rows for {gpu_type} tp={tp} fraction={fraction:g} to {out}", markup=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
