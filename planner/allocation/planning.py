"""The allocation search's entry point: `make_plan` dispatches on the objective (max_throughput
bisects the load factor, planner/allocation/loadfactor.py; the others solve at the instance's load,
planner/allocation/search.py). The placer is injected (scepsy/pipeline.py passes placement's)."""

from __future__ import annotations

import math
import time
from dataclasses import replace

from scepsy.models.instance.instance import Instance
from scepsy.models.plan.plan import Plan
from scepsy.placement.feasibility.placeability import Placer, check_placement
from scepsy.planner.allocation.loadfactor import plan_max_throughput
from scepsy.planner.allocation.objective import build_objective
from scepsy.planner.allocation.search import PlanSettings, assemble_plan, check_backend, solo_references, solve_at_load


def make_plan(instance: Instance, settings: PlanSettings = PlanSettings(), placer: Placer = check_placement) -> Plan:
    """Search the allocation with the settings' backend and return it placed and predicted.

    Raises InfeasibleError (binding reason), SolveTimeoutError or InputError (backend that cannot
    handle the objective); never changes `instance`.
    """
    check_backend(instance, settings)
    if instance.objective == "max_throughput":
        return plan_max_throughput(instance, settings, placer)
    start = time.perf_counter() if settings.started_s is None else settings.started_s
    deadline = start + settings.time_limit_s
    refs, unproven = solo_references(instance, settings, placer)
    objective = build_objective(instance, refs)
    outcome = solve_at_load(instance, objective, settings, placer, deadline)
    if unproven:
        # the references are above the solo optima, so the plan's ratios are understated by an
        # unknown amount: not proven optimal, and no gap is claimed (bound unknown)
        outcome = replace(outcome, status="feasible", bound=math.nan, notes=outcome.notes + unproven)
    return assemble_plan(instance, objective, outcome, settings, start)
