"""Exact allocation model (OR-Tools CP-SAT).

Formulation (units in brackets; docs/model.md, "Allocation model", states the same):

Sets
    M             LLMs
    O_m           options of LLM m: (gpu type g, tp t, share s, replicas d), feasible for memory,
                  profile and throughput, dominance-pruned (planner/allocation/options.py)
    K             replica shapes k = (g, t, s);  J  NVLink domains;  I_j  GPUs of domain j
    W             workflows
Parameters
    F             share units per GPU;  c_i  free units of GPU i
    L_o           latency of one call of m under option o [s] (profile curve at Lambda_m / d)
    c_wm          n_wm / p_wm, latency weight of LLM m in workflow w [-]
    ref_w         reference latency of workflow w [s] (several workflows only)
    pi_w          lambda_w / sum lambda, request weight of workflow w [-]
    I_g^t         GPUs of type g in NVLink domains of size >= t
    w(s), W(c)    bin-packing weights: w(s) = [s >= b] + (floor(F/b) - 1)[s >= a] for a + b > F,
                  a >= b;  W(c) = the most weight of shards that fit c units (knapsack)
Variables
    x[m, o]       1 if LLM m runs option o                                        {0, 1}
    n[j, k]       replicas of shape k in domain j       (placement counts, small clusters)
    c[i, k]       shards of fractional shape k (s < F) on GPU i      (placement counts)
    whole[i]      GPU i carries a whole-GPU shard                    (placement counts)
    used[i]       GPU i holds a shard                                (placement counts)
    z             egalitarian latency ratio (several workflows)                   integer, scaled
Constraints
    sum_o x[m, o] = 1                                             one configuration per LLM
    sum_{m,o: g_o = g, t_o >= t} t s d x[m, o] <= sum_{i in I_g^t} c_i
                                              share units of TP >= t replicas fit domains >= t
    sum_{m,o: g_o = g, t_o >= t} t d w(s_o) x[m, o] <= sum_{i in I_g^t} W(c_i)
                                              shards that cannot share a GPU need their own
    placement counts (clusters with at most 1000 (GPU, shape) pairs; exact; the count model of
    placement/feasibility/counts.py, one group per shape):
        sum_j n[j, k] = R_k := sum_{m,o: shape k} d_o x[m, o]     every replica in a domain
        sum_{i in I_j} whole[i] = sum_{k: s_k = F} t_k n[j, k]    whole shards: one GPU each
        sum_{i in I_j} c[i, k] = t_k n[j, k],  c[i, k] <= n[j, k]   tp distinct GPUs (s_k < F)
        sum_k s_k c[i, k] + F whole[i] <= c_i used[i],  load >= used[i]   GPU capacity, GPUs in use
    placement cuts (lazy, larger clusters): for an allocation found unplaceable with cumulative
        shape counts R*_{g,t,s} = #replicas of type g, tp t and share >= s, forbid every allocation
        with R_{g,t,s} >= R*_{g,t,s} for all (g, t, s) in its support (it is at least as hard)
Objective (lexicographic stages, each solved with the previous ones fixed at their optimum)
    one workflow:   min sum_{m,o} c_m L_o x[m, o]                              [s]
    several:        min z,  z >= sum_{m,o} c_wm L_o / ref_w x[m, o]  for all w  [-]
                    then min sum_w pi_w sum_{m,o} c_wm L_o x[m, o]             [s]
    finally:        min sum_{m,o} t s d x[m, o]                                [units]
    min_gpus, min_cost: min sum_g cost_g N_g first (N_g GPUs of type g hosting a shard);
    min_units: the share-units stage first (exact: integer units), then the latency stages
Integer scaling: each stage's coefficients are rounded to a grid of 1e-5 of the sum of the per-LLM
minima over |M|; plans the grid cannot tell apart are compared in floating point by the search
(planner/allocation/search.py, _settle_ties), so the optimum is exact. SLO rows round latencies down (a
relaxation) and the search cuts off any plan the rounding let through (add_combination_cut).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from scepsy.models.instance.allocation import Allocation
from scepsy.models.instance.instance import Cluster
from scepsy.placement.feasibility.counts import CpsatCounts, add_count_rows, add_used, count_variables
from scepsy.placement.feasibility.solver import STATUS_NAMES, cpsat_solver

from scepsy.planner.allocation.formulation import Row, capacity_rows, chosen_allocation, counts_model_size, cut_rows, grid, items, shape_groups
from scepsy.planner.allocation.objective import SLO_TOLERANCE, GpuCount, LatencySum, MaxLatencySum, Objective
from scepsy.planner.allocation.options import Option, configuration

# latency stages: the coarse grid the search solves on (fast), and the fine grid on which it then
# settles the plans the coarse one cannot tell apart (planner/allocation/search.py, _settle_ties)
GRID_RESOLUTION = 1e-5
FINE_RESOLUTION = 1e-13

__all__ = [
    "build_allocation_model", "solve_stage", "fix_stage", "add_placement_cut", "add_combination_cut", "counts_model_size",
    "open_window", "forbid", "close_window",
]


@dataclass
class StageExpr:
    name: str
    expr: cp_model.LinearExprT  # an int when the stage has no terms
    unit: float  # value of one integer step in the stage's own unit (s, ratio, GPUs or units)
    # rounded latency stages: the most integer steps by which rounding can move a plan's value
    # either way, summed over its terms times two (0: the stage is exact)
    slack: int = 0
    llms: tuple[str, ...] = ()  # the LLMs whose options the stage's value depends on


@dataclass
class AllocationModel:
    model: cp_model.CpModel
    options: dict[str, list[Option]]
    x: dict[tuple[str, int], cp_model.IntVar]
    stages: list[StageExpr]
    fractions_per_gpu: int
    exact_gpus: bool = False  # GPU stages exact (placement counts) rather than a lower bound
    cuts: int = 0
    fixed: list[str] = field(default_factory=list)
    window: cp_model.IntVar | None = None  # literals of the open tie window (open_window)
    probe: cp_model.IntVar | None = None

    def decode(self, solver: cp_model.CpSolver) -> Allocation:
        return chosen_allocation(self.fractions_per_gpu, self.options, lambda key: solver.boolean_value(self.x[key]))


def _weighted(terms) -> cp_model.LinearExpr:
    return cp_model.LinearExpr.weighted_sum([v for _, v in terms], [k for k, _ in terms])


def _row(x, row: Row) -> cp_model.LinearExpr:
    return _weighted([(k, x[key]) for k, key in row.terms])


def build_allocation_model(
    cluster: Cluster, options: dict[str, list[Option]], objective: Objective, placement_counts: bool = False
) -> AllocationModel:
    model = cp_model.CpModel()

    # x[m, o]: LLM m runs option o
    x = {(m, i): model.new_bool_var(f"x[{m},{o.gpu_type},{o.tp},{o.share},{o.replicas}]") for m, i, o in items(options)}

    # one configuration per LLM
    for m, opts in options.items():
        model.add_exactly_one(x[(m, i)] for i in range(len(opts)))

    # share units of TP >= t replicas fit the domains of size >= t; bin-packing inequalities
    for row in capacity_rows(cluster, options):
        model.add(_row(x, row) <= row.rhs)

    # placement counts (exact) where the cluster is small enough, with the GPUs they use
    used = add_placement_counts(model, cluster, options, x) if placement_counts else None
    gpus = _gpus_by_type(model, cluster, options, x, used)

    # latency limits (SLOs): coefficients rounded down, a relaxation that keeps every plan meeting
    # them (even exactly); the search checks each plan in floating point and cuts off the few that
    # the rounding let through (add_combination_cut)
    for workflow, limit in sorted(objective.latency_limits.items()):
        weights = objective.coefficients[workflow]
        step = _stage_grid(options, lambda m: weights.get(m, 0.0))
        terms = [(math.floor(weights[m] * o.latency_s / step), x[(m, i)]) for m, i, o in items(options) if weights.get(m, 0.0) > 0]
        model.add(_weighted(terms) <= math.floor(limit * (1 + SLO_TOLERANCE) / step))

    stages = [_stage_expr(model, options, x, gpus, stage) for stage in objective.stages]
    return AllocationModel(model, options, x, stages, cluster.fractions_per_gpu, exact_gpus=used is not None)


def _gpus_by_type(model, cluster: Cluster, options, x, used) -> dict[str, cp_model.LinearExpr]:
    """GPUs hosting a shard, per type: exact from the placement counts, else the lower bound
    N_g >= units_g / F (the placement then realises it, or the gap is reported)."""
    gpus = {}
    for gpu_type in cluster.used_gpu_types():
        if used is not None:
            gpus[gpu_type] = sum(v for (node, _), v in sorted(used.items()) if cluster.node(node).gpu_type == gpu_type)
            continue
        count = model.new_int_var(0, cluster.gpu_count(gpu_type), f"gpus[{gpu_type}]")
        units = [(o.units, x[(m, i)]) for m, i, o in items(options) if o.gpu_type == gpu_type]
        if units:
            model.add(cluster.fractions_per_gpu * count >= _weighted(units))
        gpus[gpu_type] = count
    return gpus


def add_placement_counts(
    model: cp_model.CpModel, cluster: Cluster, options: dict[str, list[Option]], x: dict
) -> dict[tuple[str, int], cp_model.IntVar]:
    """Exact placeability inside the allocation model: the count model (placement/feasibility/counts.py)
    with one group per replica shape k, R_k = sum_{m, o: shape k} d_o x[m, o]. Used where the
    cluster is small enough; larger clusters rely on the valid inequalities and lazy cuts. Returns
    used[node, gpu], true when the GPU hosts a shard."""
    solver = CpsatCounts(model)
    groups, replicas = shape_groups(options)
    counts = count_variables(solver, cluster, groups)
    add_count_rows(solver, counts, {k: _weighted([(d, x[key]) for d, key in terms]) for k, terms in replicas.items()})
    return add_used(solver, counts, cluster)


def _scaled(options, x, weight_of, step: float) -> tuple[cp_model.LinearExpr, int]:
    """sum_{m,o} round(weight_m * L_o / step) x[m, o], and the largest value it can take."""
    terms = [
        (int(round(weight_of(m) * o.latency_s / step)), x[(m, i)])
        for m, opts in options.items()
        for i, o in enumerate(opts)
        if weight_of(m) > 0
    ]
    upper = sum(
        max(int(round(weight_of(m) * o.latency_s / step)) for o in opts)
        for m, opts in options.items()
        if weight_of(m) > 0 and opts
    )
    return _weighted(terms), upper


def _stage_grid(options, weight_of, resolution: float = GRID_RESOLUTION) -> float:
    # w * min(L) is min(w * L) exactly for a weight w >= 0 (rounding is monotone), at a product per LLM
    return grid([weight_of(m) * min(o.latency_s for o in opts) for m, opts in options.items() if opts], resolution)


def latency_step(options, stage, resolution: float = GRID_RESOLUTION) -> float:
    """The integer grid of a latency stage (LatencySum or MaxLatencySum) on these options, as
    _stage_expr builds it: each option's term is rounded to the nearest multiple, so two
    allocations whose true values differ by more than |M| steps keep their order after rounding."""
    if isinstance(stage, LatencySum):
        return _stage_grid(options, lambda m: stage.weights.get(m, 0.0), resolution)
    return min(_stage_grid(options, lambda m, row=row: row.get(m, 0.0), resolution) for row in stage.weights.values())


def _stage_expr(model, options, x, gpus, stage, resolution: float = GRID_RESOLUTION) -> StageExpr:
    """One objective stage as an integer expression, with the value of one integer step.

    Latency stages are rounded to the grid: a plan's scaled value is within half a step per LLM
    of its true value / step, so every plan at least as good as one of scaled value v has a scaled
    value <= v + slack (slack = the number of LLMs with a weight), which search.py uses to find the
    exact optimum among the plans the rounding cannot tell apart."""
    if isinstance(stage, LatencySum):
        weight = lambda m: stage.weights.get(m, 0.0)  # noqa: E731
        step = _stage_grid(options, weight, resolution)
        expr, _ = _scaled(options, x, weight, step)
        llms = tuple(m for m in options if weight(m) > 0)
        return StageExpr(stage.name, expr, step, slack=len(llms), llms=llms)
    if isinstance(stage, MaxLatencySum):
        # z >= each row's latency sum, all rows on the finest of their grids
        rows = [lambda m, row=row: row.get(m, 0.0) for row in stage.weights.values()]
        step = min(_stage_grid(options, row, resolution) for row in rows)
        scaled = [_scaled(options, x, row, step) for row in rows]
        z = model.new_int_var(0, max(upper for _, upper in scaled), "z")
        for expr, _ in scaled:
            model.add(z >= expr)
        llms = tuple(m for m in options if any(row(m) > 0 for row in rows))
        return StageExpr(stage.name, z, step, slack=len(llms), llms=llms)
    if isinstance(stage, GpuCount):
        # prices on a grid of 1e-6 of the cheapest positive one (exact for min_gpus: all 1)
        step = min((c for c in stage.cost.values() if c > 0), default=1.0) * 1e-6
        terms = [(int(round(stage.cost[g] / step)), n) for g, n in sorted(gpus.items()) if stage.cost.get(g, 0) > 0]
        return StageExpr(stage.name, sum(k * n for k, n in terms), step)
    units = _weighted([(o.units, x[(m, i)]) for m, opts in options.items() for i, o in enumerate(opts)])
    return StageExpr(stage.name, units, 1.0)


def add_placement_cut(am: AllocationModel, allocation: Allocation) -> None:
    """Forbid `allocation` and every allocation at least as hard to place (formulation.cut_rows)."""
    below = []
    for row in cut_rows(am.options, allocation):
        fewer = am.model.new_bool_var(f"cut{am.cuts}:{row.name}")
        # fewer => R_{g,t,s} < R*_{g,t,s}; at least one shape must need fewer replicas
        am.model.add(_row(am.x, row) <= row.rhs).only_enforce_if(fewer)
        below.append(fewer)
    am.model.add_bool_or(below)
    am.cuts += 1


def add_combination_cut(am: AllocationModel, allocation: Allocation, llms, enforce=None) -> None:
    """Forbid the options `allocation` gives the LLMs `llms` together (a plan that breaks an SLO,
    or a plan already seen in a tie search); with `enforce`, only while that literal is true."""
    chosen = [
        am.x[(m, i)]
        for m in llms
        for i, o in enumerate(am.options[m])
        if configuration(o) == configuration(allocation.of(m))
    ]
    constraint = am.model.add_bool_or([v.negated() for v in chosen])
    if enforce is not None:
        constraint.only_enforce_if(enforce)


def fine_stage(am: AllocationModel, stage) -> StageExpr:
    """A latency stage (LatencySum or MaxLatencySum) again, on the fine grid."""
    return _stage_expr(am.model, am.options, am.x, {}, stage, FINE_RESOLUTION)


def keep_window(am: AllocationModel, stage: StageExpr, value: int) -> None:
    """Keep the stage within its rounding slack of `value`: every plan at least as good in floating
    point as one of scaled value `value` stays; later stages choose among them."""
    am.model.add(stage.expr <= value + stage.slack)
    am.fixed.append(stage.name)


def open_window(am: AllocationModel, stage: StageExpr, value: int) -> None:
    """Restrict the model, until `close_window`, to the plans the integer grid cannot tell apart
    from one of scaled value `value` (scaled <= value + slack), and let `forbid(..., probe=True)`
    cuts hold only as long."""
    am.window = am.model.new_bool_var(f"window[{stage.name}]")
    am.model.add(stage.expr <= value + stage.slack).only_enforce_if(am.window)
    am.probe = am.model.new_bool_var(f"probe[{stage.name}]")
    am.model.clear_assumptions()
    am.model.add_assumptions([am.window, am.probe])


def forbid(am: AllocationModel, allocation: Allocation, llms, probe: bool = False) -> None:
    add_combination_cut(am, allocation, llms, enforce=am.probe if probe else None)


def close_window(am: AllocationModel, stage: StageExpr) -> None:
    """Drop the probe cuts; the window stays, so later stages choose among its plans."""
    assert am.window is not None, "close_window without open_window"
    am.model.clear_assumptions()
    am.model.add_bool_or([am.window])
    am.fixed.append(stage.name)


@dataclass(frozen=True)
class StageResult:
    status: str
    value: int | None
    bound: float
    wall_time_s: float


def solve_stage(
    am: AllocationModel, stage: StageExpr, time_limit_s: float, workers: int, hint: Allocation | None = None,
    **parameters: object,
) -> tuple[StageResult, Allocation | None]:
    """Minimise one stage; the decoded allocation, or None without a solution. `parameters`: more
    CP-SAT parameters (PlanSettings.stage_parameters)."""
    am.model.clear_objective()
    am.model.minimize(stage.expr)
    am.model.clear_hints()
    if hint is not None:
        # what add_hint does per variable (x are positive literals), in two bulk appends
        pairs = sorted(hint_for(am, hint).items())
        am.model.proto.solution_hint.vars.extend([am.x[key].index for key, _ in pairs])
        am.model.proto.solution_hint.values.extend([value for _, value in pairs])
    # presolve and probing cost more than they save on these models (bench/solver_scaling.py):
    # probing alone added seconds and millions of binary clauses at 128 GPUs
    solver = cpsat_solver(time_limit_s, workers, cp_model_presolve=False, cp_model_probing_level=0, **parameters)
    status = solver.solve(am.model)
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    result = StageResult(
        STATUS_NAMES.get(status, "unknown"),
        int(round(solver.objective_value)) if found else None,
        solver.best_objective_bound if found else math.nan,
        solver.wall_time,
    )
    return result, (am.decode(solver) if found else None)


def fix_stage(am: AllocationModel, stage: StageExpr, value: int) -> None:
    """Keep a solved stage at (or below) its optimum while the next stage is optimised."""
    am.model.add(stage.expr <= value)
    am.fixed.append(stage.name)


def hint_for(am: AllocationModel, allocation: Allocation) -> dict[tuple[str, int], int]:
    hint = {}
    for m, opts in am.options.items():
        choice = allocation.of(m)
        for i, o in enumerate(opts):
            hint[(m, i)] = int(configuration(o) == configuration(choice))
    return hint
