"""Plan an instance: pick a backend, solve, attach a placement and the prediction.

`make_plan` is the entry point. The allocation is searched by one backend (`cpsat`, `enumerate`,
`bruteforce`); whichever it is, a plan is returned only with a placement that the placeability check
(or the placer passed in) produced. For the CP-SAT backend, allocations that cannot be placed are cut
off and the model is solved again.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from scepsy.models.allocation import Allocation, LlmAllocation
from scepsy.models.alp import predict
from scepsy.models.errors import InfeasibleError, ScepsyError
from scepsy.models.instance import Cluster, Instance
from scepsy.models.plan import Plan, SolverInfo

from . import cpsat
from .bruteforce import solve_bruteforce
from .diagnose import explain_infeasible
from .enumerate import solve_enumerate
from .objective import LatencyObjective
from .options import Option, SearchSpace, all_options
from .placeability import PlacementCheck, check_placement

BACKENDS = ("cpsat", "enumerate", "bruteforce")
DEFAULT_TIME_LIMIT_S = 60.0
WARM_START_MAX_UNITS = 400  # enumerate as a CP-SAT hint only where it is quick

Placer = Callable[[Cluster, Allocation], PlacementCheck]


class SolveTimeoutError(ScepsyError):
    """The time limit passed before any placeable plan was found (exit code 3)."""

    exit_code = 3


@dataclass(frozen=True)
class PlanSettings:
    backend: str = "cpsat"
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    workers: int = 1
    space: SearchSpace = field(default_factory=SearchSpace)
    warm_start: bool = False  # enumerate as the first hint (the cheapest placeable plan always is)
    # exact placement counts inside the allocation model up to this many (GPU, shape) pairs;
    # beyond it, valid inequalities and lazy placement cuts
    placement_counts_limit: int = 1000


@dataclass(frozen=True)
class _Outcome:
    allocation: Allocation
    placement_check: PlacementCheck
    status: str
    values: tuple[float, ...]
    bound: float
    iterations: int = 1
    cuts: int = 0
    notes: tuple[str, ...] = ()


def references(instance: Instance, settings: PlanSettings, placer: Placer) -> dict[str, float] | None:
    """ref_w: latency_slo_s, else the workflow's own optimum alone on the cluster.

    The optimum comes from an exact backend whatever the backend asked for, so that every backend
    optimises the same objective.
    """
    if len(instance.workflows) < 2:
        return None
    backend = settings.backend if settings.backend in ("cpsat", "bruteforce") else "cpsat"
    # each solo solve gets a share of the time limit, leaving the largest share to the joint solve
    exact = replace(settings, backend=backend, time_limit_s=settings.time_limit_s / (len(instance.workflows) + 1))
    refs = {}
    for workflow in instance.workflows:
        if workflow.latency_slo_s is not None:
            refs[workflow.name] = workflow.latency_slo_s
        else:
            alone = make_plan(instance.only_workflow(workflow.name), exact, placer)
            refs[workflow.name] = alone.prediction.workflow(workflow.name).latency_s
    return refs


@dataclass
class _CutLoop:
    """Solves one stage, cutting off unplaceable allocations until one places or time runs out."""

    am: cpsat.AllocationModel
    cluster: Cluster
    placer: Placer
    workers: int
    deadline: float
    solves: int = 0
    unproven: bool = False

    def run(self, stage: cpsat.StageExpr, hint) -> tuple[cpsat.StageResult, Allocation | None, PlacementCheck | None]:
        while True:
            self.solves += 1
            result, solver = cpsat.solve_stage(self.am, stage, self.deadline - time.perf_counter(), self.workers, hint)
            if result.value is None:
                return result, None, None
            allocation = self.am.decode(solver)
            check = self.placer(self.cluster, allocation)
            if check.placeable:
                return result, allocation, check
            self.unproven |= not check.proven
            cpsat.add_placement_cut(self.am, allocation)
            if time.perf_counter() >= self.deadline:
                return result, None, None


def _solve_cpsat(
    instance: Instance,
    options: dict[str, list[Option]],
    objective: LatencyObjective,
    settings: PlanSettings,
    placer: Placer,
    deadline: float,
) -> _Outcome | None:
    counts = cpsat.counts_model_size(instance.cluster, options) <= settings.placement_counts_limit
    am = cpsat.build_allocation_model(instance.cluster, options, objective, placement_counts=counts)
    fallback = _cheapest_placeable(instance, options, placer)
    warm = fallback
    if settings.warm_start and _small(instance):
        enumerated = solve_enumerate(instance, objective, settings.space, placer)
        if enumerated is not None and _hintable(am, enumerated.allocation):
            warm = (enumerated.allocation, PlacementCheck(enumerated.placement, True))
    hint = cpsat.hint_for(am, warm[0]) if warm is not None else None
    loop = _CutLoop(am, instance.cluster, placer, settings.workers, deadline)
    best: tuple[Allocation, PlacementCheck] | None = None
    first: cpsat.StageResult | None = None
    for index, stage in enumerate(am.stages):
        result, allocation, check = loop.run(stage, hint)
        if allocation is None:
            if index == 0 and result.status == "infeasible":
                return None
            break  # time limit: keep the best plan of the earlier stages
        best = (allocation, check)
        first = first or result
        if result.status != "optimal":
            break
        cpsat.fix_stage(am, stage, result.value)
        hint = cpsat.hint_for(am, allocation)
    notes: tuple[str, ...] = ()
    if best is None and warm is not None:  # time limit before CP-SAT's first solution: the warm start
        values = objective.values({m: _latency_of(options, warm[0], m) for m in options})
        notes = ("time limit reached before the solver's first plan; returning the warm start",)
        return _Outcome(warm[0], warm[1], "feasible", values, math.nan, loop.solves, am.cuts, notes)
    if best is None:
        raise SolveTimeoutError(
            f"no placeable plan found within the time limit of {settings.time_limit_s:g} s; raise --time-limit-s"
        )
    if loop.unproven:
        notes = ("a placement check hit its time limit and was treated as unplaceable",)
    status = "optimal" if first.status == "optimal" and not loop.unproven else "feasible"
    values = objective.values({m: _latency_of(options, best[0], m) for m in options})
    bound = first.bound * am.stages[0].unit
    return _Outcome(best[0], best[1], status, values, bound, loop.solves, am.cuts, notes)


def _latency_of(options: dict[str, list[Option]], allocation: Allocation, llm: str) -> float:
    c = allocation.of(llm)
    return next(
        o.latency_s for o in options[llm] if (o.gpu_type, o.tp, o.share, o.replicas) == (c.gpu_type, c.tp, c.share, c.replicas)
    )


def _cheapest_placeable(instance: Instance, options: dict[str, list[Option]], placer: Placer):
    """Each LLM's option with the fewest GPU units (then least latency), if that places: a plan to
    fall back on and a first hint for the solver."""
    cheapest = {m: min(opts, key=lambda o: (o.units, o.latency_s)) for m, opts in options.items()}
    allocation = Allocation(
        instance.cluster.fractions_per_gpu,
        tuple(LlmAllocation(o.llm, o.gpu_type, o.tp, o.share, o.replicas) for o in cheapest.values()),
    )
    check = placer(instance.cluster, allocation)
    return (allocation, check) if check.placeable else None


def _small(instance: Instance) -> bool:
    total = sum(instance.cluster.free_units(n.name, g) for n in instance.cluster.nodes for g in range(n.gpus))
    return total <= WARM_START_MAX_UNITS and len(instance.cluster.used_gpu_types()) == 1


def _hintable(am: cpsat.AllocationModel, allocation: Allocation) -> bool:
    """A warm start is usable only if each LLM's configuration survived dominance pruning."""
    return all(
        any((o.gpu_type, o.tp, o.share, o.replicas) == (c.gpu_type, c.tp, c.share, c.replicas) for o in am.options[c.llm])
        for c in allocation.llms
    )


