"""Placement as a step of planning: place an allocation, and plan with placement in the loop.

`place(cluster, allocation, settings, current)` places one allocation with the chosen method:
* `heuristic`: the paper's heuristic (placement/heuristic.py). If it gets stuck on an allocation
  that the exact count model can place, that placement is used (noted), so a placeable allocation
  is never refused.
* `cpsat` (default): the exact model (placement/cpsat.py), hinted with the heuristic's placement,
  lexicographic objective, `time_limit_s` for all stages together; status `optimal` when every
  stage is proven, else `feasible` with the gap of the first stage not proven. The result is never
  worse than the heuristic's (if the solver's best is, the heuristic's placement is returned).
Every placement returned has passed the placement validator (models/instance/placement_check.py). An allocation that
cannot be placed raises PlacementInfeasibleError (exit code 3) with the binding reason
(placement/diagnose.py).

`feasibility_placer(settings)` is the placer the allocation search gets injected (scepsy/pipeline.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from scepsy.models.instance.allocation import Allocation, Placement
from scepsy.models.errors import InfeasibleError, TimeLimitError
from scepsy.models.plan.fragmentation import GpuTypeFragmentation, fragmentation_report
from scepsy.models.instance.instance import Cluster
from scepsy.models.plan.plan import PlacementInfo
from scepsy.models.instance.placement_check import validate_placement
from scepsy.placement.feasibility.placeability import Placer, PlacementCheck, exact_placement

from scepsy.placement.cpsat import CpsatOutcome, ModelTooLargeError, build_placement_model, solve_placement
from scepsy.placement.diagnose import explain_unplaceable, necessary_condition_violated
from scepsy.placement.heuristic import heuristic_placement
from scepsy.placement.objective import evaluate

METHODS = ("cpsat", "heuristic")
DEFAULT_TIME_LIMIT_S = 10.0
MIN_CHECK_S = 0.01  # the count model's time past the planning deadline: undecided, the search then stops


@dataclass(frozen=True)
class PlacementSettings:
    method: str = "cpsat"
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    workers: int = 1
    # CP-SAT parameters of every placement solve (the stages and each domain's polish); a
    # deterministic limit, ("max_deterministic_time", s), stops each solve at the same point on any
    # machine, however loaded (then the polish is not cut by its wall-clock limit per domain either)
    solver_parameters: tuple[tuple[str, int | float], ...] = ()


class PlacementInfeasibleError(InfeasibleError):
    """The allocation cannot be placed (or the time limit passed undecided); exit code 3."""


@dataclass(frozen=True)
class PlacementResult:
    placement: Placement
    info: PlacementInfo
    fragmentation: tuple[GpuTypeFragmentation, ...]


def _unplaceable(cluster: Cluster, allocation: Allocation) -> PlacementInfeasibleError:
    return PlacementInfeasibleError(f"the allocation cannot be placed: {explain_unplaceable(cluster, allocation)}")


def _undecided(settings: PlacementSettings) -> PlacementInfeasibleError:
    return PlacementInfeasibleError(
        f"no placement found within the placement time limit of {settings.time_limit_s:g} s and none proven "
        "impossible; raise `placement_time_limit_s`"
    )


def _gap(outcome: CpsatOutcome) -> tuple[float | None, str | None]:
    """Relative gap of the first stage not proven optimal: |bound - value| / max(|value|, 1), relative
    to the placement returned as a MIP solver reports it."""
    for stage in outcome.stages:
        if stage.status == "optimal":
            continue
        if stage.value is None or stage.bound is None:
            return None, stage.name
        return abs(stage.bound - stage.value) / max(abs(stage.value), 1), stage.name
    return None, None


def _heuristic_method(cluster, allocation, settings, heuristic, hint, notes, deadline) -> tuple[Placement, str]:
    if heuristic.placement is not None:
        return heuristic.placement, "heuristic"
    if hint is not None:
        notes.append("placed by the planner's exact placement check instead")
        return hint, "feasible"
    check = exact_placement(cluster, allocation, max(deadline - time.perf_counter(), MIN_CHECK_S))
    if check.placement is None:
        raise _unplaceable(cluster, allocation) if check.proven else _undecided(settings)
    notes.append("placed by the exact count model instead")
    return check.placement, "feasible"


def _cpsat_method(cluster, allocation, settings, current, heuristic, hint, notes, deadline):
    try:
        model = build_placement_model(cluster, allocation, current, deadline)
    except ModelTooLargeError:
        seed = heuristic.placement if heuristic.placement is not None else hint
        if seed is None:
            raise TimeLimitError(
                f"the placement model of {cluster.gpu_count()} GPUs did not finish building within the placement time "
                f"limit of {settings.time_limit_s:g} s and the heuristic found no placement; raise `placement_time_limit_s`"
            ) from None
        notes.append("the exact model did not finish building within the time limit; kept the heuristic's placement")
        return seed, "heuristic", (), None, None
    seed = heuristic.placement if heuristic.placement is not None else hint
    outcome = solve_placement(model, settings.time_limit_s, settings.workers, seed, deadline, current,
                              parameters=settings.solver_parameters)
    if outcome.status == "infeasible":
        raise _unplaceable(cluster, allocation)
    bounds = tuple((s.name, s.bound) for s in outcome.stages if s.bound is not None)
    gap, gap_stage = _gap(outcome)
    status = "optimal" if outcome.status == "optimal" else "feasible"
    if outcome.placement is None:  # no start and no solution in time
        raise _undecided(settings)
    if any(stage.status == "unknown" for stage in outcome.stages):
        notes.append("a stage hit the time limit before the solver's first solution; kept the best placement so far")
    return outcome.placement, status, bounds, gap, gap_stage  # the pool's best: never worse than the seed


def place(
    cluster: Cluster,
    allocation: Allocation,
    settings: PlacementSettings = PlacementSettings(),
    current: Placement | None = None,
    hint: Placement | None = None,
    deadline: float | None = None,
) -> PlacementResult:
    """Place `allocation` on `cluster` (module docstring). `hint`: a valid placement to start from
    when the heuristic gets stuck (the planner's). The time limit counts from this call, and ends
    by `deadline` (perf_counter seconds) when that is earlier. Never changes its inputs."""
    if settings.method not in METHODS:
        raise ValueError(f"unknown placement method {settings.method!r}; use one of {', '.join(METHODS)}")
    start = time.perf_counter()
    deadline = start + settings.time_limit_s if deadline is None else min(deadline, start + settings.time_limit_s)
    violated = necessary_condition_violated(cluster, allocation)
    if violated is not None:  # a proof by itself, before any search
        raise PlacementInfeasibleError(f"the allocation cannot be placed: {violated}")
    notes: list[str] = []
    heuristic = heuristic_placement(cluster, allocation, current)
    if heuristic.placement is None:
        notes.append(f"the heuristic got stuck: {heuristic.stuck}")
    bounds: tuple[tuple[str, int], ...] = ()
    gap = gap_stage = None
    if settings.method == "heuristic":
        placement, status = _heuristic_method(cluster, allocation, settings, heuristic, hint, notes, deadline)
    else:
        placement, status, bounds, gap, gap_stage = _cpsat_method(
            cluster, allocation, settings, current, heuristic, hint, notes, deadline
        )
    problems = validate_placement(cluster, allocation, placement)
    if problems:  # cannot happen; never hand out an invalid placement
        raise RuntimeError(f"internal error: invalid placement ({'; '.join(problems[:3])})")
    info = PlacementInfo(
        method=settings.method,
        status=status,
        objective=evaluate(cluster, allocation, placement, current),
        wall_time_s=time.perf_counter() - start,
        bounds=bounds,
        gap=gap,
        gap_stage=gap_stage,
        notes=tuple(notes),
    )
    return PlacementResult(placement, info, fragmentation_report(cluster, placement))


def feasibility_placer(settings: PlacementSettings = PlacementSettings(), deadline: float | None = None) -> Placer:
    """The placer of the allocation search's cut loop: the heuristic, then the exact count model
    (so an allocation is cut off only when it is proven unplaceable, or undecided in time). The
    count model gets the placement time limit, and no more than is left before `deadline` (the
    planning deadline, perf_counter seconds)."""

    def placer(cluster: Cluster, allocation: Allocation) -> PlacementCheck:
        result = heuristic_placement(cluster, allocation)
        if result.placement is not None:
            return PlacementCheck(result.placement, True)
        limit_s = settings.time_limit_s
        if deadline is not None:
            limit_s = min(limit_s, max(deadline - time.perf_counter(), MIN_CHECK_S))
        return exact_placement(cluster, allocation, limit_s)

    return placer
