"""The public Python API: what the `scepsy` commands do, callable from notebooks and scripts.

    from scepsy import plan, place, predict, simulate
    result = plan("instances/beam-4xa6000.yaml", objective="min_gpus")
    print(plan_document(result))

Instances and allocations may be given as files (paths) or as loaded objects; every function
raises scepsy's typed errors (models/errors.py) with the line that says how to fix the input.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

from scepsy.models.catalog import catalog
from scepsy.models.catalog.catalog import GpuCard, ModelCard
from scepsy.models.catalog.model_config import describe, resolve_model
from scepsy.models.errors import InputError
from scepsy.models.instance.allocation import Allocation, Placement
from scepsy.models.instance.instance import Instance, load_instance
from scepsy.models.inputs import kind_of
from scepsy.models.instance.profile import build_profile, capacity_inversions, read_profile_frame, write_profile
from scepsy.models.output import json_number, writing
from scepsy.models.performance.aiconfigurator import make_timer
from scepsy.models.performance.alp import AllocationError, Prediction
from scepsy.models.performance.engine import IterationTimer
from scepsy.models.performance.alp import predict as predict_allocation
from scepsy.models.plan import document
from scepsy.models.plan.document import read_allocation, read_current
from scepsy.models.plan.plan import Plan
from scepsy.models.profiles.synthesize import RequestSource, Skipped, SynthesisSettings, load_request_source, stable_capacity_rps
from scepsy.models.profiles.synthesize import synthesize as synthesize_rows
from scepsy.models.simulation.simulator import SimulationResult, SimulationSettings
from scepsy.models.simulation.simulator import simulate as simulate_allocation
from scepsy.pipeline import plan_and_place
from scepsy.placement.place import METHODS, PlacementResult, PlacementSettings
from scepsy.placement.place import place as place_allocation
from scepsy.planner.allocation.objective import OBJECTIVES, WELFARES
from scepsy.planner.allocation.planning import make_plan
from scepsy.planner.allocation.search import PlanSettings

if TYPE_CHECKING:  # the tracing extra (aiohttp, pyarrow) is imported where it is used
    import pandas as pd

    from scepsy.planner.studies.sweep import Comparison
    from scepsy.tracing.profiling.replay import PointResult, SweepSettings
    from scepsy.tracing.statistics.stats import TraceStats

InstanceLike = Instance | str | Path
AllocationLike = Allocation | str | Path
PlacementLike = Placement | str | Path


def load(instance: InstanceLike, objective: str | None = None, welfare: str | None = None,
         deadline: float | None = None) -> Instance:
    """An instance (loaded from its YAML file when given a path), with objective and welfare
    overridden; past `deadline` (time.perf_counter seconds) loading stops with TimeLimitError."""
    if objective is not None and objective not in OBJECTIVES:
        raise InputError(None, "--objective", f"unknown objective {objective!r}", f"use one of: {', '.join(OBJECTIVES)}")
    if welfare is not None and welfare not in WELFARES:
        raise InputError(None, "--welfare", f"unknown welfare {welfare!r}", f"use one of: {', '.join(WELFARES)}")
    loaded = instance if isinstance(instance, Instance) else load_instance(Path(instance), deadline)
    if objective is None and welfare is None:
        return loaded
    return loaded.with_objective(objective or loaded.objective, welfare)


def allocation_of(instance: Instance, allocation: AllocationLike | None) -> Allocation:
    """An allocation (read from an allocation YAML or a plan JSON when given a path); None plans
    the instance now (without placing it: the allocation is what the simulator runs)."""
    if allocation is None:
        return make_plan(instance, PlanSettings()).allocation
    return allocation if isinstance(allocation, Allocation) else read_allocation(allocation, instance)


def placement_settings(method: str = "cpsat", time_limit_s: float = 10.0, workers: int = 1) -> PlacementSettings:
    if method not in METHODS:
        raise InputError(None, "--placement", f"unknown placement method {method!r}", f"use one of: {', '.join(METHODS)}")
    return PlacementSettings(method=method, time_limit_s=time_limit_s, workers=workers)


def _current(instance: Instance, current: PlacementLike | None) -> Placement | None:
    if current is None or isinstance(current, Placement):
        return current
    return read_current(current, instance)


def plan(
    instance: InstanceLike,
    *,
    backend: str = "cpsat",
    objective: str | None = None,
    welfare: str | None = None,
    time_limit_s: float = 60.0,
    placement: str = "cpsat",
    placement_time_limit_s: float = 10.0,
    current: PlacementLike | None = None,
    workers: int = 1,
    started_s: float | None = None,
) -> Plan:
    """The optimal allocation, placed (`scepsy plan`); `current` re-plans keeping replicas in place.
    The time limit counts from `started_s` (time.perf_counter seconds; None: this call): loading
    the instance and building the options are in it, and the placement ends within its own limit
    after that, so the whole call takes at most time_limit_s + placement_time_limit_s (docs/model.md,
    "Time limits")."""
    started_s = time.perf_counter() if started_s is None else started_s
    placing = placement_settings(placement, placement_time_limit_s, workers)
    loaded = load(instance, objective, welfare, deadline=started_s + time_limit_s)
    settings = PlanSettings(backend=backend, time_limit_s=time_limit_s, workers=workers, started_s=started_s)
    return plan_and_place(loaded, settings, placing, _current(loaded, current))


def place(
    instance: InstanceLike,
    allocation: AllocationLike,
    *,
    placement: str = "cpsat",
    placement_time_limit_s: float = 10.0,
    current: PlacementLike | None = None,
    workers: int = 1,
) -> PlacementResult:
    """Place a given allocation on the instance's cluster (`scepsy place`)."""
    placing = placement_settings(placement, placement_time_limit_s, workers)
    loaded = load(instance)
    chosen = allocation_of(loaded, allocation)
    return place_allocation(loaded.cluster, chosen, placing, _current(loaded, current))


