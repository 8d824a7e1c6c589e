"""Keep the plan right while load drifts: `scepsy control` (docs/control.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from scepsy.cli.app import app
from scepsy.cli.common import (
    ContextOpt,
    InstanceArg,
    JsonOpt,
    KubeconfigOpt,
    NamespaceOpt,
    OutOpt,
    SeedOpt,
    check_out,
    emit_json,
    errors,
    progress,
    say,
    split_list,
    stdout,
)
from scepsy.models.errors import InputError


@app.command()
def control(
    instance: InstanceArg,
    plan: Annotated[Path, typer.Option("--plan", help="Plan JSON with its placement (scepsy plan --out): what runs at the start.")],
    simulate: Annotated[bool, typer.Option("--simulate", help="Run the closed loop on the workflow simulator, beside the baselines.")] = False,
    arrivals: Annotated[Optional[Path], typer.Option("--arrivals", help="With --simulate: arrival timestamps, JSONL {workflow, arrival_s}, an Azure-format CSV, or azure:conv | azure:code (the shipped traces).")] = None,
    startup_s: Annotated[float, typer.Option("--startup-s", min=0.0, help="Seconds from asking for a replica to its serving.")] = 180.0,
    period_s: Annotated[float, typer.Option("--period-s", min=1.0, help="Seconds between decisions.")] = 60.0,
    baselines: Annotated[str, typer.Option("--baselines", help="With --simulate: systems beside scepsy-control: static, static-peak, k8s-hpa, saturation, oracle.")] = "static,static-peak,k8s-hpa,saturation,oracle",
    predictor: Annotated[str, typer.Option("--predictor", help="Load forecast: constant, ewma or kalman.")] = "ewma",
    plot: Annotated[Optional[Path], typer.Option("--plot", help="With --simulate: write rate, replicas per LLM and latency over time (PNG).")] = None,
    seed: SeedOpt = 0,
    prometheus_url: Annotated[Optional[str], typer.Option("--prometheus-url", help="Live: the Prometheus that scrapes the engines (HTTP API), e.g. http://prometheus.monitoring:9090.")] = None,
    prometheus_selector: Annotated[str, typer.Option("--prometheus-selector", help="Live: label matchers narrowing the engines' series, e.g. 'namespace=\"scepsy\"'.")] = "",
    namespace: NamespaceOpt = "scepsy",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    act: Annotated[str, typer.Option("--act", help="Live: apply (server-side apply of what changed), dry-run (print the diff) or gauges (serve the target replicas for KEDA).")] = "apply",
    gauges_port: Annotated[Optional[int], typer.Option("--gauges-port", min=1, max=65535, help="Live, with --act gauges: port of the /metrics with the desired replicas.")] = None,
    log: Annotated[Path, typer.Option("--log", help="Live: JSONL file each period's decision and its inputs are appended to.")] = Path("scepsy-control.jsonl"),
    periods: Annotated[Optional[int], typer.Option("--periods", min=1, help="Live: stop after this many periods (default: run until interrupted).")] = None,
    ready_timeout_s: Annotated[float, typer.Option("--ready-timeout-s", min=1.0, help="Live: a new replica not Ready after this many seconds is abandoned; the ones it replaces keep serving.")] = 900.0,
    engine: Annotated[str, typer.Option("--engine", help="Live: serving engine the plan was deployed with (vllm or sglang).")] = "vllm",
    gpu_sharing: Annotated[str, typer.Option("--gpu-sharing", help="Live: GPU sharing the plan was deployed with (hami, dra-mps, device-plugin-mps or none).")] = "hami",
    router: Annotated[str, typer.Option("--router", help="Live: routing the plan was deployed with (sglang or inference-gateway).")] = "sglang",
    image: Annotated[Optional[str], typer.Option("--image", help="Live: engine image the plan was deployed with (default: the pinned release).")] = None,
    json_output: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Re-plan every period from the observed rates (forecast, SLO check, fewest moves) and act on the cluster; --simulate runs it on the simulator."""
    from scepsy import api

    with errors():
        check_out(out, [instance, plan, arrivals])
        if not simulate:
            if prometheus_url is None:
                raise InputError(None, "prometheus_url", "the live controller reads the engines' rates from Prometheus",
                                 "pass --prometheus-url, or --simulate with --arrivals")
            run = api.control(
                instance, plan, prometheus_url=prometheus_url, namespace=namespace, kubeconfig=kubeconfig, context=context,
                act=act, log=log, period_s=period_s, startup_s=startup_s, predictor=predictor, ready_timeout_s=ready_timeout_s,
                selector=prometheus_selector, engine=engine, gpu_sharing=gpu_sharing, router=router, image=image,
                gauges_port=gauges_port, periods=periods,
                say=say,
                show=lambda line: stdout.print(line, markup=False, highlight=False, soft_wrap=True),
            )
            emit_json(api.control_run_document(run), out, json_output)
            if not json_output:
                stdout.print(f"{run.periods} periods ({', '.join(f'{n} {a}' for a, n in sorted(run.actions.items()))}); decisions in {run.log}",
                             highlight=False, markup=False)
            return
        if arrivals is None:
            raise InputError(None, "arrivals", "the simulation needs arrivals", "pass --arrivals FILE (JSONL or an Azure-format CSV)")
        systems = split_list(baselines)
        with progress("simulating", len(systems) + 1) as advance:
            result = api.simulate_control(instance, plan, arrivals, startup_s=startup_s, period_s=period_s, baselines=systems,
                                          predictor=predictor, seed=seed, plot=plot, progress=advance)
        emit_json(api.control_simulation_document(result), out, json_output)
        if not json_output:
            stdout.print(api.control_simulation_view(result))
            if result.plot is not None:
                stdout.print(f"wrote {result.plot}")
