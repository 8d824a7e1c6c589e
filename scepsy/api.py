"""The public Python API: what the `scepsy` commands do, callable from notebooks and scripts.

    from scepsy import plan, place, predict, simulate
    result = plan("instances/beam-4xa6000.yaml", objective="min_gpus")
    print(plan_document(result))

Every command of the command line is one function here (docs/cli.md lists them): plan, place,
predict, whatif, simulate_rates, sweep, synthesize_profile, import_profile, replay_profile,
aggregate_traces, export_traces, proxy, emulate, topology, manifests, deploy and status. Besides
them, the documents and views are what the commands print (`plan_document`, `plan_view`, ...;
results of the newer functions carry theirs as methods).

Instances and allocations may be given as files (paths) or as loaded objects; every function
raises scepsy's typed errors (models/errors.py) with the line that says how to fix the input,
naming the argument as this module spells it (`clusters`, `time_limit_s`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from scepsy.models.arguments import check_choice, check_finite, check_fraction, check_gpu_type
from scepsy.models.catalog import catalog
from scepsy.models.catalog.catalog import GpuCard, ModelCard
from scepsy.models.catalog.model_config import describe, resolve_model
from scepsy.models.errors import InputError
from scepsy.models.instance.allocation import Allocation, Placement
from scepsy.models.instance.instance import Instance, load_instance
from scepsy.models.inputs import kind_of
from scepsy.models.instance.profile import build_profile, capacity_inversions, load_profile, read_profile_frame, write_profile
from scepsy.models.output import check_output, check_output_dir, json_number, writing
from scepsy.models.performance.aiconfigurator import make_timer
from scepsy.models.performance.alp import AllocationError, Prediction
from scepsy.models.performance.engine import IterationTimer
from scepsy.models.performance.alp import predict as predict_allocation
from scepsy.models.plan import document
from scepsy.models.plan.document import read_allocation, read_current
from scepsy.models.plan.plan import Plan
from scepsy.models.plan.report import comparison_table, placement_view, plan_view, prediction_view, simulation_view
from scepsy.models.profiles.synthesize import RequestSource, Skipped, SynthesisSettings, load_request_source, stable_capacity_rps
from scepsy.models.profiles.synthesize import synthesize as synthesize_rows
from scepsy.models.simulation.arrivals import load_arrivals
from scepsy.models.performance.replica import SCHEDULING_POLICIES
from scepsy.models.simulation.simulator import DEFAULT_SCHEDULING, SimulationResult, SimulationSettings, write_calls
from scepsy.models.simulation.simulator import simulate as simulate_allocation
from scepsy.pipeline import plan_and_place
from scepsy.placement.place import METHODS, PlacementResult, PlacementSettings
from scepsy.placement.place import place as place_allocation
from scepsy.planner.allocation.objective import OBJECTIVES, WELFARES
from scepsy.planner.allocation.planning import make_plan
from scepsy.planner.allocation.search import PlanSettings

if TYPE_CHECKING:  # the tracing and k8s extras (aiohttp, pyarrow, kubernetes) are imported where they are used
    import pandas as pd
    from rich.console import RenderableType

    from scepsy.control.simulation import SystemRun
    from scepsy.k8s.apply import ApplyResult, ReplicaStatus
    from scepsy.planner.studies.sweep import Comparison
    from scepsy.tracing.discovery.topology import NodeTopology
    from scepsy.tracing.emulation.emulator import EmulatorConfig
    from scepsy.tracing.profiling.replay import PointResult, SweepSettings
    from scepsy.tracing.statistics.stats import TraceStats

InstanceLike = Instance | str | Path
AllocationLike = Allocation | str | Path
PlacementLike = Placement | str | Path
PathLike = str | Path

# what the commands do, one function each (docs/cli.md names each command's)
OPERATIONS = (
    "plan", "place", "predict", "whatif", "simulate", "simulate_rates", "sweep", "synthesize_profile",
    "import_profile", "replay_profile", "aggregate_traces", "export_traces", "proxy", "emulate", "topology",
    "manifests", "deploy", "status", "control", "simulate_control",
)
__all__ = [
    "plan", "place", "predict", "whatif", "simulate", "simulate_rates", "sweep", "synthesize_profile",
    "import_profile", "replay_profile", "aggregate_traces", "export_traces", "proxy", "emulate", "topology",
    "manifests", "deploy", "status", "control", "simulate_control",
    # their inputs
    "load", "allocation_of", "placement_settings", "simulation_settings", "replay_settings", "emulator_config",
    "SimulationSettings", "SynthesisSettings",
    # what the commands print
    "plan_document", "placement_document", "prediction_document", "simulation_document", "plan_view",
    "placement_view", "prediction_view", "simulation_view", "stats_document", "stats_view",
]


def load(instance: InstanceLike, objective: str | None = None, welfare: str | None = None,
         deadline: float | None = None) -> Instance:
    """An instance (loaded from its YAML file when given a path), with objective and welfare
    overridden; past `deadline` (time.perf_counter seconds) loading stops with TimeLimitError."""
    if objective is not None:
        check_choice(objective, OBJECTIVES, "objective", "objective")
    if welfare is not None:
        check_choice(welfare, WELFARES, "welfare", "welfare")
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
    """How to place (`placement`, `placement_time_limit_s` of `plan` and `place`), checked."""
    check_choice(method, METHODS, "placement", "placement method")
    check_finite(time_limit_s, "placement_time_limit_s")
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
    check_finite(time_limit_s, "time_limit_s")
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


def placement_document(instance: InstanceLike, allocation: AllocationLike, result: PlacementResult) -> dict:
    """The plan document of a placed allocation (`scepsy place --json`): no prediction, it reads
    back as an allocation and a placement. `instance` is named in it as given (a path), or by its
    source file."""
    name = (instance.source or "instance") if isinstance(instance, Instance) else str(instance)
    chosen = allocation if isinstance(allocation, Allocation) else allocation_of(load(instance), allocation)
    return document.plan_document(name, chosen, result.placement, result.info, result.fragmentation)


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


# ---------------------------------------------------------------------------------------------
# Capacity studies


@dataclass(frozen=True)
class Study:
    """A capacity study (`scepsy whatif`): the tidy table, one row per scenario and LLM
    (docs/capacity.md has its schema), and the files written."""

    frame: pd.DataFrame
    forecast: bool  # the axes include a growth forecast
    table: Path | None = None
    plots: tuple[Path, ...] = ()

    def to_json_text(self) -> str:
        """What `scepsy whatif --json` prints: the table's rows as a JSON list."""
        return self.frame.to_json(orient="records", indent=2) + "\n"

    def view(self) -> RenderableType:
        """The grid (cheapest cluster per rate starred) and, with a forecast, the month each
        cluster runs out."""
        from scepsy.planner.studies.whatif import study_view

        return study_view(self.frame, self.forecast)