def _solve(instance, options, objective, settings, placer, deadline) -> _Outcome | None:
    if settings.backend == "cpsat":
        return _solve_cpsat(instance, options, objective, settings, placer, deadline)
    if settings.backend == "enumerate":
        found = solve_enumerate(instance, objective, settings.space, placer)
        if found is None:
            return None
        notes = (f"{found.mappings} fraction mappings enumerated",)
        return _Outcome(found.allocation, PlacementCheck(found.placement, True), "feasible", found.values, math.nan, notes=notes)
    if settings.backend == "bruteforce":
        found = solve_bruteforce(instance, options, objective, placer)
        if found is None:
            return None
        notes = (f"{found.combinations} combinations, {found.placement_checks} placement checks",)
        return _Outcome(
            found.allocation, PlacementCheck(found.placement, True), "optimal", found.values, found.values[0], notes=notes
        )
    raise ValueError(f"unknown backend {settings.backend!r}; use one of {', '.join(BACKENDS)}")


def make_plan(instance: Instance, settings: PlanSettings = PlanSettings(), placer: Placer = check_placement) -> Plan:
    """Search the allocation with the settings' backend and return it placed and predicted.

    Raises InfeasibleError (binding reason) or SolveTimeoutError; never changes `instance`.
    """
    start = time.perf_counter()
    deadline = start + settings.time_limit_s
    refs = references(instance, settings, placer)
    objective = LatencyObjective.for_instance(instance, refs)
    options = all_options(instance, settings.space, prune=settings.backend != "bruteforce")
    outcome = None
    if all(options.values()):
        outcome = _solve(instance, options, objective, settings, placer, deadline)
    if outcome is None:
        raise InfeasibleError(explain_infeasible(instance, options, settings.space))
    value = outcome.values[0]
    # a proven optimum of the integer-scaled model is within 1e-5 of the true one (planner/cpsat.py)
    bound = value if outcome.status == "optimal" else (min(outcome.bound, value) if math.isfinite(outcome.bound) else math.nan)
    gap = (value - bound) / value if math.isfinite(bound) and value > 0 else math.nan
    prediction = predict(instance, outcome.allocation)
    extras = (("mean_latency_s", outcome.values[1]),) if objective.egalitarian else ()
    return Plan(
        status=outcome.status,
        objective=instance.objective,
        objective_value=value,
        bound=bound,
        gap=max(gap, 0.0) if math.isfinite(gap) else gap,
        solver=SolverInfo(
            backend=settings.backend,
            wall_time_s=time.perf_counter() - start,
            iterations=outcome.iterations,
            cuts=outcome.cuts,
            notes=outcome.notes,
        ),
        allocation=outcome.allocation,
        prediction=prediction,
        placement=outcome.placement_check.placement,
        extras=extras,
        instance=instance.source,
    )
