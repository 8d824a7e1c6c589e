"""The controller (`scepsy control`): the closed loop on the simulator beside baselines, and live
against a cluster (docs/control.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from scepsy.api.plan import InstanceLike, PathLike, load
from scepsy.models.arguments import check_choice, settings_with
from scepsy.models.errors import InputError
from scepsy.models.inputs import kind_of
from scepsy.models.instance.instance import Instance
from scepsy.models.output import check_output, writing
from scepsy.models.simulation.arrivals import load_arrivals

if TYPE_CHECKING:  # the control and k8s extras are imported where they are used
    from rich.console import RenderableType

    from scepsy.control.policy import ControlSettings
    from scepsy.control.settings import LiveControlSettings
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


def control_settings(settings_file: PathLike | None = None, setting: Sequence[str] = (), **knobs: object) -> ControlSettings:
    """The policy's knobs (control/policy.py ControlSettings, every default there): `knobs` (keyword
    overrides, e.g. `period_s=10`), then those of `settings_file` (YAML, knob: value), then
    `setting` (NAME=VALUE items); checked once, where they are defined, a knob out of its range an
    InputError naming it."""
    from scepsy.control.knobs import control_settings as checked

    return checked(dict(knobs), settings_file, setting)


def simulate_control(
    instance: InstanceLike,
    plan: PathLike,
    arrivals: PathLike | Mapping[str, Sequence[float]],
    policy: ControlSettings | None = None,
    *,
    baselines: Sequence[str] | None = None,
    seed: int = 0,
    plot: PathLike | None = None,
    progress: Callable[[float], None] | None = None,
) -> ControlSimulation:
    """`scepsy control --simulate`: the controller (control/policy.py, its knobs `policy`, default
    `control_settings()`) drives the workflow simulator from the plan for the first 5 minutes' rate
    (control/simulation.py `opening_plan`; `plan`, a plan JSON with its placement, sets the SLOs)
    on `arrivals` (JSONL {workflow, arrival_s}, an Azure-format CSV or azure:conv / azure:code, as
    `simulate --arrivals`; or timestamps per workflow), beside `baselines` (default: static,
    static-peak, k8s-hpa, saturation, oracle; or reactive) on the same arrivals and GPUs. SLOs: each
    workflow's latency_slo_s, else twice the plan's predicted latency at the instance's rates.
    `plot` writes the timeline PNG; `progress` gets the systems done so far (fractional)."""
    from scepsy.control.report import plot_runs
    from scepsy.control.simulation import BASELINES, SYSTEMS, ClosedLoopSettings, run_systems
    from scepsy.models.plan.document import deployable_plan, read_document

    knobs = control_settings() if policy is None else policy
    chosen = list(BASELINES) if baselines is None else list(baselines)
    for name in chosen:
        check_choice(name, SYSTEMS[1:], "baselines", "baseline")
    if plot is not None:
        check_output(plot, [p for p in (instance, plan, arrivals) if isinstance(p, (str, Path))], "plot")
    loaded = load(instance)
    source = str(plan)
    _, document_ = read_document(plan, "pass a plan JSON written by `scepsy plan --out`")
    allocation, placement = deployable_plan(source, document_, loaded)
    timestamps = load_arrivals(arrivals, [w.name for w in loaded.workflows]) if isinstance(arrivals, (str, Path)) else arrivals
    settings = ClosedLoopSettings(knobs, seed=seed)
    runs = run_systems(loaded, allocation, placement, timestamps, ["scepsy-control", *chosen], settings, progress=progress)
    written = None
    if plot is not None:
        with writing(plot, "plot"):
            written = plot_runs(runs, plot)
    return ControlSimulation(tuple(runs), written)


def control_knobs() -> str:
    """The policy's knobs and their defaults, one line (what `scepsy control --help` lists)."""
    from scepsy.control.knobs import describe_defaults

    return describe_defaults()




@dataclass(frozen=True)
class ControlRun:
    """What a live `control` run did: its periods and the actions decided (the JSONL log has each)."""

    periods: int
    actions: Mapping[str, int]
    log: str


def control_run_document(run: ControlRun) -> dict:
    """What `scepsy control --json` prints after a live run."""
    return {"periods": run.periods, "actions": dict(sorted(run.actions.items())), "log": run.log}


def live_control_settings(settings: LiveControlSettings | None = None, **overrides) -> LiveControlSettings:
    """`settings` (default: every default of control/settings.py LiveControlSettings; a live run
    needs `prometheus_url`) with `overrides` of its fields, checked (InputError naming the field)."""
    from scepsy.control.settings import LiveControlSettings

    return settings_with(LiveControlSettings, settings, overrides, "live control setting")