def whatif(
    instance: InstanceLike,
    *,
    rates: str | None = None,
    rate: Sequence[str] = (),
    clusters: str | None = None,
    mix: Sequence[str] = (),
    price: Sequence[str] = (),
    growth_per_month: float | None = None,
    months: int | None = None,
    objective: str | None = None,
    backend: str = "cpsat",
    time_limit_s: float = 60.0,
    workers: int = 1,
    executor: str = "local",
    address: str | None = None,
    reuse: bool = True,
    out: PathLike | None = None,
    plots: PathLike | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Study:
    """Plan every scenario of a capacity study (`scepsy whatif`): total `rates` ("2:40:2" or
    "2,4,8", req/s) or per-workflow `rate` items ("beam=2:20:2"), cluster sizes `clusters`
    ("4,8,16" GPUs), GPU-type `mix`es ("H100+A6000"), `price` items ("H100=2,3" per GPU hour), and
    a forecast (`growth_per_month`, `months`). `out` writes the table (.csv or .parquet), `plots`
    the PNG plots into that folder; `progress(done, total)` counts the scenarios planned."""
    from scepsy.planner.studies.executors import check_executor
    from scepsy.planner.studies.scenarios import scenarios
    from scepsy.planner.studies.whatif import plot_grid, run_study, study_axes, write_table

    check_finite(time_limit_s, "time_limit_s")
    check_finite(growth_per_month, "growth_per_month")
    check_executor(executor, address)
    inputs = [None if isinstance(instance, Instance) else instance]
    if out is not None:
        check_output(out, inputs)
    if plots is not None:
        check_output_dir(plots, inputs, "plots")
    loaded = load(instance, objective)
    axes = study_axes(loaded, rates, list(rate), clusters, list(mix), list(price), growth_per_month, months)
    if progress is not None:
        progress(0, len(scenarios(loaded, axes)))
    settings = PlanSettings(backend=backend, time_limit_s=time_limit_s)
    frame = run_study(loaded, axes, settings, workers, progress, reuse=reuse, executor=executor, address=address)
    written: tuple[Path, ...] = ()
    if out is not None:
        with writing(out):
            write_table(frame, Path(out))
    if plots is not None:
        with writing(Path(plots) / "grid.png", "plots"):
            written = tuple(plot_grid(frame, Path(plots)))
    return Study(frame, axes.months is not None, None if out is None else Path(out), written)


# ---------------------------------------------------------------------------------------------
# Simulation


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
    """Run the workflows' control flow on an allocation; without one, plan it first; `rate_rps`
    sets every workflow's arrival rate (`simulate_rates` runs several rates, as `scepsy simulate`)."""
    check_finite(rate_rps, "rate_rps")
    loaded = load(instance)
    chosen = allocation_of(loaded, allocation)
    if rate_rps is not None:
        loaded = loaded.with_arrival_rates({w.name: rate_rps for w in loaded.workflows})
    return simulate_allocation(loaded, chosen, settings, arrivals=arrivals, record_calls=record_calls, progress=progress)


ROUTINGS = ("cache_aware", "least_outstanding")


def simulation_settings(duration_s: float = 300.0, warmup_s: float | None = None, seed: int = 0,
                        routing: str = "cache_aware", engine_model: str = "builtin", backend: str = "vllm",
                        database_version: str = "current", scheduling: str = DEFAULT_SCHEDULING) -> SimulationSettings:
    """Settings of a simulation, checked (`duration_s`, `warmup_s`, `routing`, `scheduling`, ...)."""
    check_finite(duration_s, "duration_s")
    check_finite(warmup_s, "warmup_s")
    check_choice(routing, ROUTINGS, "routing", "routing")
    check_choice(scheduling, SCHEDULING_POLICIES, "scheduling", "scheduling policy")
    return SimulationSettings(duration_s=duration_s, warmup_s=warmup_s, seed=seed, routing=routing,
                              engine_model=engine_model, backend=backend, database_version=database_version,
                              scheduling=scheduling)


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
    instance: InstanceLike,
    allocation: AllocationLike | None = None,
    rates: Sequence[float | None] = (None,),
    settings: SimulationSettings = SimulationSettings(),
    arrivals: Mapping[str, Sequence[float]] | PathLike | None = None,
    calls_out: PathLike | None = None,
    progress: Callable[[float], None] | None = None,
) -> list[SimulatedRun]:
    """`scepsy simulate`: one simulation per rate of every workflow (req/s; None: the instance's),
    each with its prediction, on `allocation` (a file or an Allocation; None: plan the instance
    first). `arrivals`: timestamps per workflow, or a file of them (JSONL or an Azure-format CSV);
    `calls_out` writes every LLM call as JSONL (the request source of `synthesize_profile`);
    `progress` gets the runs done so far (fractional)."""
    for rate in rates:
        check_finite(rate, "rates")
    if calls_out is not None:
        check_output(calls_out, [p for p in (instance, allocation, arrivals) if isinstance(p, (str, Path))], "calls_out")
    loaded = load(instance)
    chosen = allocation_of(loaded, allocation)
    timestamps = load_arrivals(arrivals, [w.name for w in loaded.workflows]) if isinstance(arrivals, (str, Path)) else arrivals
    runs = []
    for index, rate in enumerate(rates):
        at = loaded if rate is None else loaded.with_arrival_rates({w.name: rate for w in loaded.workflows})

        def step(fraction: float, done: int = index) -> None:
            if progress is not None:
                progress(done + fraction)

        result = simulate(at, chosen, settings=settings, arrivals=timestamps, record_calls=calls_out is not None, progress=step)
        try:
            prediction: Prediction | None = predict(at, chosen)
        except InputError:  # a configuration without a profile curve: no prediction beside it
            prediction = None
        runs.append(SimulatedRun(rate, result, prediction))
    if calls_out is not None:
        write_calls((run.result for run in runs), calls_out)
    return runs


