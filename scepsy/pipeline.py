"""The plan-and-place pipeline, above the planner and the placement.

`plan_and_place(instance, plan_settings, settings, current)` runs the allocation search with a
placer injected into its loop (placement.place.feasibility_placer: the heuristic, then the exact
count model; an allocation that cannot be placed is cut off and the allocation model solved again,
planner/allocation/search.py) and places the chosen allocation with `settings`; the plan carries the
placement, how it was found and the fragmentation report.
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

from scepsy.models.instance.allocation import Placement
from scepsy.models.instance.instance import Instance
from scepsy.models.plan.fragmentation import fragmentation_report
from scepsy.models.plan.plan import Plan
from scepsy.placement.objective import evaluate
from scepsy.placement.place import PlacementSettings, feasibility_placer, place
from scepsy.planner.allocation.planning import make_plan
from scepsy.planner.allocation.search import PlanSettings


def plan_and_place(
    instance: Instance,
    plan_settings: PlanSettings = PlanSettings(),
    settings: PlacementSettings = PlacementSettings(),
    current: Placement | None = None,
) -> Plan:
    """Plan the allocation (placement in the loop), then place it with `settings` (module docstring).

    GPU objectives (min_gpus, min_cost) count the GPUs of the planner's fewest-GPU placement; a
    re-placement that would use more (costlier) GPUs is not taken, so the plan keeps its value.
    min_units counts share units, which every placement of the allocation holds alike."""
    planning_ends = None if plan_settings.started_s is None else plan_settings.started_s + plan_settings.time_limit_s
    plan = make_plan(instance, plan_settings, feasibility_placer(settings, planning_ends))
    result = place(instance.cluster, plan.allocation, settings, current, hint=plan.placement, deadline=_ends_by(plan_settings, settings))
    if instance.objective in ("min_gpus", "min_cost") and current is None:
        if _gpu_cost(instance, result.placement) > _gpu_cost(instance, plan.placement) + 1e-9:
            info = replace(
                result.info,
                objective=evaluate(instance.cluster, plan.allocation, plan.placement, current),
                notes=result.info.notes + ("kept the planner's placement on the fewest GPUs",),
            )
            return replace(plan, placement_info=info, fragmentation=fragmentation_report(instance.cluster, plan.placement))
    return replace(plan, placement=result.placement, placement_info=result.info, fragmentation=result.fragmentation)


def _ends_by(plan_settings: PlanSettings, settings: PlacementSettings) -> float | None:
    """When the whole command must end (perf_counter seconds): both time limits after it started.
    The placement keeps its own limit from its start; this caps it when planning ran late."""
    if plan_settings.started_s is None:
        return None
    return plan_settings.started_s + plan_settings.time_limit_s + settings.time_limit_s


def _gpu_cost(instance: Instance, placement: Placement) -> float:
    """GPUs hosting a shard, weighted by price for min_cost (1 each for min_gpus)."""
    types = {n.name: n.gpu_type for n in instance.cluster.nodes}
    busy = placement.busy_gpus()
    if instance.objective == "min_cost":
        return sum(cast(float, instance.cluster.gpu_types[types[node]].cost_per_hour) for node, _ in busy)  # priced: checked by the instance
    return float(len(busy))
