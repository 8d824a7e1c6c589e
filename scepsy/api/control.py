"""The controller (`scepsy control`): the closed loop on the simulator beside baselines, and live
against a cluster (docs/control.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from scepsy.api.plan import InstanceLike, PathLike, load
from scepsy.models.arguments import check_choice
from scepsy.models.errors import InputError
from scepsy.models.instance.instance import Instance
from scepsy.models.output import check_output, writing
from scepsy.models.simulation.arrivals import load_arrivals

if TYPE_CHECKING:  # the control and k8s extras are imported where they are used
    from rich.console import RenderableType

    from scepsy.control.policy import ControlSettings
    from scepsy.control.simulation import SystemRun


@dataclass(frozen=True)
class ControlSimulation:
    """The closed loop on the simulator (`scepsy control --simulate`): one run per system, and
    the plot written (docs/control.md)."""

    runs: tuple[SystemRun, ...]
    plot: Path | None = None


def control_simulation_document(result: ControlSimulation) -> dict:
    """What `scepsy control --simulate --json` prints (control/report.py)."""
    from scepsy.control.report import control_document

    return control_document(result.runs)


def control_simulation_view(result: ControlSimulation) -> RenderableType:
    """Each system's GPU-hours, SLO misses and moves, as a table (control/report.py)."""
    from scepsy.control.report import control_table

    return control_table(result.runs)


_SETTING_FIXES = {
    "period_s": "give the control period in seconds, e.g. 60",
    "startup_s": "give the seconds a replica takes to serve, >= 0",
    "predictor": "use constant, ewma or kalman",
}


def control_settings(period_s: float = 60.0, startup_s: float = 180.0, predictor: str = "ewma") -> ControlSettings:
    """The controller's knobs, checked where they are defined (control/policy.py ControlSettings);
    a knob out of its range is an InputError naming that knob."""
    from scepsy.control.policy import ControlSettings, SettingError

    try:
        return ControlSettings(period_s=period_s, startup_s=startup_s, predictor=predictor)
    except SettingError as exc:
        raise InputError(None, exc.field, str(exc), _SETTING_FIXES.get(exc.field, "see docs/control.md for its range")) from None


def simulate_control(
    instance: InstanceLike,
    plan: PathLike,
    arrivals: PathLike | Mapping[str, Sequence[float]],
    *,
    startup_s: float = 180.0,
    period_s: float = 60.0,
    baselines: Sequence[str] | None = None,
    predictor: str = "ewma",
    seed: int = 0,
    plot: PathLike | None = None,
    progress: Callable[[float], None] | None = None,
) -> ControlSimulation:
    """`scepsy control --simulate`: the controller (control/policy.py) drives the workflow
    simulator from `plan` (a plan JSON with its placement) on `arrivals` (JSONL {workflow,
    arrival_s}, an Azure-format CSV or azure:conv / azure:code, as `simulate --arrivals`; or
    timestamps per workflow),
    beside `baselines` (default: all of static, static-peak, k8s-hpa, saturation, oracle) on the
    same arrivals and GPUs. SLOs: each workflow's latency_slo_s, else twice the plan's predicted
    latency at the instance's rates. `plot` writes the timeline PNG; `progress` gets the systems
    done so far (fractional)."""
    from scepsy.control.report import plot_runs
    from scepsy.control.simulation import SYSTEMS, ClosedLoopSettings, run_systems
    from scepsy.models.plan.document import deployable_plan, read_document

    policy = control_settings(period_s, startup_s, predictor)
    chosen = list(SYSTEMS[1:]) if baselines is None else list(baselines)
    for name in chosen:
        check_choice(name, SYSTEMS[1:], "baselines", "baseline")
    if plot is not None:
        check_output(plot, [p for p in (instance, plan, arrivals) if isinstance(p, (str, Path))], "plot")
    loaded = load(instance)
    source = str(plan)
    _, document_ = read_document(plan, "pass a plan JSON written by `scepsy plan --out`")
    allocation, placement = deployable_plan(source, document_, loaded)
    timestamps = load_arrivals(arrivals, [w.name for w in loaded.workflows]) if isinstance(arrivals, (str, Path)) else arrivals
    settings = ClosedLoopSettings(policy, seed=seed)
    runs = run_systems(loaded, allocation, placement, timestamps, ["scepsy-control", *chosen], settings, progress=progress)
    written = None
    if plot is not None:
        with writing(plot, "plot"):
            written = plot_runs(runs, plot)
    return ControlSimulation(tuple(runs), written)