def simulation_document(instance: str, runs: Sequence[SimulatedRun]) -> dict:
    """What `scepsy simulate --json` prints: one run inline, several under `runs`."""
    if len(runs) == 1:
        return {"instance": instance, **runs[0].to_json()}
    return {"instance": instance, "runs": [run.to_json() for run in runs]}


@dataclass(frozen=True)
class SweepRun:
    """Throughput-latency curves of scepsy and baselines (`scepsy sweep`): the tidy table of every
    (system, load, workflow) point, the files written, and scepsy against each baseline."""

    frame: pd.DataFrame
    comparisons: tuple[Comparison, ...]
    csv: Path
    png: Path

    def document(self) -> dict:
        """What `scepsy sweep --json` prints."""
        return {"csv": str(self.csv), "png": str(self.png), "comparisons": [c.to_json() for c in self.comparisons]}

    def view(self) -> RenderableType:
        return comparison_table(self.comparisons)


def sweep(
    instance: InstanceLike,
    *,
    rates: Sequence[float] | None = None,
    load_factors: Sequence[float] | None = None,
    baselines: Sequence[str] = ("k8s-hpa", "per-llm"),
    allocation: PathLike | None = None,
    settings: SimulationSettings = SimulationSettings(),
    out_csv: PathLike = "sweep.csv",
    out_png: PathLike = "sweep.png",
    progress: Callable[[int, int, str], None] | None = None,
) -> SweepRun:
    """Simulate scepsy and the `baselines` (planner/studies/baselines.py SYSTEMS; `static` runs the
    `allocation` file) at each of the `rates` (req/s, every workflow) or `load_factors` (multiples of
    the instance's rates), exactly one of them; write the table to `out_csv` and the plot to
    `out_png`; `progress(done, total, text)` after each (system, load) point."""
    from scepsy.planner.studies.baselines import check_system
    from scepsy.planner.studies.sweep import SweepSettings, compare, load_points, plot_sweep, write_sweep
    from scepsy.planner.studies.sweep import sweep as run_sweep

    inputs = [p for p in (instance, allocation) if isinstance(p, (str, Path))]
    for path, field in ((out_csv, "out_csv"), (out_png, "out_png")):
        check_output(path, inputs, field)
    loaded = load(instance)
    points = load_points(loaded, rates=rates, load_factors=load_factors)
    systems = ["scepsy"] + [s for s in baselines if s != "scepsy"]
    for system in systems:
        check_system(system, allocation)
    total, done = len(systems) * len(points), 0

    def step(text: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, text)

    static = None if allocation is None else Path(allocation)
    frame = run_sweep(loaded, points, systems, SweepSettings(settings, static_path=static), progress=step)
    with writing(out_csv, "out_csv"):
        write_sweep(frame, Path(out_csv))
    with writing(out_png, "out_png"):
        plot_sweep(frame, Path(out_png), title=Path(loaded.source or "instance").stem)
    return SweepRun(frame, tuple(compare(frame)), Path(out_csv), Path(out_png))


