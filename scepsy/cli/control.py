"""Keep the plan right while load drifts: `scepsy control` (docs/control.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand

from scepsy.cli.app import app
from scepsy.cli.common import (
    ContextOpt,
    InstanceArg,
    JsonOpt,
    KubeconfigOpt,
    NamespaceOpt,
    OutOpt,
    PrometheusCaOpt,
    PrometheusHeaderOpt,
    PrometheusTokenOpt,
    PrometheusVerifyOpt,
    SeedOpt,
    SettingOpt,
    SettingsFileOpt,
    check_out,
    emit_json,
    errors,
    progress,
    say,
    split_list,
    stdout,
)
from scepsy.models.errors import InputError


class _ControlCommand(TyperCommand):
    """`control`, whose help ends with the policy's knobs and their defaults, read from the policy
    when the help is shown (so it cannot disagree with it)."""

    @property
    def epilog(self) -> str | None:
        from scepsy import api

        try:
            knobs = api.control_knobs()
        except ImportError:  # the `control` extra is missing: the command itself will say so
            return "Policy knobs: docs/control.md (pip install 'scepsy[control]')."
        return f"Policy knobs (--settings FILE, --setting NAME=VALUE) and their defaults: {knobs}."

    @epilog.setter
    def epilog(self, value: str | None) -> None:
        """click sets the epilog it was given (none): the property above is the epilog."""


@app.command(cls=_ControlCommand)
def control(
    instance: InstanceArg,
    plan: Annotated[Path, typer.Option("--plan", help="Plan JSON with its placement (scepsy plan --out): what runs at the start.")],
    simulate: Annotated[bool, typer.Option("--simulate", help="Run the closed loop on the workflow simulator, beside the baselines.")] = False,
    arrivals: Annotated[Optional[Path], typer.Option("--arrivals", help="With --simulate: arrival timestamps, JSONL {workflow, arrival_s}, an Azure-format CSV, or azure:conv | azure:code (the shipped traces).")] = None,
    startup_s: Annotated[float, typer.Option("--startup-s", min=0.0, help="Seconds from asking for a replica to its serving.")] = 180.0,
    period_s: Annotated[float, typer.Option("--period-s", min=1.0, help="Seconds between decisions.")] = 30.0,
    baselines: Annotated[str, typer.Option("--baselines", help="With --simulate: systems beside scepsy-control: static, static-peak, k8s-hpa, saturation, oracle, reactive.")] = "static,static-peak,k8s-hpa,saturation,oracle",
    predictor: Annotated[str, typer.Option("--predictor", help="Load forecast: constant, ewma or kalman.")] = "ewma",
    plot: Annotated[Optional[Path], typer.Option("--plot", help="With --simulate: write rate, replicas per LLM and latency over time (PNG).")] = None,
    seed: SeedOpt = 0,
    prometheus_url: Annotated[Optional[str], typer.Option("--prometheus-url", help="Live: the Prometheus that scrapes the engines (HTTP API), e.g. http://prometheus.monitoring:9090.")] = None,
    prometheus_selector: Annotated[str, typer.Option("--prometheus-selector", help="Live: label matchers narrowing the engines' series, e.g. 'namespace=\"scepsy\"'.")] = "",
    namespace: NamespaceOpt = "scepsy",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    act: Annotated[str, typer.Option("--act", help="Live: apply (server-side apply of what changed), dry-run (print the diff) or gauges (serve the target replicas for KEDA).")] = "apply",
    metrics_port: Annotated[int, typer.Option("--metrics-port", min=0, max=65535, help="Live: port of /metrics (decisions; with --act gauges the desired replicas) and /healthz (0: any free port).")] = 9464,
    metrics_host: Annotated[str, typer.Option("--metrics-host", help="Live: address /metrics and /healthz listen on (0.0.0.0 in a pod).")] = "127.0.0.1",
    settings_file: SettingsFileOpt = None,
    setting: SettingOpt = None,
    prometheus_bearer_token_file: PrometheusTokenOpt = None,
    prometheus_ca_file: PrometheusCaOpt = None,
    prometheus_verify_tls: PrometheusVerifyOpt = True,
    prometheus_header: PrometheusHeaderOpt = None,
    leader_identity: Annotated[Optional[str], typer.Option("--leader-identity", help="Live: run only while holding the Lease scepsy-controller of --namespace, as this identity (the pod's name); default: no leader election.")] = None,
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
        check_out(out, [instance, plan, arrivals, settings_file])
        policy = api.control_settings(settings_file, setting or [], period_s=period_s, startup_s=startup_s, predictor=predictor)
        if not simulate:
            if prometheus_url is None:
                raise InputError(None, "prometheus_url", "the live controller reads the engines' rates from Prometheus",
                                 "pass --prometheus-url, or --simulate with --arrivals")
            settings = api.live_control_settings(
                prometheus_url=prometheus_url, prometheus_selector=prometheus_selector, namespace=namespace,
                kubeconfig=kubeconfig, context=context, act=act, log=log,
                ready_timeout_s=ready_timeout_s, engine=engine, gpu_sharing=gpu_sharing, router=router, image=image,
                metrics_port=metrics_port, metrics_host=metrics_host,
                prometheus_bearer_token_file=prometheus_bearer_token_file, prometheus_ca_file=prometheus_ca_file,
                prometheus_verify_tls=prometheus_verify_tls, prometheus_headers=tuple(prometheus_header or ()),
                leader_identity=leader_identity, periods=periods)
            run = api.control(
                instance, plan, settings, policy=policy, say=say,
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
            result = api.simulate_control(instance, plan, arrivals, policy, baselines=systems, seed=seed, plot=plot,
                                          progress=advance)
        emit_json(api.control_simulation_document(result), out, json_output)
        if not json_output:
            stdout.print(api.control_simulation_view(result))
            if result.plot is not None:
                stdout.print(f"wrote {result.plot}")