def plan_document(result: Plan, include_wall_time: bool = True) -> dict:
    """The plan document of a plan (`scepsy plan --json`; models/plan/document.py)."""
    return document.plan_json(result, include_wall_time)


def placement_document(instance: str, allocation: Allocation, result: PlacementResult) -> dict:
    """The plan document of a placed allocation (`scepsy place --json`): no prediction, it reads
    back as an allocation and a placement."""
    return document.plan_document(instance, allocation, result.placement, result.info, result.fragmentation)


def predict(instance: InstanceLike, allocation: AllocationLike) -> Prediction:
    """The Aggregate LLM Pipeline's prediction for a given allocation (`scepsy predict`)."""
    loaded = load(instance)
    chosen = allocation_of(loaded, allocation)
    try:
        return predict_allocation(loaded, chosen)
    except AllocationError as exc:
        source = None if isinstance(allocation, Allocation) else str(allocation)
        raise InputError(source, "llms", str(exc), "pick a profiled configuration that fits in memory") from None


def prediction_document(prediction: Prediction) -> dict:
    """What `scepsy predict --json` prints: the `workflows` and `llms` sections of a plan document."""
    return document.prediction_sections(prediction)


def simulate(
    instance: InstanceLike,
    allocation: AllocationLike | None = None,
    *,
    rate_rps: float | None = None,
    settings: SimulationSettings = SimulationSettings(),
    arrivals: Mapping[str, Sequence[float]] | None = None,
    record_calls: bool = False,
    progress: Callable[[float], None] | None = None,
) -> SimulationResult:
    """Run the workflows' control flow on an allocation (`scepsy simulate`); without one, plan it
    first; `rate_rps` sets every workflow's arrival rate."""
    loaded = load(instance)
    chosen = allocation_of(loaded, allocation)
    if rate_rps is not None:
        loaded = loaded.with_arrival_rates({w.name: rate_rps for w in loaded.workflows})
    return simulate_allocation(loaded, chosen, settings, arrivals=arrivals, record_calls=record_calls, progress=progress)


ROUTINGS = ("cache_aware", "least_outstanding")


def simulation_settings(duration_s: float = 300.0, warmup_s: float | None = None, seed: int = 0,
                        routing: str = "cache_aware", engine_model: str = "builtin", backend: str = "vllm",
                        database_version: str = "current") -> SimulationSettings:
    if routing not in ROUTINGS:
        raise InputError(None, "--routing", f"unknown routing {routing!r}", "use cache_aware or least_outstanding")
    return SimulationSettings(duration_s=duration_s, warmup_s=warmup_s, seed=seed, routing=routing,
                              engine_model=engine_model, backend=backend, database_version=database_version)


@dataclass(frozen=True)
class SimulatedRun:
    """One simulation at one rate, with the pipeline's prediction beside it (None where an LLM's
    configuration has no profile curve)."""

    rate_rps: float | None  # None: the instance's own rates
    result: SimulationResult
    prediction: Prediction | None

    def to_json(self) -> dict:
        run = {"rate_rps": self.rate_rps, **self.result.to_json()}
        if self.prediction is not None:
            for workflow in run["workflows"]:
                latency = self.prediction.workflow(workflow["name"]).latency_s
                workflow["predicted_latency_s"] = json_number(latency, 6)
        return run