# ---------------------------------------------------------------------------------------------
# Profiles


def _inversion_notes(out: PathLike) -> tuple[str, ...]:
    """A line per measured fraction of the profile at `out` with less capacity than a smaller share
    of the same (gpu_type, tp) (models/instance/profile.py `capacity_inversions`)."""
    return tuple(i.message() for i in capacity_inversions(load_profile(out)))


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
    out: Path | str | None = None,
    progress: Callable[[str], None] | None = None,
) -> SynthesizedProfile:
    """Synthesize a profile: one replica of a catalog `model` (or a config.json) on a catalog `gpu`
    under Poisson load, light to saturation, per TP degree and GPU fraction. `gpu_type` labels the
    rows (default: `gpu`); with `merge_into`, the rows of other (gpu_type, tp) pairs of that profile
    CSV are kept; `out` writes the rows there (models/instance/profile.py `write_profile`)."""
    import pandas as pd

    for fraction in fractions:
        check_fraction(fraction, "fractions")
    if gpu_type is not None:
        check_gpu_type(gpu_type)
    if out is not None:
        check_output(out, [requests] if kind_of(requests) != "missing" else [])
    card, gpu_card = resolve_model(model, weights), catalog.gpu(gpu)
    source = load_request_source(requests, llm)
    label = gpu_type or gpu
    timers = {t: make_timer(engine_model, card, gpu_card, t, backend, database_version) for t in tps}
    frame, skipped = synthesize_rows(card, gpu_card, tps, fractions, source, settings, label, min_kv_gib,
                                     progress=progress, timer_for=timers.get)
    if frame.empty:
        raise InputError(None, "fractions", "no (tp, fraction) fits the model", "use larger fractions or TP degrees")
    if merge_into is not None and kind_of(merge_into) != "missing":
        old = read_profile_frame(merge_into)
        keep = ~old.set_index(["gpu_type", "tp"]).index.isin(frame.set_index(["gpu_type", "tp"]).index)
        frame = pd.concat([old[keep], frame], ignore_index=True)
    if out is not None:
        with writing(out):
            write_profile(frame, out)
    return SynthesizedProfile(frame, card, gpu_card, label, source, timers, tuple(skipped), settings.replications)


def write_profile_rows(rows: pd.DataFrame, out: Path | str) -> None:
    """Write measured profile rows to the CSV `out`, keeping its rows of other (gpu_type, tp,
    fraction) configurations."""
    from scepsy.tracing.profiling.replay import merge_profile_rows

    existing = read_profile_frame(out) if kind_of(out) != "missing" else None
    with writing(out):
        write_profile(merge_profile_rows(existing, rows), out)


@dataclass(frozen=True)
class ImportedProfile:
    """Benchmark results imported as profile rows (`scepsy profiles import`)."""

    rows: pd.DataFrame
    notes: tuple[str, ...]  # what the import read around (missing percentiles, ...)
    skipped: tuple[str, ...]  # runs without an arrival rate
    inversions: tuple[str, ...] = ()  # of the profile written (_inversion_notes)


def import_profile(files: Iterable[PathLike], gpu_type: str, out: PathLike, tp: int = 1,
                   fraction: float = 1.0) -> ImportedProfile:
    """Import `vllm bench serve` result JSON, `vllm bench sweep` result directories and
    `sglang.bench_serving` JSONL files as profile rows of one (gpu_type, tp, fraction), merged into
    the profile CSV `out` (its rows of other configurations are kept)."""
    from scepsy.tracing.profiling.benchimport import import_bench_results

    check_fraction(fraction)
    check_gpu_type(gpu_type)
    paths = list(files)
    check_output(out, paths)
    result = import_bench_results(paths, gpu_type, tp, fraction)
    write_profile_rows(result.rows, out)
    return ImportedProfile(result.rows, tuple(result.notes), tuple(result.skipped), _inversion_notes(out))


@dataclass(frozen=True)
class ReplayProfile:
    """An LLM's traced calls replayed against an engine at a sweep of rates (`scepsy profile`)."""

    llm: str
    points: tuple[PointResult, ...]
    rows: pd.DataFrame  # the points as profile rows, of one (gpu_type, tp, fraction)
    gpu_type: str
    tp: int
    fraction: float
    inversions: tuple[str, ...] = ()  # of the profile written (_inversion_notes)

    def point_records(self) -> list[dict]:
        """One record per rate point (seconds and req/s in the names)."""
        return [{"target_rate_rps": p.target_rate_rps, "arrival_rate_rps": p.arrival_rate_rps, "throughput_rps": p.throughput_rps,
                 "calls": p.calls, "failed": p.failed, "latency_mean_s": p.latency_s["mean"], "latency_p99_s": p.latency_s["p99"],
                 "saturated": p.saturated} for p in self.points]

    def summary(self, out: Path | str) -> dict:
        """What `scepsy profile --json` prints."""
        return {"llm": self.llm, "out": str(out), "points": self.point_records()}

    def view(self, out: Path | str) -> RenderableType:
        """The rate points as a readable table (rich)."""
        from rich.table import Table

        table = Table(title=f"Replay profile of {self.llm} ({self.gpu_type}, tp={self.tp}, fraction={self.fraction:g}) -> {out}")
        for column in ("arrival_rate_rps", "throughput_rps", "calls", "failed", "latency_mean_s", "latency_p99_s", "saturated"):
            table.add_column(column, justify="right")
        for p in sorted(self.point_records(), key=lambda p: p["arrival_rate_rps"]):
            table.add_row(f"{p['arrival_rate_rps']:.3f}", f"{p['throughput_rps']:.3f}", str(p["calls"]), str(p["failed"]),
                          f"{p['latency_mean_s']:.3f}", f"{p['latency_p99_s']:.3f}", "yes" if p["saturated"] else "no")
        return table


