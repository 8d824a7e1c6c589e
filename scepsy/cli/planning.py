"""Plan, place and predict: `scepsy plan`, `place`, `predict`, `whatif`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from scepsy.cli.app import app
from scepsy.cli.common import (
    AllocationOpt,
    BackendOpt,
    CurrentOpt,
    InstanceArg,
    JsonOpt,
    ObjectiveOpt,
    OutOpt,
    PlacementOpt,
    PlacementTimeLimitOpt,
    TimeLimitOpt,
    WelfareOpt,
    WorkersOpt,
    emit_json,
    errors,
    finite,
    progress,
    stderr,
    stdout,
    working,
)
from scepsy.models.output import check_output, check_output_dir, writing


@app.command()
def plan(
    instance: InstanceArg,
    backend: BackendOpt = "cpsat",
    time_limit_s: TimeLimitOpt = 60.0,
    placement: PlacementOpt = "cpsat",
    placement_time_limit_s: PlacementTimeLimitOpt = 10.0,
    current: CurrentOpt = None,
    workers: WorkersOpt = 1,
    objective: ObjectiveOpt = None,
    welfare: WelfareOpt = None,
    json_output: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Choose GPU type, fraction, TP degree and replicas for every LLM, placed on the cluster."""
    from scepsy import api
    from scepsy.models.plan.report import plan_view

    with errors():
        finite(time_limit_s, "--time-limit-s")
        finite(placement_time_limit_s, "--placement-time-limit-s")
        if out is not None:
            check_output(out, [instance, current])
        with working(f"planning {instance} with {backend}, placing with {placement}"):
            result = api.plan(instance, backend=backend, objective=objective, welfare=welfare, time_limit_s=time_limit_s,
                              placement=placement, placement_time_limit_s=placement_time_limit_s, current=current,
                              workers=workers)
        emit_json(api.plan_document(result), out, json_output)
        if not json_output:
            stdout.print(plan_view(result))


