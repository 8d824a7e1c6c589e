"""Planning and placing (`scepsy plan`, `place`, `predict`): an instance and an allocation as files
or loaded objects, the plan and its documents."""

from __future__ import annotations

import time
from pathlib import Path

from scepsy.models.arguments import check_choice, check_finite
from scepsy.models.errors import InputError
from scepsy.models.instance.allocation import Allocation, Placement
from scepsy.models.instance.instance import Instance, load_instance
from scepsy.models.performance.alp import AllocationError, Prediction
from scepsy.models.performance.alp import predict as predict_allocation
from scepsy.models.plan import document
from scepsy.models.plan.document import read_allocation, read_current
from scepsy.models.plan.plan import Plan
from scepsy.pipeline import plan_and_place
from scepsy.placement.place import METHODS, PlacementResult, PlacementSettings
from scepsy.placement.place import place as place_allocation
from scepsy.planner.allocation.objective import OBJECTIVES, WELFARES
from scepsy.planner.allocation.planning import make_plan
from scepsy.planner.allocation.search import PlanSettings

InstanceLike = Instance | str | Path
AllocationLike = Allocation | str | Path
PlacementLike = Placement | str | Path
PathLike = str | Path


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
