"""Check a plan on the workflow simulator: `scepsy simulate`, `sweep`."""

from __future__ import annotations

import json
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
    SeedOpt,
    WarmupOpt,
    emit_json,
    errors,
    finite,
    number_list,
    progress,
    split_list,
    stdout,
    working,
)
from scepsy.models.errors import InputError
from scepsy.models.output import check_output, writing


@app.command()
def simulate(
    instance: InstanceArg,
    plan: Annotated[Optional[Path], typer.Option("--plan", help="Plan JSON or allocation YAML to run (default: plan the instance now).")] = None,
    rate: Annotated[Optional[float], typer.Option("--rate", min=0.0, help="Arrival rate of every workflow, requests/s (default: the instance's).")] = None,
    rates: Annotated[Optional[str], typer.Option("--rates", help="Several rates, comma-separated: one simulation each.")] = None,
    duration_s: DurationOpt = 300.0,
    warmup_s: WarmupOpt = None,
    arrivals: Annotated[Optional[Path], typer.Option("--arrivals", help="Arrival timestamps: JSONL {workflow, arrival_s} or an Azure-format CSV.")] = None,
    calls_out: Annotated[Optional[Path], typer.Option("--calls-out", help="Write every LLM call as JSONL (input of profiles synthesize --requests).")] = None,
    routing: Annotated[str, typer.Option("--routing", help="cache_aware (SGLang-like: least outstanding with prefix affinity) or least_outstanding.")] = "cache_aware",
    engine_model: EngineModelOpt = "builtin",
    backend: EngineBackendOpt = "vllm",
    database_version: DatabaseVersionOpt = "current",
    seed: SeedOpt = 0,
    json_output: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Simulate the workflows on a deployment: engine model per replica, routers, real control flow."""
    from scepsy import api
    from scepsy.models.plan.report import simulation_view
    from scepsy.models.simulation.arrivals import load_arrivals

    with errors():
        for value, option in ((rate, "--rate"), (duration_s, "--duration-s"), (warmup_s, "--warmup-s")):
            finite(value, option)
        for path, option in ((out, "--out"), (calls_out, "--calls-out")):
            if path is not None:
                check_output(path, [instance, plan, arrivals], option)
        loaded = api.load(instance)
        with working(f"planning {instance}"):
            allocation = api.allocation_of(loaded, plan)
        if rate is not None and rates is not None:
            raise InputError(None, "--rates", "both --rate and --rates given", "use one of them")
        points = number_list(rates, "--rates") if rates is not None else [rate]
        timestamps = load_arrivals(arrivals, [w.name for w in loaded.workflows]) if arrivals is not None else None
        settings = api.simulation_settings(duration_s, warmup_s, seed, routing, engine_model, backend, database_version)
        with progress("simulating", len(points)) as advance:
            runs = api.simulate_rates(loaded, allocation, points, settings, timestamps, calls_out is not None, advance)
        if calls_out is not None:
            with writing(calls_out, "--calls-out") as path, path.open("w") as handle:
                for run in runs:
                    for call in run.result.calls:
                        handle.write(json.dumps(call, sort_keys=True) + "\n")
        emit_json(api.simulation_document(str(instance), runs), out, json_output)
        if not json_output:
            for run in runs:
                stdout.print(simulation_view(run.result, run.prediction, run.rate_rps))


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
    from scepsy.models.plan.report import comparison_table
    from scepsy.models.simulation.simulator import SimulationSettings
    from scepsy.planner.studies.baselines import SYSTEMS
    from scepsy.planner.studies.sweep import (
        SweepSettings,
        compare,
        load_points,
        plot_sweep,
        write_sweep,
    )
    from scepsy.planner.studies.sweep import sweep as run_sweep

    with errors():
        finite(duration_s, "--duration-s")
        finite(warmup_s, "--warmup-s")
        for path, option in ((out_csv, "--out-csv"), (out_png, "--out-png")):
            check_output(path, [instance, allocation], option)
        loaded = api.load(instance)
        if (rates is None) == (load_factors is None):
            raise InputError(None, "--rates", "give exactly one of --rates and --load-factors", "e.g. --rates 1,2,4")
        points = load_points(
            loaded,
            rates=number_list(rates, "--rates") if rates else None,
            load_factors=number_list(load_factors, "--load-factors") if load_factors else None,
        )
        systems = ["scepsy"] + [s for s in split_list(baselines) if s != "scepsy"]
        for system in systems:
            if system not in SYSTEMS:
                raise InputError(None, "--baselines", f"unknown system {system!r}", f"use some of: {', '.join(SYSTEMS[1:])}")
        settings = SweepSettings(SimulationSettings(duration_s=duration_s, warmup_s=warmup_s, seed=seed), static_path=allocation)
        with progress("sweeping", len(systems) * len(points)) as advance:
            frame = run_sweep(loaded, points, systems, settings, progress=lambda text: advance(None, text))
        with writing(out_csv, "--out-csv"):
            write_sweep(frame, out_csv)
        with writing(out_png, "--out-png"):
            plot_sweep(frame, out_png, title=Path(instance).stem)
        comparisons = compare(frame)
        emit_json(api.sweep_document(out_csv, out_png, comparisons), None, json_output)
        if not json_output:
            stdout.print(f"wrote {out_csv} and {out_png}")
            stdout.print(comparison_table(comparisons))
