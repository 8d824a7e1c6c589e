"""Exact allocation model (OR-Tools CP-SAT).

Formulation (units in brackets; docs/model.md, "Allocation model", states the same):

Sets
    M             LLMs
    O_m           options of LLM m: (gpu type g, tp t, share s, replicas d), feasible for memory,
                  profile and throughput, dominance-pruned (planner/options.py)
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
    c[j, i, k]    shards of shape k on GPU i of domain j (placement counts, small clusters)
    z             egalitarian latency ratio (several workflows)                   integer, scaled
Constraints
    sum_o x[m, o] = 1                                             one configuration per LLM
    sum_{m,o: g_o = g, t_o >= t} t s d x[m, o] <= sum_{i in I_g^t} c_i
                                              share units of TP >= t replicas fit domains >= t
    sum_{m,o: g_o = g, t_o >= t} t d w(s_o) x[m, o] <= sum_{i in I_g^t} W(c_i)
                                              shards that cannot share a GPU need their own
    placement counts (clusters with at most 1000 (GPU, shape) pairs; exact):
        sum_j n[j, k] = R_k := sum_{m,o: shape k} d_o x[m, o]     every replica in a domain
        sum_{i in I_j} c[j, i, k] = t_k n[j, k],  c[j, i, k] <= n[j, k]   tp distinct GPUs
        sum_k s_k c[j, i, k] <= c_i                               GPU capacity
    placement cuts (lazy, larger clusters): for an allocation found unplaceable with cumulative
        shape counts R*_{g,t,s} = #replicas of type g, tp t and share >= s, forbid every allocation
        with R_{g,t,s} >= R*_{g,t,s} for all (g, t, s) in its support (it is at least as hard)
Objective (lexicographic stages, each solved with the previous ones fixed at their optimum)
    one workflow:   min sum_{m,o} c_m L_o x[m, o]                              [s]
    several:        min z,  z >= sum_{m,o} c_wm L_o / ref_w x[m, o]  for all w  [-]
                    then min sum_w pi_w sum_{m,o} c_wm L_o x[m, o]             [s]
    finally:        min sum_{m,o} t s d x[m, o]                                [units]
Integer scaling: each stage's coefficients are rounded to a grid of 1e-5 of the sum of the per-LLM
minima over |M|, so rounding moves a stage's optimum by at most 1e-5 of its value (<< 0.1%).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from scepsy.models.allocation import Allocation, LlmAllocation
from scepsy.models.instance import Cluster

from .objective import LatencyObjective
from .options import Option

SCALE_RESOLUTION = 1e-5
STATUS_NAMES = {
    cp_model.OPTIMAL: "optimal",
    cp_model.FEASIBLE: "feasible",
    cp_model.INFEASIBLE: "infeasible",
    cp_model.MODEL_INVALID: "model_invalid",
    cp_model.UNKNOWN: "unknown",
}


@dataclass
class StageExpr:
    name: str
    expr: cp_model.LinearExpr
    unit: float  # value of one integer step in the stage's own unit (s, ratio or GPU units)


@dataclass
class AllocationModel:
    model: cp_model.CpModel
    options: dict[str, list[Option]]
    x: dict[tuple[str, int], cp_model.IntVar]
    stages: list[StageExpr]
    fractions_per_gpu: int
    cuts: int = 0
    fixed: list[str] = field(default_factory=list)

    def chosen(self, solver: cp_model.CpSolver) -> dict[str, Option]:
        return {
            m: next(o for i, o in enumerate(opts) if solver.BooleanValue(self.x[(m, i)]))
            for m, opts in self.options.items()
        }

    def decode(self, solver: cp_model.CpSolver) -> Allocation:
        chosen = self.chosen(solver)
        return Allocation(
            self.fractions_per_gpu,
            tuple(LlmAllocation(o.llm, o.gpu_type, o.tp, o.share, o.replicas) for o in chosen.values()),
        )


def _grid(values: list[float]) -> float:
    """Integer grid for one stage from per-LLM minima: rounding |M| terms moves a sum by < 1e-5 of its lower bound."""
    positive = [v for v in values if v > 0]
    if not positive:
        return 1.0
    return SCALE_RESOLUTION * sum(positive) / len(positive)


def packing_weights(f: int) -> list[tuple[int, ...]]:
    """Weight functions w(s), s = 0..F, of the bin-packing inequalities (dual feasible functions):
    w(s) = [s >= b] + (floor(F/b) - 1) [s >= a] for a + b > F, a >= b. A GPU with a shard >= a has
    room for no other shard >= b, so no GPU carries more than floor(F/b) weight."""
    weights = set()
    for b in range(1, f + 1):
        for a in range(max(b, f - b + 1), f + 1):
            weights.add(tuple(int(s >= b) + (f // b - 1) * int(s >= a) for s in range(f + 1)))
    return sorted(weights)


def gpu_weight_capacity(weight: tuple[int, ...], free: int) -> int:
    """W(c): the most weight of shards that fit in c free units (unbounded knapsack, c <= F)."""
    best = [0] * (free + 1)
    for c in range(1, free + 1):
        best[c] = max([best[c - 1]] + [best[c - s] + weight[s] for s in range(1, c + 1)])
    return best[free]


def _free_in_domains(cluster: Cluster, gpu_type: str, tp: int) -> list[int]:
    """Free units of every GPU of `gpu_type` in an NVLink domain of size >= tp."""
    return [
        cluster.free_units(domain.node, g)
        for domain in cluster.domains()
        if domain.gpu_type == gpu_type and domain.size >= tp
        for g in domain.gpus
    ]


def _weighted(terms: list[tuple[int, cp_model.IntVar]]) -> cp_model.LinearExpr:
    return cp_model.LinearExpr.WeightedSum([v for _, v in terms], [k for k, _ in terms])


def build_allocation_model(
    cluster: Cluster, options: dict[str, list[Option]], objective: LatencyObjective, placement_counts: bool = False
) -> AllocationModel:
    f = cluster.fractions_per_gpu
    model = cp_model.CpModel()
    items = [(m, i, o) for m, opts in options.items() for i, o in enumerate(opts)]

    # x[m, o]: LLM m runs option o
    x = {(m, i): model.NewBoolVar(f"x[{m},{o.gpu_type},{o.tp},{o.share},{o.replicas}]") for m, i, o in items}

    # one configuration per LLM
    for m, opts in options.items():
        model.AddExactlyOne(x[(m, i)] for i in range(len(opts)))

    weights = packing_weights(f)
    for gpu_type in sorted({o.gpu_type for _, _, o in items}):
        for t in sorted({o.tp for _, _, o in items if o.gpu_type == gpu_type}):
            free = _free_in_domains(cluster, gpu_type, t)
            in_domains = [(m, i, o) for m, i, o in items if o.gpu_type == gpu_type and o.tp >= t]
            # share units of replicas with tp >= t fit in the domains of size >= t (t = 1: all units)
            model.Add(_weighted([(o.units, x[(m, i)]) for m, i, o in in_domains]) <= sum(free))
            # bin-packing inequalities: shards that cannot share a GPU need GPUs of their own
            gpus_by_free = Counter(free)
            for weight in weights:
                terms = [(o.tp * o.replicas * weight[o.share], x[(m, i)]) for m, i, o in in_domains if weight[o.share]]
                if terms:
                    limit = sum(k * gpu_weight_capacity(weight, c) for c, k in gpus_by_free.items())
                    model.Add(_weighted(terms) <= limit)

    if placement_counts:
        add_placement_counts(model, cluster, options, x)

    stages = _objective_stages(model, options, x, objective)
    return AllocationModel(model, options, x, stages, f)


def add_placement_counts(
    model: cp_model.CpModel, cluster: Cluster, options: dict[str, list[Option]], x: dict
) -> None:
    """Exact placeability inside the allocation model (the count model of planner/placeability.py,
    with the replica counts R_k as linear expressions of x). Used where the cluster is small enough;
    larger clusters rely on the valid inequalities and lazy cuts."""
    items = [(m, i, o) for m, opts in options.items() for i, o in enumerate(opts)]
    shapes = sorted({o.shape for _, _, o in items})
    most = {k: max(o.replicas for _, _, o in items if o.shape == k) for k in shapes}
    domains = cluster.domains()
    n, c = {}, {}
    for k in shapes:
        gpu_type, tp, share = k
        eligible = [j for j, d in enumerate(domains) if d.gpu_type == gpu_type and d.size >= tp]
        # n[j, k]: replicas of shape k in domain j;  c[j, g, k]: their shards on GPU g
        for j in eligible:
            n[(j, k)] = model.NewIntVar(0, most[k], f"n[{j},{k}]")
            for g in domains[j].gpus:
                if cluster.free_units(domains[j].node, g) >= share:
                    c[(j, g, k)] = model.NewIntVar(0, most[k], f"c[{j},{g},{k}]")
        # every replica of shape k is in some domain
        replicas = _weighted([(o.replicas, x[(m, i)]) for m, i, o in items if o.shape == k])
        model.Add(sum(n[(j, k)] for j in eligible) == replicas)
        # a domain holds tp shards per replica, at most one per GPU per replica
        for j in eligible:
            shards = [c[(j, g, k)] for g in domains[j].gpus if (j, g, k) in c]
            model.Add(sum(shards) == tp * n[(j, k)])
            for v in shards:
                model.Add(v <= n[(j, k)])
    # GPU capacity; GPUs of a domain with equal free units are interchangeable: order their loads
    for j, domain in enumerate(domains):
        loads = []
        for g in domain.gpus:
            terms = [(k[2], c[(j, g, k)]) for k in shapes if (j, g, k) in c]
            load = _weighted(terms) if terms else 0
            model.Add(load <= cluster.free_units(domain.node, g))
            loads.append((cluster.free_units(domain.node, g), load))
        for (free_a, load_a), (free_b, load_b) in zip(loads, loads[1:]):
            if free_a == free_b and not (isinstance(load_a, int) and isinstance(load_b, int)):
                model.Add(load_a >= load_b)


def counts_model_size(cluster: Cluster, options: dict[str, list[Option]]) -> int:
    shapes = {o.shape for opts in options.values() for o in opts}
    return sum(
        n.gpus for n in cluster.nodes for k in shapes if k[0] == n.gpu_type
    )


def _scaled(options, x, weight_of, grid: float) -> tuple[cp_model.LinearExpr, int]:
    """sum_{m,o} round(weight_m * L_o / grid) x[m, o], and the largest value it can take."""
    terms = [
        (int(round(weight_of(m) * o.latency_s / grid)), x[(m, i)])
        for m, opts in options.items()
        for i, o in enumerate(opts)
        if weight_of(m) > 0
    ]
    upper = sum(
        max(int(round(weight_of(m) * o.latency_s / grid)) for o in opts)
        for m, opts in options.items()
        if weight_of(m) > 0 and opts
    )
    return _weighted(terms), upper


def _stage_grid(options, weight_of) -> float:
    return _grid([min(weight_of(m) * o.latency_s for o in opts) for m, opts in options.items() if opts])


def _objective_stages(model, options, x, objective: LatencyObjective) -> list[StageExpr]:
    stages: list[StageExpr] = []
    if not objective.egalitarian:
        (workflow,) = objective.coefficients
        weight = lambda m: objective.llm_weight(0, m)[workflow]  # noqa: E731
        grid = _stage_grid(options, weight)
        expr, _ = _scaled(options, x, weight, grid)
        stages.append(StageExpr("latency_s", expr, grid))
    else:
        # z >= L_w / ref_w for every workflow, all ratios on the finest of their grids
        weights = {w: (lambda m, w=w: objective.llm_weight(0, m)[w]) for w in objective.coefficients}
        grid = min(_stage_grid(options, weight) for weight in weights.values())
        ratios = {w: _scaled(options, x, weight, grid) for w, weight in weights.items()}
        z = model.NewIntVar(0, max(upper for _, upper in ratios.values()), "z")
        for expr, _ in ratios.values():
            model.Add(z >= expr)
        stages.append(StageExpr("max_latency_ratio", z, grid))
        mean = lambda m: objective.llm_weight(1, m)["mean"]  # noqa: E731
        grid = _stage_grid(options, mean)
        expr, _ = _scaled(options, x, mean, grid)
        stages.append(StageExpr("mean_latency_s", expr, grid))
    units = _weighted([(o.units, x[(m, i)]) for m, opts in options.items() for i, o in enumerate(opts)])
    stages.append(StageExpr("units", units, 1.0))
    return stages


def add_placement_cut(am: AllocationModel, allocation: Allocation) -> None:
    """Forbid `allocation` and every allocation needing at least as many replicas of each shape
    and larger shares (cumulative counts per gpu type and tp, see the module docstring)."""
    groups: dict[tuple[str, int], list[LlmAllocation]] = {}
    for choice in allocation.llms:
        groups.setdefault((choice.gpu_type, choice.tp), []).append(choice)
    required = {
        (g, t, s): sum(c.replicas for c in choices if c.share >= s)
        for (g, t), choices in groups.items()
        for s in {c.share for c in choices}
    }
    below = []
    for (g, t, s), count in sorted(required.items()):
        fewer = am.model.NewBoolVar(f"cut{am.cuts}[{g},{t},{s}]")
        replicas = _weighted([
            (o.replicas, am.x[(m, i)])
            for m, opts in am.options.items()
            for i, o in enumerate(opts)
            if o.gpu_type == g and o.tp == t and o.share >= s
        ])
        # fewer => R_{g,t,s} < R*_{g,t,s}; at least one shape must need fewer replicas
        am.model.Add(replicas <= count - 1).OnlyEnforceIf(fewer)
        below.append(fewer)
    am.model.AddBoolOr(below)
    am.cuts += 1


@dataclass(frozen=True)
class StageResult:
    status: str
    value: int | None
    bound: float
    wall_time_s: float


def solve_stage(
    am: AllocationModel,
    stage: StageExpr,
    time_limit_s: float,
    workers: int,
    hint: dict[tuple[str, int], int] | None = None,
) -> tuple[StageResult, cp_model.CpSolver]:
    am.model.ClearObjective()
    am.model.Minimize(stage.expr)
    am.model.ClearHints()
    for key, value in sorted((hint or {}).items()):
        am.model.AddHint(am.x[key], value)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit_s, 0.01)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    # presolve costs more than it saves on these models (measured in bench/solver_scaling.py)
    solver.parameters.cp_model_presolve = False
    if workers > 1:
        solver.parameters.interleave_search = True  # deterministic whatever the thread timing
    status = solver.Solve(am.model)
    value = int(round(solver.ObjectiveValue())) if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
    bound = solver.BestObjectiveBound() if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else math.nan
    return StageResult(STATUS_NAMES.get(status, "unknown"), value, bound, solver.WallTime()), solver


def fix_stage(am: AllocationModel, stage: StageExpr, value: int) -> None:
    """Keep a solved stage at (or below) its optimum while the next stage is optimised."""
    am.model.Add(stage.expr <= value)
    am.fixed.append(stage.name)


def hint_for(am: AllocationModel, allocation: Allocation) -> dict[tuple[str, int], int]:
    hint = {}
    for m, opts in am.options.items():
        choice = allocation.of(m)
        for i, o in enumerate(opts):
            hint[(m, i)] = int(
                (o.gpu_type, o.tp, o.share, o.replicas) == (choice.gpu_type, choice.tp, choice.share, choice.replicas)
            )
    return hint