def replay_settings(rates_rps: Sequence[float] | None = None, duration_s: float = 60.0, min_requests: int = 5,
                    seed: int = 0, timeout_s: float = 600.0, model: str | None = None,
                    arrivals: str = "poisson") -> SweepSettings:
    """Settings of `replay_profile`, checked: `rates_rps` calls/s (None: auto), `duration_s` per rate
    point, `arrivals` poisson or uniform (tracing/profiling/replay.py SweepSettings)."""
    from scepsy.tracing.profiling.replay import SweepSettings

    return SweepSettings(rates_rps=None if rates_rps is None else tuple(rates_rps), duration_s=duration_s,
                         min_requests=min_requests, seed=seed, timeout_s=timeout_s, model=model, arrivals=arrivals)


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
    out: PathLike | None = None,
) -> ReplayProfile:
    """Replay `llm`'s traced calls against the engine at `endpoint` at a sweep of arrival rates
    (`settings.rates_rps`, or auto: light load found by a probe, doubling to saturation, then
    bisecting); `on_point(rate, expected calls)` and `on_call()` report progress; `out` merges the
    rows into that profile CSV (its rows of other configurations are kept)."""
    import asyncio

    from scepsy.tracing.capture.traces import load_traces
    from scepsy.tracing.profiling.replay import Sweep, SweepSettings, auto_start_rate, probe_service_time, profile_rows, replay_requests

    check_fraction(fraction)
    check_gpu_type(gpu_type)
    paths = list(traces)
    if out is not None:
        check_output(out, paths)
    settings = settings or SweepSettings()
    requests = replay_requests(load_traces(paths), llm, settings.model)
    start_rate = 1.0
    if settings.rates_rps is None:
        start_rate = auto_start_rate(asyncio.run(probe_service_time(requests, endpoint, timeout_s=settings.timeout_s)))
    points = asyncio.run(Sweep(requests, endpoint, settings, start_rate).run(on_point, on_call))
    rows = profile_rows(points, gpu_type, tp, fraction)
    if out is None:
        return ReplayProfile(llm, tuple(points), rows, gpu_type, tp, fraction)
    write_profile_rows(rows, out)
    return ReplayProfile(llm, tuple(points), rows, gpu_type, tp, fraction, _inversion_notes(out))


# ---------------------------------------------------------------------------------------------
# Traces


def aggregate_traces(traces: Sequence[Path | str], llm_names: Mapping[str, str] | Sequence[str] | None = None,
                     workflow: str = "workflow", out: PathLike | None = None,
                     workflow_attribute: str | None = None) -> TraceStats:
    """Per workflow and LLM: n, p, their spread and time shares (`scepsy aggregate`); `workflow`
    names the calls sent without a workflow name, `llm_names` maps span models to LLM names (or
    MODEL=LLM items), `workflow_attribute` is the span attribute that names a request's workflow
    (docs/tracing.md); `out` writes the statistics as YAML (each workflow's `stages` drops into an
    instance). What the spans held is `result.spans`, their warnings `result.warnings`."""
    from scepsy.tracing.capture.traces import parse_llm_names, read_traces
    from scepsy.tracing.statistics.stats import aggregate, write_stats

    names = dict(llm_names) if isinstance(llm_names, Mapping) else parse_llm_names(llm_names or ())
    if out is not None:
        check_output(out, traces)
    found = read_traces(traces, names, workflow_attribute)
    stats = replace(aggregate(found.calls, default_workflow=workflow), spans=found.spans)
    if not stats.workflows:
        source = ", ".join(map(str, traces))
        if found.spans is not None and found.spans.llm_calls == len(found.calls):  # every call came from spans
            raise InputError(source, None, *found.spans.no_requests())
        raise InputError(source, None, "no completed call carries a workflow request id",
                         "send X-Workflow-Id (or a W3C traceparent) with every LLM call of a workflow request")
    if out is not None:
        write_stats(stats, out, traces)
    return stats


def stats_document(stats: TraceStats) -> dict:
    """What `scepsy aggregate --json` prints (and `out` holds as YAML)."""
    from scepsy.tracing.statistics.stats import stats_to_dict

    return stats_to_dict(stats)


def stats_view(stats: TraceStats) -> RenderableType:
    from scepsy.tracing.statistics.stats import stats_view as view

    return view(stats)


TRACE_FORMATS = ("jsonl", "parquet")  # what export_traces writes


def trace_files() -> str:
    """The trace files aggregate_traces reads (what `scepsy aggregate --help` lists)."""
    from scepsy.tracing.capture.traces import TRACE_FILES

    return TRACE_FILES


