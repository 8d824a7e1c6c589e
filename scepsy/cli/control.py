"""Keep the plan right while load drifts: `scepsy control` (docs/control.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from scepsy.cli.app import app
from scepsy.cli.common import InstanceArg, JsonOpt, OutOpt, SeedOpt, check_out, emit_json, errors, progress, split_list, stdout
from scepsy.models.errors import InputError


@app.command()
def control(
    instance: InstanceArg,
    plan: Annotated[Path, typer.Option("--plan", help="Plan JSON with its placement (scepsy plan --out): what runs at the start.")],
    simulate: Annotated[bool, typer.Option("--simulate", help="Run the closed loop on the workflow simulator, beside the baselines.")] = False,
    arrivals: Annotated[Optional[Path], typer.Option("--arrivals", help="With --simulate: arrival timestamps, JSONL {workflow, arrival_s} or an Azure-format CSV.")] = None,
    startup_s: Annotated[float, typer.Option("--startup-s", min=0.0, help="Seconds from asking for a replica to its serving.")] = 180.0,
    period_s: Annotated[float, typer.Option("--period-s", min=1.0, help="Seconds between decisions.")] = 60.0,
    baselines: Annotated[str, typer.Option("--baselines", help="With --simulate: systems beside scepsy-control: static, static-peak, k8s-hpa, saturation, oracle.")] = "static,static-peak,k8s-hpa,saturation,oracle",
    predictor: Annotated[str, typer.Option("--predictor", help="Load forecast: constant, ewma or kalman.")] = "kalman",
    plot: Annotated[Optional[Path], typer.Option("--plot", help="With --simulate: write rate, replicas per LLM and latency over time (PNG).")] = None,
    seed: SeedOpt = 0,
    json_output: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Re-plan every period from the observed rates (forecast, SLO check, fewest moves); --simulate runs it on the simulator."""
    from scepsy import api

    with errors():
        check_out(out, [instance, plan, arrivals])
        if not simulate:
            raise InputError(None, "simulate", "only the closed-loop simulation is available here",
                             "pass --simulate with --arrivals")
        if arrivals is None:
            raise InputError(None, "arrivals", "the simulation needs arrivals", "pass --arrivals FILE (JSONL or an Azure-format CSV)")
        systems = split_list(baselines)
        with progress("simulating", len(systems) + 1) as advance:
            result = api.simulate_control(instance, plan, arrivals, startup_s=startup_s, period_s=period_s, baselines=systems,
                                          predictor=predictor, seed=seed, plot=plot, progress=advance)
        emit_json(result.document(), out, json_output)
        if not json_output:
            stdout.print(result.view())
            if result.plot is not None:
                stdout.print(f"wrote {result.plot}")
