"""Check a plan on the workflow simulator: `scepsy simulate`, `sweep`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from scepsy.cli.app import app
from scepsy.cli.common import (
    DatabaseVersionOpt,
    DurationOpt,
    EngineBackendOpt,
    EngineModelOpt,
    InstanceArg,
    JsonOpt,
    OutOpt,
    SchedulingOpt,
    SeedOpt,
    WarmupOpt,
    check_out,
    emit_json,
    errors,
    number_list,
    progress,
    split_list,
    stdout,
)
from scepsy.models.errors import InputError


@app.command()
def simulate(
    instance: InstanceArg,
    plan: Annotated[Optional[Path], typer.Option("--plan", help="Plan JSON or allocation YAML to run (default: plan the instance now).")] = None,
    rate: Annotated[Optional[float], typer.Option("--rate", min=0.0, help="Arrival rate of every workflow, requests/s (default: the instance's).")] = None,
    rates: Annotated[Optional[str], typer.Option("--rates", help="Several rates, comma-separated: one simulation each.")] = None,
    duration_s: DurationOpt = 300.0,
    warmup_s: WarmupOpt = None,
    arrivals: Annotated[Optional[Path], typer.Option("--arrivals", help="Arrival timestamps: JSONL {workflow, arrival_s}, an Azure-format CSV, or azure:conv | azure:code (the shipped traces).")] = None,
    calls_out: Annotated[Optional[Path], typer.Option("--calls-out", help="Write every LLM call as JSONL (input of profiles synthesize --requests).")] = None,
    routing: Annotated[str, typer.Option("--routing", help="cache_aware (SGLang-like: least outstanding with prefix affinity) or least_outstanding.")] = "cache_aware",
    scheduling: SchedulingOpt = "priority",
    entry: Annotated[bool, typer.Option("--entry", help="Hold each LLM's calls at the plan's entry_limit, oldest workflow request first, as the workflow entry scepsy manifests deploys does.")] = False,
    untagged_share: Annotated[float, typer.Option("--untagged-share", min=0.0, max=1.0, help="Share of the workflow requests whose calls carry no workflow id (the entry stamps them by their conversation).")] = 0.0,
    engine_model: EngineModelOpt = "builtin",
    backend: EngineBackendOpt = "vllm",
    database_version: DatabaseVersionOpt = "current",
    seed: SeedOpt = 0,
    json_output: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Simulate the workflows on a deployment: engine model per replica, routers, real control flow."""
    from scepsy import api

    with errors():
        check_out(out, [instance, plan, arrivals])
        if rate is not None and rates is not None:
            raise InputError(None, "rates", "both `rate` and `rates` given", "use one of them")
        points = number_list(rates, "rates") if rates is not None else [rate]
        settings = api.simulation_settings(duration_s, warmup_s, seed, routing, engine_model, backend, database_version,
                                           scheduling, untagged_share)
        with progress("simulating", len(points)) as advance:
            runs = api.simulate_rates(instance, plan, points, settings, arrivals, calls_out, advance, entry=entry)
        emit_json(api.simulation_document(str(instance), runs), out, json_output)
        if not json_output:
            for run in runs:
                stdout.print(api.simulation_view(run.result, run.prediction, run.rate_rps))


@app.command()
def sweep(
    instance: InstanceArg,
    rates: Annotated[Optional[str], typer.Option("--rates", help="Arrival rates (requests/s, every workflow), comma-separated.")] = None,
    load_factors: Annotated[Optional[str], typer.Option("--load-factors", help="Multipliers of the instance's rates, comma-separated.")] = None,
    baselines: Annotated[str, typer.Option("--baselines", help="Systems besides scepsy: k8s-hpa, per-llm, static, scepsy-whole-gpus, scepsy-tp1, scepsy-whole-gpus-tp1.")] = "k8s-hpa,per-llm",
    allocation: Annotated[Optional[Path], typer.Option("--allocation", help="Allocation file of the static system.")] = None,
    duration_s: DurationOpt = 300.0,
    warmup_s: WarmupOpt = None,
    out_csv: Annotated[Path, typer.Option("--out-csv", help="Tidy CSV of every (system, load, workflow) point.")] = Path("sweep.csv"),
    out_png: Annotated[Path, typer.Option("--out-png", help="Throughput-latency plot.")] = Path("sweep.png"),
    seed: SeedOpt = 0,
    json_output: JsonOpt = False,
) -> None:
    """Throughput-latency curves of scepsy and baselines on the simulator (CSV and PNG)."""
    from scepsy import api

    with errors():
        settings = api.simulation_settings(duration_s, warmup_s, seed)
        systems = split_list(baselines)
        with progress("sweeping", 1) as advance:
            result = api.sweep(
                instance, rates=number_list(rates, "rates") if rates else None,
                load_factors=number_list(load_factors, "load_factors") if load_factors else None,
                baselines=systems, allocation=allocation, settings=settings, out_csv=out_csv, out_png=out_png,
                progress=lambda done, total, text: advance(done, text, of=total),
            )
        emit_json(api.sweep_document(result), None, json_output)
        if not json_output:
            stdout.print(f"wrote {out_csv} and {out_png}")
            stdout.print(api.sweep_view(result))