def simulate_rates(
    instance: Instance,
    allocation: Allocation,
    rates: Sequence[float | None],
    settings: SimulationSettings = SimulationSettings(),
    arrivals: Mapping[str, Sequence[float]] | None = None,
    record_calls: bool = False,
    progress: Callable[[float], None] | None = None,
) -> list[SimulatedRun]:
    """`scepsy simulate --rates`: one simulation per rate (None: the instance's), each with its
    prediction; `progress` gets the runs done so far (fractional)."""
    runs = []
    for index, rate in enumerate(rates):
        at = instance if rate is None else instance.with_arrival_rates({w.name: rate for w in instance.workflows})

        def step(fraction: float, done: int = index) -> None:
            if progress is not None:
                progress(done + fraction)

        result = simulate(at, allocation, settings=settings, arrivals=arrivals, record_calls=record_calls, progress=step)
        try:
            prediction: Prediction | None = predict(at, allocation)
        except InputError:  # a configuration without a profile curve: no prediction beside it
            prediction = None
        runs.append(SimulatedRun(rate, result, prediction))
    return runs


def simulation_document(instance: str, runs: Sequence[SimulatedRun]) -> dict:
    """What `scepsy simulate --json` prints: one run inline, several under `runs`."""
    if len(runs) == 1:
        return {"instance": instance, **runs[0].to_json()}
    return {"instance": instance, "runs": [run.to_json() for run in runs]}


def sweep_document(csv: Path | str, png: Path | str, comparisons: Sequence[Comparison]) -> dict:
    """What `scepsy sweep --json` prints: the files written and scepsy against each baseline."""
    return {"csv": str(csv), "png": str(png), "comparisons": [c.to_json() for c in comparisons]}


@dataclass(frozen=True)
class SynthesizedProfile:
    """A profile synthesized by the engine model (`scepsy profiles synthesize`): its rows (merged
    with those kept from an earlier file) and what they were made from."""

    frame: pd.DataFrame  # profile rows (models/instance/profile.py)
    model: ModelCard
    gpu: GpuCard
    gpu_type: str  # the label of the rows
    requests: RequestSource
    timers: Mapping[int, IterationTimer | None]  # per TP degree; None: the built-in roofline
    skipped: tuple[Skipped, ...]
    replications: int = 1  # independent draws pooled at every rate (SynthesisSettings.replications)

    def capacities_rps(self) -> dict[str, float]:
        """The largest stable arrival rate of each (tp, fraction) curve of `gpu_type`, req/s."""
        curves = self.frame.groupby(["gpu_type", "tp", "fraction"])
        return {f"tp{t}/f{fr:g}": round(stable_capacity_rps(g), 6) for (gt, t, fr), g in curves if gt == self.gpu_type}

    def summary(self, out: Path | str) -> dict:
        """What `scepsy profiles synthesize --json` prints."""
        return {
            "out": str(out),
            "model": self.model.name,
            "gpu": self.gpu.name,
            "gpu_type": self.gpu_type,
            "requests": self.requests.name,
            "model_card": describe(self.model),
            "engine_model": {f"tp{t}": timer.describe() for t, timer in self.timers.items() if timer} or "builtin",
            "mean_prompt_tokens": round(self.requests.mean_prompt_tokens, 1),
            "mean_completion_tokens": round(self.requests.mean_completion_tokens, 1),
            "replications": self.replications,
            "rows": int(len(self.frame)),
            "capacity_rps": self.capacities_rps(),
            "capacity_inversions": self.capacity_inversions(),
            "skipped": [{"tp": s.tp, "fraction": s.fraction, "reason": s.reason} for s in self.skipped],
        }

    def capacity_inversions(self) -> list[str]:
        """A line per measured fraction of the rows with less capacity than a smaller share of the
        same (gpu_type, tp) (models/instance/profile.py `capacity_inversions`)."""
        return [i.message() for i in capacity_inversions(build_profile(self.frame, "synthesized rows"))]