def export_traces(traces: Sequence[PathLike], out: PathLike, format: str = "jsonl", bodies: bool = True) -> int:
    """Write the recorded calls of `traces` to `out` as JSONL (one call a line) or Parquet; the
    number of calls written."""
    from scepsy.tracing.capture.traces import export_traces as export, load_traces

    check_choice(format, TRACE_FORMATS, "format", "format")
    check_output(out, traces)
    calls = load_traces(traces)
    with writing(out):
        return export(calls, out, format, bodies=bodies)


@dataclass(frozen=True)
class Recorded:
    """What a proxy run recorded (`scepsy proxy`, after Ctrl-C)."""

    store: Path
    written: int
    write_errors: int

    def line(self) -> str:
        failed = f" ({self.write_errors} failed to write)" if self.write_errors else ""
        return f"recorded {self.written} calls to {self.store}{failed}"


def proxy(
    upstreams: Mapping[str, str] | Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = 9000,
    store: PathLike = "traces.db",
    record_bodies: bool = True,
    timeout_s: float = 600.0,
    max_body_mib: float = 16.0,
    workflow_priority: bool = False,
    on_start: Callable[[str], None] | None = None,
    on_stop: Callable[[Recorded], None] | None = None,
) -> Recorded:
    """Run the tracing proxy in front of OpenAI-compatible engines until interrupted, recording
    every call to the SQLite `store`. `upstreams`: LLM name -> engine base URL (or NAME=URL items);
    `workflow_priority` tags every chat/completions call with its workflow request's start, for
    engines that schedule by priority (tracing/capture/proxy.py); `on_start(text)` says where it
    listens, `on_stop` what it recorded (also when serving fails)."""
    from scepsy.tracing.capture.proxy import ProxyConfig, parse_upstreams, serve
    from scepsy.tracing.capture.store import TraceStore

    check_finite(timeout_s, "timeout_s")
    check_finite(max_body_mib, "max_body_mib")
    routes_of = dict(upstreams) if isinstance(upstreams, Mapping) else parse_upstreams(upstreams)
    try:
        trace_store = TraceStore(store)
    except Exception as exc:  # noqa: BLE001 - sqlite errors become one line
        raise InputError(str(store), "store", f"cannot open the trace store ({exc})", "choose a writable `store` path",
                         argument=True) from None
    routes = ", ".join(f"{name}={url} (/{name}/v1/...)" for name, url in sorted(routes_of.items()))
    if on_start is not None:
        on_start(f"scepsy proxy on http://{host}:{port}: {routes}; recording to {store}")
    try:
        config = ProxyConfig(routes_of, store=trace_store, record_bodies=record_bodies, timeout_s=timeout_s,
                             max_body_bytes=int(max_body_mib * 2**20), workflow_priority=workflow_priority)
        serve(config, host=host, port=port)
    finally:
        trace_store.close()
        recorded = Recorded(Path(store), trace_store.written, trace_store.write_errors)
        if on_stop is not None:
            on_stop(recorded)
    return recorded


def emulator_config(model: str, gpu: str, tp: int = 1, fraction: float = 1.0, **options: Any) -> EmulatorConfig:
    """An emulated replica of a catalog `model` (or a config.json) on a catalog `gpu`, checked to run
    (tracing/emulation/emulator.py `emulator_config`: served_model_names, max_model_len, speedup,
    mean_output_tokens, prefix_caching, weights, engine_model, backend, database_version,
    personality)."""
    from scepsy.tracing.emulation.emulator import emulator_config as configure

    return configure(model, gpu, tp, fraction, **options)


def emulate(config: EmulatorConfig, *, host: str = "127.0.0.1", port: int = 8000,
            on_start: Callable[[str], None] | None = None) -> None:
    """Serve an OpenAI-compatible engine emulator whose timing follows the engine model, until
    interrupted (`scepsy emulate`); `on_start(text)` describes it."""
    from scepsy.tracing.emulation.emulator import serve

    if on_start is not None:
        on_start(f"scepsy emulate on http://{host}:{port}: {config.describe()}")
    serve(config, host=host, port=port)


def topology(node_name: str | None = None, gpu_type: str | None = None, *, replay: PathLike | None = None,
             record: PathLike | None = None, out: PathLike | None = None) -> NodeTopology:
    """This GPU node's GPUs, memory, UUIDs and NVLink domains from NVML (`scepsy topology`), or
    from NVML answers saved with `record` (`replay`); `out` writes the node's cluster-file entry."""
    import json

    from scepsy.models.output import write_text
    from scepsy.tracing.discovery.topology import RecordedNvml, discover, real_nvml
    from scepsy.tracing.discovery.topology import record as record_answers

    for path, field in ((out, "out"), (record, "record")):
        if path is not None:
            check_output(path, [replay], field)
    nvml = RecordedNvml.from_file(replay) if replay is not None else real_nvml()
    found = discover(nvml, node_name, gpu_type)
    if record is not None:
        write_text(record, json.dumps(record_answers(nvml), indent=2) + "\n", "record")
    if out is not None:
        write_text(out, found.to_yaml())
    return found


# ---------------------------------------------------------------------------------------------
# Kubernetes


