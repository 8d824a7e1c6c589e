"""Plan an instance: pick a backend, solve, attach a placement and the prediction.

`make_plan` is the entry point. The allocation is searched by one backend (`cpsat`, `milp`,
`enumerate`, `bruteforce`); whichever it is, a plan is returned only with a placement that the
placeability check (or the placer passed in) produced. For the CP-SAT and MILP backends,
allocations that cannot be placed are cut off and the model is solved again.

Objectives (planner/allocation/objective.py): `min_latency`, `min_gpus`, `min_cost` and `min_units` are
solved at the instance's arrival rates; `max_throughput` bisects the load factor s (planner/allocation/loadfactor.py) and
returns the latency-optimal plan at the largest feasible s.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable

from scepsy.models.instance.allocation import Allocation
from scepsy.models.performance.alp import predict
from scepsy.models.errors import InfeasibleError, InputError, TimeLimitError
from scepsy.models.instance.instance import Cluster, Instance
from scepsy.models.plan.plan import Plan, SolverInfo

from scepsy.planner.allocation import cpsat, milp
from scepsy.planner.allocation.bruteforce import solve_bruteforce
from scepsy.planner.allocation.diagnose import explain_infeasible
from scepsy.planner.allocation.enumerate import solve_enumerate
from scepsy.planner.allocation.formulation import supported_options
from scepsy.planner.allocation.objective import (
    GpuCount, LatencySum, MaxLatencySum, Objective, Usage, build_objective, latency_rows, needs_references,
)
from scepsy.planner.allocation.options import Option, SearchSpace, all_options, configuration, llm_options, options_allocation
from scepsy.placement.feasibility.packing import domain_kinds
from scepsy.placement.feasibility.placeability import Placer, PlacementCheck, fewest_gpus_placement, gpus_by_type

BACKENDS = ("cpsat", "milp", "enumerate", "bruteforce")
EXACT_BACKENDS = ("cpsat", "milp", "bruteforce")
DEFAULT_TIME_LIMIT_S = 60.0
WARM_START_MAX_UNITS = 400  # enumerate as a CP-SAT hint only where it is quick
# Large instances (many thousands of options, e.g. 1024 GPUs): options whose latency is within
# AUTO_EPSILON of a cheaper kept option are dropped (the bound is lowered to match), and a coarse
# model (COARSE_EPSILON) is solved first to hint the full one.
AUTO_EPSILON_OPTIONS = 20_000
AUTO_EPSILON = 1e-3
COARSE_OPTIONS = 30_000
COARSE_EPSILON = 1e-2
COARSE_TIME_SHARE = 0.4
REFERENCE_THREADS = 2



class SolveTimeoutError(TimeLimitError):
    """The time limit passed before any placeable plan was found (exit code 3)."""


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
    # more CP-SAT parameters for the allocation stages, (name, value) pairs (none: its defaults).
    # The optimum does not depend on them; what-if grids turn off the LP relaxation and symmetry
    # detection, faster on their lazy-cut models (planner/studies/amortize.py)
    # (a deterministic limit, ("max_deterministic_time", s), stops at the same point on any machine)
    stage_parameters: tuple[tuple[str, int | float], ...] = ()
    # latency objectives: drop the options that no allocation as good as the warm start uses
    # (_within_warm_start) before the model is built; what-if grids set it, where the warm start is
    # a neighbouring rate's optimum and most options are far slower than it
    prune_to_warm_start: bool = False
    load_tolerance: float = 1e-3  # max_throughput: relative width of the final bisection bracket
    # option pruning within a latency factor 1/(1 - epsilon); None: exact unless the instance has
    # more than AUTO_EPSILON_OPTIONS options, then AUTO_EPSILON
    epsilon: float | None = None
    # perf_counter() when the command started: the time limit counts from there, so that loading
    # the instance and building the options are inside it (None: from the call of make_plan)
    started_s: float | None = None


@dataclass(frozen=True)
class Outcome:
    """What a backend found at one load: the allocation, its placement and its stage values."""

    allocation: Allocation
    placement_check: PlacementCheck
    status: str
    values: tuple[float, ...]
    bound: float  # of the first stage, in its own unit (nan if unknown)
    iterations: int = 1
    cuts: int = 0
    notes: tuple[str, ...] = ()


def check_backend(instance: Instance, settings: PlanSettings) -> None:
    if settings.backend not in BACKENDS:
        raise InputError(None, "backend", f"unknown backend {settings.backend!r}", f"use one of: {', '.join(BACKENDS)}")
    # the enumeration deals every free unit to the LLMs (planner/allocation/enumerate.py, step 2):
    # it cannot minimise GPUs or share units
    if settings.backend == "enumerate" and instance.objective in ("min_gpus", "min_cost", "min_units"):
        raise InputError(
            instance.source, "objective", f"the enumerate backend does not handle {instance.objective}",
            "use `backend` cpsat (or milp, bruteforce)",
        )


def references(instance: Instance, settings: PlanSettings, placer: Placer) -> dict[str, float] | None:
    """ref_w for the egalitarian stage (solo_references' values)."""
    return solo_references(instance, settings, placer).values


@dataclass(frozen=True)
class References:
    """The egalitarian references and how far they may lie above the solo optima."""

    values: dict[str, float] | None
    # max_w ref_w / (a true lower bound of workflow w's solo optimum): 1 where every solo optimum
    # is proven, inf where one is unproven without a bound
    overestimate: float = 1.0
    notes: tuple[str, ...] = ()


def solo_references(instance: Instance, settings: PlanSettings, placer: Placer) -> References:
    """ref_w for the egalitarian stage: latency_slo_s, else the workflow's own optimum alone on
    the cluster (its LLMs only, at its own rate), always from an exact backend so that every
    backend optimises the same objective. The solo problems are independent: they are solved side
    by side (CP-SAT releases the interpreter while it searches). A solo optimum the time limit (or
    option pruning) leaves unproven gives as ref_w a solo plan's latency, at most `overestimate`
    times the optimum: the joint plan's ratios are then understated by at most that factor."""
    if not needs_references(instance, instance.objective):
        return References(None)
    exact = solo_settings(instance, settings)
    alone = [w.name for w in instance.workflows if w.latency_slo_s is None]
    with ThreadPoolExecutor(max_workers=REFERENCE_THREADS) as pool:
        outcomes = dict(zip(alone, pool.map(lambda name: _solo_outcome(instance, name, exact, placer), alone)))
    values = {name: o.values[0] for name, o in outcomes.items()}
    unproven = [name for name, o in outcomes.items() if o.status != "optimal"]
    if not unproven:
        return References(values)
    bounds = [outcomes[name].bound for name in unproven]
    overestimate = max(
        (values[name] / b if math.isfinite(b) and b > 0 else math.inf) for name, b in zip(unproven, bounds)
    )
    factor = f"up to {overestimate:.4g}x the optimum, and the bound accounts for it" if math.isfinite(overestimate) else (
        "above the optimum by an unknown factor, so no bound is claimed"
    )
    note = (
        f"the solo optimum of {', '.join(unproven)} was not proven (time limit or pruned options); its reference "
        f"is a solo plan's latency, {factor}"
    )
    return References(values, overestimate, (note,))


def solo_settings(instance: Instance, settings: PlanSettings) -> PlanSettings:
    """The settings of the solo problems: an exact backend, and a share of the time limit that
    leaves the largest share to the joint solve."""
    backend = settings.backend if settings.backend in EXACT_BACKENDS else "cpsat"
    return replace(settings, backend=backend, time_limit_s=settings.time_limit_s / (len(instance.workflows) + 1))


def solo_problem(instance: Instance, workflow: str) -> tuple[Instance, Objective]:
    """One workflow alone on the cluster, with the latency stage of min_latency only."""
    alone = replace(instance.only_workflow(workflow), objective="min_latency")
    objective = build_objective(alone)
    return alone, replace(objective, stages=objective.stages[:1])


def _solo_outcome(instance: Instance, workflow: str, settings: PlanSettings, placer: Placer) -> Outcome:
    """One workflow alone on the cluster, solved for its latency (the latency stage only)."""
    alone, objective = solo_problem(instance, workflow)
    deadline = time.perf_counter() + settings.time_limit_s
    return solve_at_load(alone, objective, settings, placer, deadline)


def placer_for(objective: Objective, placer: Placer) -> Placer:
    """GPU-count objectives need the placement of fewest (cheapest) GPUs to be exact."""
    stage = next((s for s in objective.stages if isinstance(s, GpuCount)), None)
    if stage is None:
        return placer
    return lambda cluster, allocation: fewest_gpus_placement(cluster, allocation, stage.cost)


def _usage(cluster: Cluster, allocation: Allocation, placement) -> Usage:
    return Usage(allocation.units, gpus_by_type(cluster, placement))


def stage_values(objective: Objective, options, cluster: Cluster, allocation: Allocation, placement) -> tuple[float, ...]:
    latencies = {m: _latency_of(options, allocation, m) for m in options}
    return objective.values(latencies, _usage(cluster, allocation, placement))


def _latency_of(options: dict[str, list[Option]], allocation: Allocation, llm: str) -> float:
    chosen = configuration(allocation.of(llm))
    return next(o.latency_s for o in options[llm] if configuration(o) == chosen)


@dataclass
class _CutLoop:
    """Solves one stage, cutting off allocations that break an SLO in floating point (the integer
    rows are a relaxation, planner/allocation/cpsat.py) or cannot be placed, until one meets both or time
    runs out."""

    model: object  # cpsat.AllocationModel or milp.MilpModel: solve_stage / decode / add_placement_cut
    solve_stage: Callable
    add_cut: Callable
    add_combination_cut: Callable
    objective: Objective
    options: dict
    cluster: Cluster
    placer: Placer
    deadline: float
    solves: int = 0
    unproven: bool = False
    unplaceable: list | None = None  # proven unplaceable allocations are added here (shared cuts)

    def _broken_slo(self, allocation: Allocation) -> str | None:
        """The first workflow whose SLO the allocation misses in floating point, if any."""
        if not self.objective.latency_limits:
            return None
        broken = self.objective.broken_limits({m: _latency_of(self.options, allocation, m) for m in self.options})
        return broken[0] if broken else None

    def run(self, stage, hint):
        while True:
            self.solves += 1
            result, allocation = self.solve_stage(self.model, stage, self.deadline - time.perf_counter(), hint)
            if allocation is None:
                return result, None, None
            broken = self._broken_slo(allocation)
            if broken is not None:
                self.add_combination_cut(self.model, allocation, [s for s in self.objective.coefficients[broken]])
                if time.perf_counter() >= self.deadline:
                    return result, None, None
                continue
            check = self.placer(self.cluster, allocation)
            if check.placeable:
                return result, allocation, check
            self.unproven |= not check.proven
            if check.proven and self.unplaceable is not None:
                self.unplaceable.append(allocation)
            self.add_cut(self.model, allocation)
            if time.perf_counter() >= self.deadline:
                return result, None, None


def cheapest_placeable(instance: Instance, options: dict[str, list[Option]], placer: Placer):
    """Each LLM's option with the fewest GPU units (then least latency), if that places: a plan to
    fall back on and a first hint for the solver."""
    cheapest = {m: min(opts, key=lambda o: (o.units, o.latency_s)) for m, opts in options.items()}
    allocation = options_allocation(instance.cluster.fractions_per_gpu, cheapest.values())
    check = placer(instance.cluster, allocation)
    return (allocation, check) if check.placeable else None


def _small(instance: Instance) -> bool:
    total = sum(sum(free) * count for _, free, count in domain_kinds(instance.cluster))
    return total <= WARM_START_MAX_UNITS and len(instance.cluster.used_gpu_types()) == 1


def _in_options(options, allocation: Allocation) -> bool:
    """A warm start is usable only if each LLM's configuration survived dominance pruning."""
    return all(
        any(configuration(o) == configuration(c) for o in options[c.llm])
        for c in allocation.llms
    )


def _warm_start(
    instance, options, objective: Objective, settings: PlanSettings, placer: Placer, deadline: float,
    hint: Allocation | None = None,
):
    """A placeable plan to hint the solver and fall back on: a given hint (a neighbouring
    scenario's optimum in a what-if grid) if it is among the options, places and meets the limits;
    else from a coarse model on large instances, the paper's enumeration if asked for, else the
    cheapest placeable plan."""
    if hint is not None and set(options) == {c.llm for c in hint.llms} and _in_options(options, hint):
        if objective.within_limits({m: _latency_of(options, hint, m) for m in options}):
            check = placer(instance.cluster, hint)
            if check.placeable:
                return hint, check
    if sum(map(len, options.values())) > COARSE_OPTIONS:
        coarse = all_options(instance, settings.space, epsilon=COARSE_EPSILON, deadline=deadline)
        budget = time.perf_counter() + COARSE_TIME_SHARE * max(deadline - time.perf_counter(), 0.0)
        try:
            found = _solve_model(instance, coarse, objective, settings, placer, budget, epsilon=COARSE_EPSILON, coarse=False)
        except (InfeasibleError, SolveTimeoutError):
            found = None
        if found is not None and _in_options(options, found.allocation):
            return found.allocation, found.placement_check
    if settings.warm_start and _small(instance) and objective.latency_only:
        enumerated = solve_enumerate(instance, objective, settings.space, placer)
        if enumerated is not None and _in_options(options, enumerated.allocation):
            return enumerated.allocation, PlacementCheck(enumerated.placement, True)
    cheapest = {m: min(opts, key=lambda o: (o.units, o.latency_s)).latency_s for m, opts in options.items()}
    return cheapest_placeable(instance, options, placer) if objective.within_limits(cheapest) else None


PRUNE_MARGIN_STEPS = 4  # per LLM: grid steps of the first stage kept beyond the warm start's value


def _weighted_latency(weights: dict[str, float], llm: str, option: Option) -> float:
    return weights.get(llm, 0.0) * option.latency_s


def _within_warm_start(options: dict[str, list[Option]], objective: Objective, warm: Allocation) -> dict[str, list[Option]]:
    """The options some allocation whose first latency stage is within the model's rounding of
    the warm start's can use (formulation.supported_options on the stage's rows).

    Why the optimum is unchanged: it is at most the warm start's value, and every plan a later
    stage or the tie settling looks at lies within the first stage's rounding window of it (at
    most |M| grid steps either way, planner/allocation/cpsat.py): a row above the warm start's
    value by PRUNE_MARGIN_STEPS x |M| of the coarsest row's steps can hold none of them. Each
    LLM's fastest option stays (its term is the least in every row), so the stages' grids, set by
    those, do not move either."""
    stage = objective.stages[0]
    if not isinstance(stage, (LatencySum, MaxLatencySum)):
        return options
    rows = latency_rows(stage)
    latency = {c.llm: _latency_of(options, warm, c.llm) for c in warm.llms}
    value = max(sum(w * latency[m] for m, w in row.items()) for row in rows.values())
    step = max(cpsat.latency_step(options, LatencySum(r, row)) for r, row in rows.items())
    bound = value * (1 + 1e-9) + PRUNE_MARGIN_STEPS * len(options) * step
    kept = supported_options(options, [(partial(_weighted_latency, row), bound) for row in rows.values()])
    return options if kept is None else kept


def _solve_model(
    instance, options, objective: Objective, settings: PlanSettings, placer: Placer, deadline: float,
    epsilon: float = 0.0, coarse: bool = True, hint: Allocation | None = None, unplaceable: list | None = None,
):
    """CP-SAT or MILP: lexicographic stages with the lazy cut loop, from a warm start. Allocations
    in `unplaceable` (proven on this cluster, e.g. by a neighbouring scenario of a what-if grid)
    are cut off from the start, and the ones found here are added to it."""
    backend = cpsat if settings.backend == "cpsat" else milp
    counts = cpsat.counts_model_size(instance.cluster, options) <= settings.placement_counts_limit
    warm = (
        _warm_start(instance, options, objective, settings, placer, deadline, hint)
        if coarse
        else cheapest_placeable(instance, options, placer)
    )
    if warm is not None and settings.prune_to_warm_start:
        options = _within_warm_start(options, objective, warm[0])
    # the backend's own model (cpsat.AllocationModel or milp.MilpModel), used alike through `backend`
    model: Any = backend.build_allocation_model(instance.cluster, options, objective, placement_counts=counts)
    hint = warm[0] if warm is not None else None
    tuning = dict(settings.stage_parameters) if backend is cpsat else {}
    solve = lambda m, stage, limit, h: backend.solve_stage(m, stage, limit, settings.workers, h, **tuning)  # noqa: E731
    for allocation in unplaceable or ():
        backend.add_placement_cut(model, allocation)  # valid at any rates: placement ignores them
    loop = _CutLoop(
        model, solve, backend.add_placement_cut, backend.add_combination_cut, objective, options, instance.cluster,
        placer, deadline, unplaceable=unplaceable,
    )
    best = first = None
    first_exact = True  # the first stage's optimum is exact in floating point (not only on its grid)
    first_bound = math.nan  # its true lower bound from the settling, where it gives one
    for index, stage in enumerate(model.stages):
        result, allocation, check = loop.run(stage, hint)
        if allocation is None:
            if index == 0 and result.status == "infeasible":
                return None
            break  # time limit: keep the best plan of the earlier stages
        assert check is not None  # run returns an allocation with its placement check
        if result.status == "optimal" and getattr(stage, "slack", 0):
            ties = _settle_ties(loop, backend, stage, objective, index, result.value, (allocation, check))
            allocation, check = ties.best
            if index == 0:
                first_exact, first_bound = ties.complete, ties.bound
        else:
            if result.status == "optimal":
                backend.fix_stage(model, stage, result.value)
        best = (allocation, check)
        first = first or result
        if result.status != "optimal":
            break
        hint = allocation
    notes: tuple[str, ...] = ()
    if best is None and warm is not None:  # time limit before the solver's first plan: the warm start
        notes = ("time limit reached before the solver's first plan; returning the warm start",)
        values = stage_values(objective, options, instance.cluster, warm[0], warm[1].placement)
        return Outcome(warm[0], warm[1], "feasible", values, math.nan, loop.solves, model.cuts, notes)
    if best is None:
        raise SolveTimeoutError(
            f"no placeable plan found within the time limit of {settings.time_limit_s:g} s; raise `time_limit_s`"
        )
    assert first is not None  # set together with best
    if loop.unproven:
        notes = ("a placement check hit its time limit and was treated as unplaceable",)
    values = stage_values(objective, options, instance.cluster, best[0], best[1].placement)
    status = "optimal" if first.status == "optimal" and not loop.unproven and epsilon == 0 else "feasible"
    bound = _lower_bound(backend, model.stages[0], first.bound)
    if epsilon > 0:  # kept options are within 1/(1 - epsilon) of the dropped ones
        bound *= 1 - epsilon
        notes += (f"options pruned within a latency factor 1/(1 - {epsilon:g}); the bound accounts for it",)
    # a GPU stage is only a lower bound without the placement counts; share units (min_units) are
    # exact in every model (the options' t s d), so that stage needs no such check
    if isinstance(objective.stages[0], GpuCount) and not model.exact_gpus and values[0] > bound + 1e-9:
        status = "feasible"  # the model's GPU count was a lower bound the placement could not reach
        notes += ("GPU count bounded by share units on this cluster size; the placement needs more",)
    elif status == "optimal" and first_exact:
        # settled (_settle_ties): the optimum to TIE_TOLERANCE, ties closer than that being equal
        bound = values[0] if not first_bound < values[0] * (1 - TIE_TOLERANCE) else first_bound
    elif status == "optimal":
        status = "feasible"  # settling near-ties was cut short: optimal on the grid, within its rounding
        notes += ("near-ties within the latency grid's rounding were not settled (time limit); the bound accounts for it",)
    bound = min(bound, values[0])
    return Outcome(best[0], best[1], status, values, bound, loop.solves, model.cuts, notes)


TIE_CANDIDATES = 32  # MILP: most plans compared within one stage's tolerance window


@dataclass(frozen=True)
class _Ties:
    best: tuple  # (allocation, placement check) of least value in floating point
    complete: bool  # the stage's optimum is settled to TIE_TOLERANCE
    bound: float = math.nan  # a true lower bound of the stage, in its own unit (cpsat)


def _settle_ties(loop: _CutLoop, backend, stage, objective: Objective, index: int, value, found) -> _Ties:
    """Make a latency stage's optimum exact in floating point, whatever the solver's resolution."""
    solves = loop.solves
    try:
        if backend is cpsat:
            return _settle_on_fine_grid(loop, stage, objective, index, value, found)
        return _settle_by_listing(loop, backend, stage, objective, index, value, found)
    finally:
        loop.solves = solves  # settling does not count as iterations of the search


def _settle_on_fine_grid(loop: _CutLoop, stage, objective: Objective, index: int, value: int, found) -> _Ties:
    """CP-SAT rounds a latency stage to an integer grid (1e-5 of the stage's scale); a plan's scaled
    value moves by at most `stage.slack / 2` steps, so every plan at least as good in floating point
    as the one found (scaled value `value`) lies in the window scaled <= value + slack. The window
    is kept, and the stage solved again within it on a grid 1e8 times finer (1e-13), hinted with
    the plan found; that grid's window is kept in turn, so later stages choose among plans within
    1e-12 of the optimum: ties closer than that are equal (TIE_TOLERANCE, as in every backend)."""
    model = loop.model
    assert isinstance(model, cpsat.AllocationModel)  # the CP-SAT backend's model
    cpsat.keep_window(model, stage, value)
    fine = cpsat.fine_stage(model, objective.stages[index])
    result, allocation, check = loop.run(fine, found[0])
    if allocation is None or result.status != "optimal":  # time limit: the coarse plan, within 1e-5
        return _Ties(found, False)
    cpsat.keep_window(model, fine, result.value)
    return _Ties((allocation, check), True, _lower_bound(cpsat, fine, result.bound))


def _settle_by_listing(loop: _CutLoop, backend, stage, objective: Objective, index: int, value, found) -> _Ties:
    """HiGHS has feasibility and optimality tolerances: every plan at least as good as the one
    found lies within 1e-6 (relative) of its value. The window's plans that meet the SLOs and place
    are listed one by one (each found plan forbidden while the window is open) until none is left;
    the least in floating point wins. The stage then keeps the window, without the plans found
    worse, so later stages choose among the exact ties only."""
    model = loop.model
    backend.open_window(model, stage, value)
    seen = [found]
    backend.forbid(model, found[0], stage.llms, probe=True)
    complete = False
    try:
        while len(seen) < TIE_CANDIDATES:
            result, allocation, check = loop.run(stage, None)
            if allocation is None:
                complete = result.status == "infeasible"
                break
            seen.append((allocation, check))
            backend.forbid(model, allocation, stage.llms, probe=True)
    finally:
        backend.close_window(model, stage)
    true_value = [_stage_value(objective, loop.options, index, allocation) for allocation, _ in seen]
    least = min(true_value)
    for (allocation, _), v in zip(seen, true_value):
        if v > least * (1 + TIE_TOLERANCE):
            backend.forbid(model, allocation, stage.llms)
    return _Ties(seen[true_value.index(least)], complete)


def _lower_bound(backend, stage, solver_bound: float) -> float:
    """A true lower bound of a stage from the solver's: less the most that CP-SAT's rounding of
    latency stages can hide (half a step per LLM), or HiGHS's tie window."""
    if backend is cpsat:
        return (solver_bound - stage.slack / 2) * stage.unit
    if stage.slack:
        return solver_bound - milp.TIE_WINDOW * max(1.0, abs(solver_bound))
    return solver_bound


TIE_TOLERANCE = 1e-12  # stage values this close are equal (the fine grid's resolution, float sums)


def _stage_value(objective: Objective, options, index: int, allocation: Allocation) -> float:
    """A latency stage's value of an allocation in floating point."""
    latencies = {m: _latency_of(options, allocation, m) for m in options}
    return objective.values(latencies)[index]


def plan_options(
    instance: Instance, settings: PlanSettings, objective: Objective, cache: OptionsCache | None = None,
    deadline: float | None = None,
) -> tuple[dict[str, list[Option]], float]:
    """The options and the pruning epsilon used (bruteforce: every option, unpruned). Latency
    limits (SLOs) or GPU stages turn the automatic epsilon off: a slightly slower kept option
    could miss an SLO that a dropped one meets. `cache` keeps each LLM's options per offered rate
    (valid for one cluster and search space: what-if grids pass one per cluster)."""
    options_at = lambda **kw: _cached_options(instance, settings.space, cache, deadline=deadline, **kw)  # noqa: E731
    if settings.backend == "bruteforce":
        return options_at(prune=False), 0.0
    if settings.epsilon is not None:
        return options_at(epsilon=settings.epsilon), settings.epsilon
    options = options_at()
    if sum(map(len, options.values())) > AUTO_EPSILON_OPTIONS and objective.latency_only and not objective.latency_limits:
        return options_at(epsilon=AUTO_EPSILON), AUTO_EPSILON
    return options, 0.0


OptionsCache = dict  # (llm, offered rate, prune, epsilon) -> list[Option]; "shapes" -> llm_options' shapes


def _cached_options(
    instance: Instance, space: SearchSpace, cache: OptionsCache | None, prune: bool = True, epsilon: float = 0.0,
    deadline: float | None = None,
) -> dict[str, list[Option]]:
    if cache is None:
        return all_options(instance, space, prune=prune, epsilon=epsilon, deadline=deadline)
    options = {}
    for llm in instance.llms:
        key = (llm.name, instance.offered_rate_rps(llm.name), prune, epsilon)
        if key not in cache:
            cache[key] = llm_options(instance, llm, space, prune, epsilon, deadline=deadline, shapes=cache.setdefault("shapes", {}))
        options[llm.name] = cache[key]
    return options


def solve_at_load(
    instance: Instance, objective: Objective, settings: PlanSettings, placer: Placer, deadline: float,
    hint: Allocation | None = None, cache: OptionsCache | None = None, unplaceable: list | None = None,
) -> Outcome:
    """Search the allocation of `instance` (at its own rates) for `objective`; `hint` (CP-SAT and
    MILP) is tried first as the warm start; `cache` as in plan_options; `unplaceable` as in
    _solve_model (what-if grids share it between the scenarios of one cluster)."""
    placer = placer_for(objective, placer)
    options, epsilon = plan_options(instance, settings, objective, cache, deadline)
    outcome = None
    if all(options.values()):
        if settings.backend in ("cpsat", "milp"):
            outcome = _solve_model(instance, options, objective, settings, placer, deadline, epsilon, hint=hint, unplaceable=unplaceable)
        elif settings.backend == "enumerate":
            found = solve_enumerate(instance, objective, settings.space, placer)
            if found is not None:
                notes = (f"{found.mappings} fraction mappings enumerated",)
                check = PlacementCheck(found.placement, True)
                outcome = Outcome(found.allocation, check, "feasible", found.values, math.nan, notes=notes)
        else:
            exhaustive = solve_bruteforce(instance, options, objective, placer)
            if exhaustive is not None:
                notes = (f"{exhaustive.combinations} combinations, {exhaustive.placement_checks} placement checks",)
                check = PlacementCheck(exhaustive.placement, True)
                outcome = Outcome(exhaustive.allocation, check, "optimal", exhaustive.values, exhaustive.values[0], notes=notes)
    if outcome is None:
        raise InfeasibleError(explain_infeasible(instance, options, settings.space, objective))
    return outcome


def assemble_plan(
    instance: Instance, objective: Objective, outcome: Outcome, settings: PlanSettings, start: float,
    value: float | None = None, bound: float | None = None, extras: tuple = (), status: str | None = None,
) -> Plan:
    """A Plan from an outcome: the prediction, stage values as extras, bound and gap."""
    value = outcome.values[0] if value is None else value
    bound = outcome.bound if bound is None else bound
    maximise = instance.objective == "max_throughput"
    gap = math.nan
    if math.isfinite(bound) and bound > 0:
        gap = max((bound - value) / bound if maximise else (value - bound) / value if value > 0 else 0.0, 0.0)
    placement = outcome.placement_check.placement
    assert placement is not None  # an outcome is always placed
    named = dict(zip(objective.stage_names, outcome.values))
    extras = tuple(extras) + tuple(
        (key, named[key]) for key in ("mean_latency_s", "gpus", "cost_per_hour") if key in named
    )
    return Plan(
        status=status or outcome.status,
        objective=instance.objective,
        objective_value=value,
        bound=bound,
        gap=gap,
        solver=SolverInfo(
            backend=settings.backend,
            wall_time_s=time.perf_counter() - start,
            iterations=outcome.iterations,
            cuts=outcome.cuts,
            notes=outcome.notes,
        ),
        allocation=outcome.allocation,
        prediction=predict(instance, outcome.allocation),
        placement=placement,
        extras=extras,
        instance=instance.source,
    )