def synthesize_profile(
    model: str,
    gpu: str,
    tps: Sequence[int],
    fractions: Sequence[float],
    requests: str = "azure:conv",
    *,
    llm: str | None = None,
    gpu_type: str | None = None,
    min_kv_gib: float = 0.0,
    settings: SynthesisSettings = SynthesisSettings(),
    weights: str | None = None,
    engine_model: str = "builtin",
    backend: str = "vllm",
    database_version: str = "current",
    merge_into: Path | str | None = None,
    progress: Callable[[str], None] | None = None,
) -> SynthesizedProfile:
    """Synthesize a profile: one replica of a catalog `model` (or a config.json) on a catalog `gpu`
    under Poisson load, light to saturation, per TP degree and GPU fraction. `gpu_type` labels the
    rows (default: `gpu`); with `merge_into`, the rows of other (gpu_type, tp) pairs of that profile
    CSV are kept. Writes nothing: write `result.frame` with models/instance/profile.write_profile."""
    import pandas as pd

    card, gpu_card = resolve_model(model, weights), catalog.gpu(gpu)
    source = load_request_source(requests, llm)
    label = gpu_type or gpu
    timers = {t: make_timer(engine_model, card, gpu_card, t, backend, database_version) for t in tps}
    frame, skipped = synthesize_rows(card, gpu_card, tps, fractions, source, settings, label, min_kv_gib,
                                 progress=progress, timer_for=timers.get)
    if frame.empty:
        raise InputError(None, "--fractions", "no (tp, fraction) fits the model", "use larger fractions or TP degrees")
    if merge_into is not None and kind_of(merge_into) != "missing":
        old = read_profile_frame(merge_into)
        keep = ~old.set_index(["gpu_type", "tp"]).index.isin(frame.set_index(["gpu_type", "tp"]).index)
        frame = pd.concat([old[keep], frame], ignore_index=True)
    return SynthesizedProfile(frame, card, gpu_card, label, source, timers, tuple(skipped), settings.replications)


def write_profile_rows(rows: pd.DataFrame, out: Path | str) -> None:
    """Write measured profile rows to the CSV `out`, keeping its rows of other (gpu_type, tp,
    fraction) configurations."""
    from scepsy.tracing.profiling.replay import merge_profile_rows

    existing = read_profile_frame(out) if kind_of(out) != "missing" else None
    with writing(out):
        write_profile(merge_profile_rows(existing, rows), out)


@dataclass(frozen=True)
class ReplayProfile:
    """An LLM's traced calls replayed against an engine at a sweep of rates (`scepsy profile`)."""

    llm: str
    points: tuple[PointResult, ...]
    rows: pd.DataFrame  # the points as profile rows

    def point_records(self) -> list[dict]:
        """One record per rate point (seconds and req/s in the names)."""
        return [{"target_rate_rps": p.target_rate_rps, "arrival_rate_rps": p.arrival_rate_rps, "throughput_rps": p.throughput_rps,
                 "calls": p.calls, "failed": p.failed, "latency_mean_s": p.latency_s["mean"], "latency_p99_s": p.latency_s["p99"],
                 "saturated": p.saturated} for p in self.points]

    def summary(self, out: Path | str) -> dict:
        """What `scepsy profile --json` prints."""
        return {"llm": self.llm, "out": str(out), "points": self.point_records()}


def replay_profile(
    traces: Iterable[Path | str],
    llm: str,
    endpoint: str,
    gpu_type: str,
    tp: int = 1,
    fraction: float = 1.0,
    settings: SweepSettings | None = None,
    on_point: Callable[[float, int], None] | None = None,
    on_call: Callable[[], None] | None = None,
) -> ReplayProfile:
    """Replay `llm`'s traced calls against the engine at `endpoint` at a sweep of arrival rates
    (`settings.rates_rps`, or auto: light load found by a probe, doubling to saturation, then
    bisecting); `on_point(rate, expected calls)` and `on_call()` report progress."""
    import asyncio

    from scepsy.tracing.capture.traces import load_traces
    from scepsy.tracing.profiling.replay import Sweep, SweepSettings, auto_start_rate, probe_service_time, profile_rows, replay_requests

    settings = settings or SweepSettings()
    requests = replay_requests(load_traces(traces), llm, settings.model)
    start_rate = 1.0
    if settings.rates_rps is None:
        start_rate = auto_start_rate(asyncio.run(probe_service_time(requests, endpoint, timeout_s=settings.timeout_s)))
    points = asyncio.run(Sweep(requests, endpoint, settings, start_rate).run(on_point, on_call))
    return ReplayProfile(llm, tuple(points), profile_rows(points, gpu_type, tp, fraction))


def aggregate_traces(traces: Sequence[Path | str], llm_names: Mapping[str, str] | None = None,
                     workflow: str = "workflow") -> TraceStats:
    """Per workflow and LLM: n, p, their spread and time shares (`scepsy aggregate`); `workflow`
    names the calls sent without a workflow name, `llm_names` maps OTLP models to LLM names."""
    from scepsy.tracing.capture.traces import load_traces
    from scepsy.tracing.statistics.stats import aggregate

    stats = aggregate(load_traces(traces, llm_names), default_workflow=workflow)
    if not stats.workflows:
        raise InputError(", ".join(map(str, traces)), None, "no completed call carries a workflow request id",
                         "send X-Workflow-Id (or a W3C traceparent) with every LLM call of a workflow request")
    return stats