@app.command()
def place(
    instance: InstanceArg,
    allocation: AllocationOpt,
    placement: PlacementOpt = "cpsat",
    placement_time_limit_s: PlacementTimeLimitOpt = 10.0,
    current: CurrentOpt = None,
    workers: WorkersOpt = 1,
    json_output: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Place a given allocation on the cluster (what-if); exit code 3 with the reason if it cannot be placed."""
    from scepsy import api
    from scepsy.models.plan.report import placement_view

    with errors():
        finite(placement_time_limit_s, "--placement-time-limit-s")
        if out is not None:
            check_output(out, [instance, allocation, current])
        loaded = api.load(instance)
        chosen = api.allocation_of(loaded, allocation)
        with working(f"placing {allocation} with {placement}"):
            result = api.place(loaded, chosen, placement=placement, placement_time_limit_s=placement_time_limit_s,
                               current=current, workers=workers)
        emit_json(api.placement_document(str(instance), chosen, result), out, json_output)
        if not json_output:
            stdout.print(placement_view(result.placement, result.info, result.fragmentation))


@app.command()
def predict(
    instance: InstanceArg,
    allocation: AllocationOpt,
    json_output: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Predict workflow latency and throughput of a given allocation (what-if)."""
    from scepsy import api
    from scepsy.models.plan.report import prediction_view

    with errors():
        if out is not None:
            check_output(out, [instance, allocation])
        prediction = api.predict(instance, allocation)
        emit_json(api.prediction_document(prediction), out, json_output)
        if not json_output:
            stdout.print(prediction_view(prediction))
            if not prediction.feasible:
                overloaded = ", ".join(p.llm for p in prediction.llms if p.overloaded)
                stderr.print(f"warning: overloaded llms (rate above max_utilization x capacity): {overloaded}")


@app.command()
def whatif(
    instance: InstanceArg,
    rates: Annotated[Optional[str], typer.Option("--rates", help="Total arrival rates, req/s: start:stop:step (inclusive) or a list a,b,c.")] = None,
    rate: Annotated[Optional[list[str]], typer.Option("--rate", help="Per-workflow rates, req/s: WORKFLOW=start:stop:step or =a,b (repeatable; their product).")] = None,
    clusters: Annotated[Optional[str], typer.Option("--clusters", help="Cluster sizes in GPUs (whole nodes of the instance's node kinds), e.g. 4,8,16.")] = None,
    mix: Annotated[Optional[list[str]], typer.Option("--mix", help="GPU-type mix: node kinds of these types, e.g. H100+A6000 (repeatable).")] = None,
    price: Annotated[Optional[list[str]], typer.Option("--price", help="Prices per GPU hour: GPU_TYPE=a,b (repeatable; their product).")] = None,
    growth_per_month: Annotated[Optional[float], typer.Option("--growth-per-month", min=0.0, help="Forecast: rate growth per month (0.05 = 5%).")] = None,
    months: Annotated[Optional[int], typer.Option("--months", min=0, help="Forecast: months 0..N from the instance's rates.")] = None,
    objective: ObjectiveOpt = None,
    backend: BackendOpt = "cpsat",
    time_limit_s: TimeLimitOpt = 60.0,
    workers: Annotated[int, typer.Option("--workers", min=1, max=256, help="Processes (local) or Dask workers of a local cluster, 1 to 256.")] = 1,
    executor: Annotated[str, typer.Option("--executor", help="local, or dask (a LocalCluster of --workers processes, or --address).")] = "local",
    address: Annotated[Optional[str], typer.Option("--address", help="Dask scheduler address, e.g. tcp://10.0.0.5:8786.")] = None,
    reuse: Annotated[bool, typer.Option("--reuse/--no-reuse", help="Reuse what scenarios share (docs/capacity.md); --no-reuse plans each one from scratch.")] = True,
    out: Annotated[Optional[Path], typer.Option("--out", help="Tidy table, .csv or .parquet (one row per scenario and LLM).")] = None,
    plots: Annotated[Optional[Path], typer.Option("--plots", help="Directory for the PNG plots.")] = None,
    json_output: JsonOpt = False,
) -> None:
    """Plan a capacity study: rates (total or per workflow), cluster sizes, GPU mixes, prices, a growth forecast."""
    from scepsy import api
    from scepsy.planner.allocation.search import PlanSettings
    from scepsy.planner.studies.scenarios import scenarios
    from scepsy.planner.studies.whatif import (
        cheapest_clusters,
        forecast_table,
        plot_grid,
        run_study,
        study_axes,
        write_table,
    )

    with errors():
        finite(time_limit_s, "--time-limit-s")
        if out is not None:
            check_output(out, [instance])
        if plots is not None:
            check_output_dir(plots, [instance], "--plots")
        loaded = api.load(instance, objective)
        axes = study_axes(loaded, rates, rate or [], clusters, mix or [], price or [], growth_per_month, months)
        settings = PlanSettings(backend=backend, time_limit_s=time_limit_s)
        with progress("planning the grid", len(scenarios(loaded, axes))) as advance:
            frame = run_study(
                loaded, axes, settings, workers, lambda done, total: advance(done),
                reuse=reuse, executor=executor, address=address,
            )
        if out is not None:
            with writing(out):
                write_table(frame, out)
        if plots is not None:
            with writing(plots / "grid.png", "--plots"):
                paths = plot_grid(frame, plots)
            for path in paths:
                stderr.print(f"wrote {path}")
        if json_output:
            sys.stdout.write(frame.to_json(orient="records", indent=2) + "\n")
        else:
            stdout.print(_grid_table(frame, cheapest_clusters(frame)))
            if axes.months is not None:
                stdout.print(_forecast_table(forecast_table(frame)))


def _grid_table(frame, best):
    from rich.table import Table

    table = Table(title="What-if grid (one line per scenario)")
    for column in ("rate_rps", "cluster_gpus", "feasible", "latency_s", "max_throughput_rps", "gpus_used", "cost_per_1k_requests", "cheapest"):
        table.add_column(column, justify="right")
    cheapest = set(zip(best["rate_rps"], best["cluster_gpus"]))
    for _, row in frame.drop_duplicates(["scenario"]).iterrows():
        ok = bool(row["feasible"])
        cost = row["cost_per_1k_requests"]
        table.add_row(
            f"{row['rate_rps']:g}", str(row["cluster_gpus"]), "yes" if ok else "no",
            f"{row['workflow_latency_s']:.3f}" if ok else "-",
            f"{row['workflow_max_throughput_rps']:.3f}" if ok else "-",
            f"{int(row['gpus_used'])}" if ok else "-",
            f"{cost:.4f}" if ok and cost == cost else "-",
            "*" if (row["rate_rps"], row["cluster_gpus"]) in cheapest else "",
        )
    return table


def _forecast_table(forecast):
    from rich.table import Table

    table = Table(title="Forecast: the month each cluster runs out")
    for column in forecast.columns:
        table.add_column(column, justify="right")
    for _, row in forecast.iterrows():
        table.add_row(*("-" if v is None or v != v else str(v) for v in row.tolist()))
    return table
