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
from scepsy.planner.allocation.search import (
    Outcome, PlanSettings, References, assemble_plan, check_backend, solo_references, solve_at_load,
)


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
    refs = solo_references(instance, settings, placer)
    objective = build_objective(instance, refs.values)
    outcome = solve_at_load(instance, objective, settings, placer, deadline)
    if refs.notes:
        outcome = _with_unproven_references(outcome, refs)
    return assemble_plan(instance, objective, outcome, settings, start)


def _with_unproven_references(outcome: Outcome, refs: References) -> Outcome:
    """References above the solo optima by up to a factor k understate every ratio by at most k:
    the true optimum is at least the solver's bound (smaller ratios everywhere), and the plan's
    true value at most k times its value, so bound / k keeps the gap a true one (none if k is
    unknown), and the plan is not proven optimal."""
    bound = outcome.bound / refs.overestimate if math.isfinite(refs.overestimate) else math.nan
    return replace(outcome, status="feasible", bound=bound, notes=outcome.notes + refs.notes)