@dataclass(frozen=True)
class ControlRun:
    """What a live `control` run did: its periods and the actions decided (the JSONL log has each)."""

    periods: int
    actions: Mapping[str, int]
    log: str


def control_run_document(run: ControlRun) -> dict:
    """What `scepsy control --json` prints after a live run."""
    return {"periods": run.periods, "actions": dict(sorted(run.actions.items())), "log": run.log}


def control(
    instance: InstanceLike,
    plan: PathLike,
    *,
    prometheus_url: str,
    namespace: str = "scepsy",
    kubeconfig: PathLike | None = None,
    context: str | None = None,
    act: str = "apply",
    log: PathLike = "scepsy-control.jsonl",
    period_s: float = 60.0,
    startup_s: float = 180.0,
    predictor: str = "ewma",
    ready_timeout_s: float = 900.0,
    selector: str = "",
    engine: str = "vllm",
    gpu_sharing: str = "hami",
    router: str = "sglang",
    image: str | None = None,
    gauges_port: int | None = None,
    periods: int | None = None,
    say: Callable[[str], None] | None = None,
    show: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> ControlRun:
    """`scepsy control` live: every `period_s` read the LLMs' request rates from Prometheus
    (`prometheus_url`, the engines' metrics, `selector` narrowing them, e.g. 'namespace="scepsy"'),
    decide (control/policy.py, the function the simulation runs) and act on the cluster
    (`namespace` of `kubeconfig`/`context`): `act` "apply" (server-side apply of what changed),
    "dry-run" (print the diff) or "gauges" (serve the target as Prometheus gauges on
    `gauges_port` for KEDA). What runs is read from the cluster; `plan` (the plan JSON that was
    deployed) gives the SLOs where the instance has none (twice its predicted latency). The
    manifest settings (`engine`, `gpu_sharing`, `router`, `image`) must be those the plan was
    deployed with. Each period is one JSON line appended to `log`; `periods` None runs until
    interrupted. docs/control.md, "Running it live"."""
    from scepsy.control.act import KubeCluster
    from scepsy.control.live import LiveSettings, run_live
    from scepsy.control.policy import make_context
    from scepsy.control.prometheus import PrometheusSettings
    from scepsy.k8s.apply import connect
    from scepsy.k8s.engines import ENGINES
    from scepsy.k8s.manifests import ManifestSettings, check_settings
    from scepsy.models.plan.document import deployable_plan, read_document

    check_choice(engine, ENGINES, "engine", "engine")
    policy = control_settings(period_s, startup_s, predictor)
    if periods is not None and periods < 1:
        raise InputError(None, "periods", f"{periods} is below 1", "give the number of periods to run, or none to run until interrupted")
    if not prometheus_url.startswith(("http://", "https://")):
        raise InputError(None, "prometheus_url", f"{prometheus_url!r} is not an http(s) URL", "give e.g. http://prometheus.monitoring:9090")
    live_settings = LiveSettings(act=act, ready_timeout_s=ready_timeout_s)
    manifest_settings = ManifestSettings(engine=engine, gpu_sharing=gpu_sharing, namespace=namespace, router=router, image=image)
    check_settings(manifest_settings)
    if act == "gauges" and gauges_port is None:
        raise InputError(None, "gauges_port", "act gauges serves the target replicas, but no port was given", "give the port to serve /metrics on, e.g. 9464")
    loaded = load(instance)
    source = str(plan)
    _, plan_doc = read_document(plan)
    allocation, _ = deployable_plan(source, plan_doc, loaded)
    policy_context = make_context(loaded, policy, allocation=allocation)  # InputError where an SLO cannot be had
    log_path = check_output(log, [instance if not isinstance(instance, Instance) else None, plan], "log")
    cluster = KubeCluster(connect(None if kubeconfig is None else Path(kubeconfig), context), namespace)
    loop = run_live(policy_context, cluster, PrometheusSettings(prometheus_url, selector=selector, engine=engine),
                    manifest_settings, live_settings, log_path, say or (lambda line: None), show or (lambda line: None),
                    clock, sleep, periods, instance_file=loaded.source, gauges_port=gauges_port)
    return ControlRun(loop.periods, dict(loop.actions), str(log_path))