@dataclass(frozen=True)
class Manifests:
    """The manifests written for a placed plan (`scepsy manifests`)."""

    out: Path
    files: tuple[Path, ...]
    replicas: int  # engine replicas
    engine: str
    gpu_sharing: str
    warnings: tuple[str, ...]  # engines pinned to GPUs the plan does not name (k8s/manifests.py)

    def document(self) -> dict:
        """What `scepsy manifests --json` prints."""
        return {"out": str(self.out), "files": [p.name for p in self.files]}

    def line(self) -> str:
        return (f"wrote {len(self.files)} files to {self.out} ({self.replicas} engine replicas, {self.engine}, "
                f"{self.gpu_sharing}); apply with: scepsy deploy {self.out}")


def manifests(
    plan: PathLike,
    out: PathLike,
    *,
    instance: PathLike | None = None,
    engine: str = "vllm",
    gpu_sharing: str = "hami",
    namespace: str = "scepsy",
    image: str | None = None,
    gateway_image: str | None = None,
    prometheus: bool = False,
    shm_gib: int = 16,
    gpu_memory_utilization: float = 0.9,
    kubernetes_version: str = "1.34",
    hf_token_secret: str = "hf-token",
    hf_cache_pvc: str | None = None,
    device_plugin_namespace: str = "nvidia-device-plugin",
    router: str = "sglang",
    gateway_name: str = "inference-gateway",
    gateway_namespace: str | None = None,
    gateway_provider: str = "istio",
    endpoint_picker: str = "llm-d-router",
    picker_replicas: int = 2,
    scheduling: str = "priority",
) -> Manifests:
    """Write the Kubernetes manifests that realise a placed plan (a plan JSON of `plan`) into the
    folder `out`: engines, GPU shares, gateways (docs/deploy.md); `instance` overrides the
    instance file the plan names. `router` "sglang" gives every LLM an SGLang model gateway;
    "inference-gateway" gives it an InferencePool, its endpoint picker and an HTTPRoute attached to
    the platform's Gateway `gateway_name` (in `gateway_namespace`, default `namespace`), with what
    the upstream chart adds for `gateway_provider` (istio, gke or none), the endpoint picker of
    `endpoint_picker` (llm-d-router v0.10.0, or the extension's inference-extension-v1.5.0) and
    `picker_replicas` leader-elected pickers per pool.
    `scheduling` "priority" runs the generating engines with priority scheduling, for calls tagged
    with their workflow request's start (`proxy(workflow_priority=True)`); "fcfs" leaves the
    engines' default."""
    from scepsy.k8s.manifests import ManifestSettings, emit, pinning_warnings, write
    from scepsy.k8s.plan_input import load_placed_plan

    settings = ManifestSettings(
        engine=engine, gpu_sharing=gpu_sharing, namespace=namespace, image=image,
        **({"gateway_image": gateway_image} if gateway_image else {}),
        gpu_memory_utilization=gpu_memory_utilization, shm_gib=shm_gib, prometheus=prometheus,
        hf_token_secret=hf_token_secret, hf_cache_pvc=hf_cache_pvc, kubernetes_version=kubernetes_version,
        device_plugin_namespace=device_plugin_namespace, router=router, gateway_name=gateway_name,
        gateway_namespace=gateway_namespace, gateway_provider=gateway_provider, endpoint_picker=endpoint_picker,
        picker_replicas=picker_replicas, scheduling=scheduling,
    )
    folder = check_output_dir(out, [plan, instance])
    placed = load_placed_plan(plan, None if instance is None else Path(instance))
    objects = emit(placed, settings)
    with writing(folder / "kustomization.yaml"):
        paths = write(objects, folder)
    return Manifests(folder, tuple(paths), len(placed.replicas), engine, gpu_sharing, tuple(pinning_warnings(placed, settings)))


@dataclass(frozen=True)
class Deployed:
    """What server-side apply did to each object (`scepsy deploy`)."""

    dry_run: str  # none | server
    results: tuple[ApplyResult, ...]

    def document(self) -> dict:
        rows = [{"kind": r.kind, "namespace": r.namespace, "name": r.name, "action": r.action} for r in self.results]
        return {"dry_run": self.dry_run, "objects": rows}

    def lines(self) -> list[str]:
        suffix = " (server dry run)" if self.dry_run == "server" else ""
        return [f"{r.ref} {r.action}{suffix}" for r in self.results]


def deploy(directory: PathLike, *, kubeconfig: PathLike | None = None, context: str | None = None,
           dry_run: str = "none") -> Deployed:
    """Apply a manifests folder (`manifests`) with server-side apply (field manager `scepsy`), in
    dependency order; `dry_run` "server" validates on the API server without persisting."""
    from scepsy.k8s.apply import DRY_RUN_MODES, KubeApplier, connect, load_manifests
    from scepsy.k8s.apply import deploy as apply_objects

    check_choice(dry_run, DRY_RUN_MODES, "dry_run", "mode")
    objects = load_manifests(Path(directory))
    client = connect(None if kubeconfig is None else Path(kubeconfig), context)
    return Deployed(dry_run, tuple(apply_objects(objects, KubeApplier(client), dry_run=dry_run == "server")))


