"""Objective max_throughput: the largest load factor s such that every workflow at s * arrival_rate
has a placeable plan that meets its latency_slo_s (where given).

Feasibility at a load is one solve of the allocation model with the SLOs as constraints and only
the share-units stage (cheap). s is bisected between 0 and the capacity bound
s_max = min_m (most requests/s the cluster can serve for LLM m alone) / Lambda_m until the bracket
is narrower than `load_tolerance` (relative). Assumes feasibility is monotone in s: per-replica
rates grow with s and profile latencies do not fall with the rate (true of measured profiles up to
noise). The plan returned is the latency-optimal one at the largest feasible s, with the SLOs as
constraints; `objective_value` and `load_factor` are s, `bound` the smallest load found infeasible
(or s_max).
"""

from __future__ import annotations

import time
from dataclasses import replace

from scepsy.models.errors import InfeasibleError
from scepsy.models.instance.instance import Instance
from scepsy.models.plan.plan import Plan

from scepsy.planner.allocation.diagnose import explain_infeasible
from scepsy.planner.allocation.objective import Objective, ShareUnits, build_objective
from scepsy.planner.allocation.options import all_options, max_servable
from scepsy.planner.allocation.search import (
    Outcome, PlanSettings, Placer, SolveTimeoutError, assemble_plan, references, solve_at_load,
)


def capacity_bound(instance: Instance, settings: PlanSettings) -> float:
    """s_max: no load above it can be served, whatever the latency."""
    bounds = []
    for llm in instance.llms:
        rate, _ = max_servable(instance, llm, settings.space)
        bounds.append(rate / instance.offered_rate_rps(llm.name))
    return min(bounds)


def _feasibility(instance: Instance) -> Objective:
    """The SLOs as constraints and only the share-units stage. The latency stages are dropped, so
    the egalitarian references they would need (solo optima) are not computed: placeholders."""
    placeholders = {w.name: 1.0 for w in instance.workflows}
    objective = build_objective(instance, placeholders, kind="max_throughput")
    return replace(objective, stages=(ShareUnits(),))


def plan_max_throughput(instance: Instance, settings: PlanSettings, placer: Placer) -> Plan:
    start = time.perf_counter() if settings.started_s is None else settings.started_s
    deadline = start + settings.time_limit_s
    unproven = False

    def feasible(load: float) -> Outcome | None:
        nonlocal unproven
        scaled = instance.scaled(load)
        try:
            return solve_at_load(scaled, _feasibility(scaled), settings, placer, deadline)
        except InfeasibleError:
            return None
        except SolveTimeoutError:
            unproven = True
            return None

    high = capacity_bound(instance, settings)
    if high <= 0:
        options = all_options(instance, settings.space)
        raise InfeasibleError(explain_infeasible(instance, options, settings.space))
    low, found = 0.0, feasible(high)
    if found is not None:
        low = high
    while found is None or high - low > settings.load_tolerance * high:
        if time.perf_counter() >= deadline or (found is None and high < 1e-6):
            break
        middle = (low + high) / 2 if found is not None else high / 2
        outcome = feasible(middle)
        if outcome is not None:
            low, found = middle, outcome
        else:
            high = middle
    if found is None:
        tiny = instance.scaled(max(high, 1e-6))
        objective = _feasibility(tiny)
        options = all_options(tiny, settings.space)
        raise InfeasibleError("no load is feasible: " + explain_infeasible(tiny, options, settings.space, objective))

    # the latency-optimal plan at the largest feasible load, with the SLOs as constraints
    at = instance.scaled(low)
    remaining = replace(settings, time_limit_s=max(deadline - time.perf_counter(), 1.0))
    objective = build_objective(at, references(at, remaining, placer), kind="max_throughput")
    try:
        outcome = solve_at_load(at, objective, remaining, placer, time.perf_counter() + remaining.time_limit_s)
    except (InfeasibleError, SolveTimeoutError):
        outcome = found  # the feasibility plan itself: placeable and within the SLOs
    converged = high - low <= settings.load_tolerance * high * (1 + 1e-9)
    status = "optimal" if converged and not unproven else "feasible"
    plan = assemble_plan(
        at, objective if outcome is not found else _feasibility(at), outcome, settings, start,
        value=low, bound=high, extras=(("load_factor", low),), status=status,
    )
    return replace(plan, objective="max_throughput", instance=instance.source)

