"""The public Python API: what the `scepsy` commands do, callable from notebooks and scripts.

    from scepsy import plan, place, predict, simulate
    result = plan("instances/beam-4xa6000.yaml", objective="min_gpus")
    print(result.to_json())

Instances and allocations may be given as files (paths) or as loaded objects; every function
raises scepsy's typed errors (models/errors.py) with the line that says how to fix the input.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from scepsy.models.errors import InputError
from scepsy.models.instance.allocation import Allocation, Placement
from scepsy.models.instance.instance import Instance, load_instance
from scepsy.models.performance.alp import AllocationError, Prediction
from scepsy.models.performance.alp import predict as predict_allocation
from scepsy.models.plan.document import instance_allocation, load_placement
from scepsy.models.plan.plan import Plan
from scepsy.models.simulation.simulator import SimulationResult, SimulationSettings
from scepsy.models.simulation.simulator import simulate as simulate_allocation
from scepsy.pipeline import plan_and_place
from scepsy.placement.place import METHODS, PlacementResult, PlacementSettings
from scepsy.placement.place import place as place_allocation
from scepsy.planner.allocation.objective import OBJECTIVES, WELFARES
from scepsy.planner.allocation.planning import make_plan
from scepsy.planner.allocation.search import PlanSettings

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
    return allocation if isinstance(allocation, Allocation) else instance_allocation(allocation, instance)


def placement_settings(method: str = "cpsat", time_limit_s: float = 10.0, workers: int = 1) -> PlacementSettings:
    if method not in METHODS:
        raise InputError(None, "--placement", f"unknown placement method {method!r}", f"use one of: {', '.join(METHODS)}")
    return PlacementSettings(method=method, time_limit_s=time_limit_s, workers=workers)


def _current(instance: Instance, current: PlacementLike | None) -> Placement | None:
    if current is None or isinstance(current, Placement):
        return current
    return load_placement(current, instance.cluster.fractions_per_gpu, instance.cluster)


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


def predict(instance: InstanceLike, allocation: AllocationLike) -> Prediction:
    """The Aggregate LLM Pipeline's prediction for a given allocation (`scepsy predict`)."""
    loaded = load(instance)
    chosen = allocation_of(loaded, allocation)
    try:
        return predict_allocation(loaded, chosen)
    except AllocationError as exc:
        source = None if isinstance(allocation, Allocation) else str(allocation)
        raise InputError(source, "llms", str(exc), "pick a profiled configuration that fits in memory") from None


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
                workflow["predicted_latency_s"] = float(f"{latency:.6g}") if math.isfinite(latency) else None
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