@dataclass(frozen=True)
class Status:
    """Each scepsy replica's pod phase and readiness (`scepsy status`)."""

    namespace: str
    replicas: tuple[ReplicaStatus, ...]

    def document(self) -> dict:
        return {"namespace": self.namespace, "replicas": [r.__dict__ for r in self.replicas]}

    def view(self) -> RenderableType:
        from scepsy.k8s.apply import status_table

        return status_table(list(self.replicas), self.namespace)


def status(namespace: str = "scepsy", *, kubeconfig: PathLike | None = None, context: str | None = None) -> Status:
    """The pod phase and readiness of every replica scepsy deployed in `namespace`."""
    from scepsy.k8s.apply import connect, pod_statuses

    client = connect(None if kubeconfig is None else Path(kubeconfig), context)
    return Status(namespace, tuple(pod_statuses(client, namespace)))


# ---------------------------------------------------------------------------------------------
# Control


@dataclass(frozen=True)
class ControlSimulation:
    """The closed loop on the simulator (`scepsy control --simulate`): one run per system, and
    the plot written (docs/control.md)."""

    runs: tuple[SystemRun, ...]
    plot: Path | None = None

    def document(self) -> dict:
        """What `scepsy control --simulate --json` prints (control/report.py)."""
        from scepsy.control.report import control_document

        return control_document(self.runs)

    def view(self) -> RenderableType:
        from scepsy.control.report import control_table

        return control_table(self.runs)


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
    simulator from the plan for the first 5 minutes' rate (control/simulation.py `opening_plan`;
    `plan`, a plan JSON with its placement, sets the SLOs) on `arrivals` (JSONL {workflow,
    arrival_s}, an Azure-format CSV or azure:conv / azure:code, as `simulate --arrivals`; or
    timestamps per workflow),
    beside `baselines` (default: all of static, static-peak, k8s-hpa, saturation, oracle) on the
    same arrivals and GPUs. SLOs: each workflow's latency_slo_s, else twice the plan's predicted
    latency at the instance's rates. `plot` writes the timeline PNG; `progress` gets the systems
    done so far (fractional)."""
    from scepsy.control.policy import ControlSettings
    from scepsy.control.report import plot_runs
    from scepsy.control.simulation import SYSTEMS, ClosedLoopSettings, run_systems
    from scepsy.models.plan.document import deployable_plan, read_document

    check_finite(startup_s, "startup_s")
    check_finite(period_s, "period_s")
    if startup_s < 0:
        raise InputError(None, "startup_s", f"{startup_s:g} is negative", "give the seconds a replica takes to serve, >= 0")
    if period_s <= 0:
        raise InputError(None, "period_s", f"{period_s:g} is not > 0", "give the control period in seconds, e.g. 60")
    check_choice(predictor, ("constant", "ewma", "kalman"), "predictor", "predictor")
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
    settings = ClosedLoopSettings(ControlSettings(period_s=period_s, startup_s=startup_s, predictor=predictor), seed=seed)
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

    def document(self) -> dict:
        return {"periods": self.periods, "actions": dict(sorted(self.actions.items())), "log": self.log}


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
    from scepsy.control.gauges import DesiredGauges
    from scepsy.control.live import LiveLoop, LiveSettings
    from scepsy.control.policy import ControlSettings, make_context
    from scepsy.control.prometheus import PrometheusClient, PrometheusSettings
    from scepsy.k8s.apply import connect
    from scepsy.k8s.engines import ENGINES
    from scepsy.k8s.manifests import ManifestSettings, check_settings
    from scepsy.models.plan.document import deployable_plan, read_document

    check_choice(engine, ENGINES, "engine", "engine")
    check_finite(period_s, "period_s")
    check_finite(startup_s, "startup_s")
    if period_s <= 0:
        raise InputError(None, "period_s", f"{period_s:g} is not > 0", "give the control period in seconds, e.g. 60")
    if startup_s < 0:
        raise InputError(None, "startup_s", f"{startup_s:g} is negative", "give the seconds a replica takes to serve, >= 0")
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
    try:
        policy = ControlSettings(period_s=period_s, startup_s=startup_s, predictor=predictor)
    except ValueError as exc:
        raise InputError(None, "predictor", str(exc), "use constant, ewma or kalman") from None
    policy_context = make_context(loaded, policy, allocation=allocation)  # InputError where an SLO cannot be had
    log_path = check_output(log, [instance if not isinstance(instance, Instance) else None, plan], "log")
    cluster = KubeCluster(connect(None if kubeconfig is None else Path(kubeconfig), context), namespace)
    prometheus = PrometheusClient(PrometheusSettings(prometheus_url, selector=selector, engine=engine))
    gauges = DesiredGauges() if act == "gauges" else None
    if gauges is not None and gauges_port is not None:
        gauges.serve(gauges_port)
    try:
        with open(log_path, "a", encoding="utf-8") as stream:
            loop = LiveLoop(policy_context, cluster, prometheus, manifest_settings, live_settings, stream,
                            say or (lambda line: None), show or (lambda line: None), clock,
                            instance_file=loaded.source, gauges=gauges)
            loop.run(sleep, periods)
    except OSError as exc:
        raise InputError(str(log_path), "log", f"cannot write ({exc.strerror})", "give `log` a writable path") from None
    finally:
        prometheus.close()
    return ControlRun(loop.periods, dict(loop.actions), str(log_path))
