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
    check_out,
    emit_json,
    errors,
    progress,
    stderr,
    stdout,
    working,
)


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

    with errors():
        check_out(out, [instance, current])
        with working(f"planning {instance} with {backend}, placing with {placement}"):
            result = api.plan(instance, backend=backend, objective=objective, welfare=welfare, time_limit_s=time_limit_s,
                              placement=placement, placement_time_limit_s=placement_time_limit_s, current=current,
                              workers=workers)
        emit_json(api.plan_document(result), out, json_output)
        if not json_output:
            stdout.print(api.plan_view(result))


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

    with errors():
        check_out(out, [instance, allocation, current])
        with working(f"placing {allocation} with {placement}"):
            result = api.place(instance, allocation, placement=placement, placement_time_limit_s=placement_time_limit_s,
                               current=current, workers=workers)
        emit_json(api.placement_document(instance, allocation, result), out, json_output)
        if not json_output:
            stdout.print(api.placement_view(result.placement, result.info, result.fragmentation))


@app.command()
def predict(
    instance: InstanceArg,
    allocation: AllocationOpt,
    json_output: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Predict workflow latency and throughput of a given allocation (what-if)."""
    from scepsy import api

    with errors():
        check_out(out, [instance, allocation])
        prediction = api.predict(instance, allocation)
        emit_json(api.prediction_document(prediction), out, json_output)
        if not json_output:
            stdout.print(api.prediction_view(prediction))
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

    with errors():
        with progress("planning the grid", 1) as advance:
            study = api.whatif(
                instance, rates=rates, rate=rate or [], clusters=clusters, mix=mix or [], price=price or [],
                growth_per_month=growth_per_month, months=months, objective=objective, backend=backend,
                time_limit_s=time_limit_s, workers=workers, executor=executor, address=address, reuse=reuse,
                out=out, plots=plots, progress=lambda done, total: advance(done, of=total),
            )
        for path in study.plots:
            stderr.print(f"wrote {path}")
        if json_output:
            sys.stdout.write(api.study_document(study))
        else:
            stdout.print(api.study_view(study))