def control(
    instance: InstanceLike,
    plan: PathLike,
    settings: LiveControlSettings | None = None,
    *,
    policy: ControlSettings | None = None,
    say: Callable[[str], None] | None = None,
    show: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    **overrides,
) -> ControlRun:
    """`scepsy control` live, as `settings` says (control/settings.py LiveControlSettings; keyword
    `overrides` of its fields for a quick call, e.g. `control(instance, plan,
    prometheus_url="http://prometheus:9090", act="dry-run")`): every period (`policy.period_s`;
    `policy` the policy's knobs, default `control_settings()`) read the LLMs' request rates from
    Prometheus (`prometheus_url`, the engines' metrics, `prometheus_selector` narrowing them, e.g.
    'namespace="scepsy"'; read with `prometheus_bearer_token_file`, `prometheus_ca_file`,
    `prometheus_verify_tls` and `prometheus_headers`, "Name: value"), decide (control/policy.py,
    the function the simulation runs) and act on the cluster (`namespace` of
    `kubeconfig`/`context`): `act` "apply" (server-side apply of what changed), "dry-run" (print
    the diff) or "gauges" (also serve the target as Prometheus gauges for KEDA). Every mode serves
    /metrics and /healthz on `metrics_host`:`metrics_port` (0: a free port). What runs is read from
    the cluster, and the lost nodes and GPUs from its Nodes; `plan` (the plan JSON that was
    deployed) gives the SLOs where the instance has none (twice its predicted latency). The
    manifest settings (`engine`, `gpu_sharing`, `router`, `image`) must be those the plan was
    deployed with. With `leader_identity` the loop runs only while this controller holds the Lease
    `scepsy-controller` of `namespace`. Each period is one JSON line appended to `log`; `periods`
    None runs until interrupted. docs/control.md, "Running it live"."""
    from scepsy.control import service
    from scepsy.control.act import KubeCluster
    from scepsy.control.gauges import DesiredGauges
    from scepsy.control.leader import LeaderSettings
    from scepsy.control.live import LiveLoop
    from scepsy.control.policy import make_context
    from scepsy.control.prometheus import PrometheusClient, PrometheusSettings
    from scepsy.k8s.apply import connect
    from scepsy.models.plan.document import deployable_plan, read_document

    run = live_control_settings(settings, **overrides)
    assert run.prometheus_url is not None  # checked by the settings
    for path, field in ((run.prometheus_bearer_token_file, "prometheus_bearer_token_file"), (run.prometheus_ca_file, "prometheus_ca_file")):
        if path is not None and kind_of(Path(path)) != "file":
            raise InputError(str(path), field, "file not found", "give the path of a readable file (in a pod: a mounted Secret or projected token)",
                             argument=True)
    prometheus_settings = PrometheusSettings(
        run.prometheus_url, selector=run.prometheus_selector, engine=run.engine,
        bearer_token_file=None if run.prometheus_bearer_token_file is None else str(run.prometheus_bearer_token_file),
        ca_file=None if run.prometheus_ca_file is None else str(run.prometheus_ca_file), verify_tls=run.prometheus_verify_tls, headers=service.header_pairs(tuple(run.prometheus_headers)))
    try:
        prometheus_settings.tls()
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise InputError(str(run.prometheus_ca_file), "prometheus_ca_file", f"not a CA bundle ({exc})",
                         "give the PEM file of the CA that signed Prometheus' certificate", argument=True) from None
    policy = control_settings() if policy is None else policy
    leader = None if run.leader_identity is None else LeaderSettings(run.leader_identity, run.namespace)
    loaded = load(instance)
    source = str(plan)
    _, plan_doc = read_document(plan)
    allocation, _ = deployable_plan(source, plan_doc, loaded)
    policy_context = make_context(loaded, policy, allocation=allocation)  # InputError where an SLO cannot be had
    log_path = check_output(run.log, [instance if not isinstance(instance, Instance) else None, plan], "log")
    api_client = connect(None if run.kubeconfig is None else Path(run.kubeconfig), run.context)
    cluster = KubeCluster(api_client, run.namespace)
    prometheus = PrometheusClient(prometheus_settings)
    speak = say or (lambda line: None)
    # stale after three periods, and never before a period plus five minutes (a re-plan's solver time, API retries)
    gauges = DesiredGauges(clock, stale_after_s=max(3 * policy.period_s, policy.period_s + 300.0))
    service.serve_metrics(gauges, run.metrics_host, run.metrics_port, speak)
    try:
        with open(log_path, "a", encoding="utf-8") as stream:
            loop = LiveLoop(policy_context, cluster, prometheus, run.manifest_settings(), run.live_settings(), stream,
                            speak, show or (lambda line: None), clock, instance_file=loaded.source, gauges=gauges)
            service.run(loop, gauges, sleep, run.periods, api_client, leader)
    except OSError as exc:
        raise InputError(str(log_path), "log", f"cannot write ({exc.strerror})", "give `log` a writable path") from None
    finally:
        prometheus.close()
        gauges.shutdown()
    return ControlRun(loop.periods, dict(loop.actions), str(log_path))
