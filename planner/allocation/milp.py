"""The allocation model as a MILP through PuLP (HiGHS, CBC as fallback): backend `milp`.

Same sets, parameters, variables, constraints and lexicographic objective stages as the CP-SAT
model (planner/allocation/cpsat.py; rows shared through planner/allocation/formulation.py), with two differences:
latency coefficients are continuous (no integer scaling), and a placement cut is linearised with
one binary per row: sum_r fewer_r >= 1, R_r <= R*_r - 1 + M_r (1 - fewer_r), M_r = the largest
value R_r can take. Stages are fixed at their optimum with a relative tolerance of 1e-9.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import pulp

from scepsy.models.instance.allocation import Allocation
from scepsy.models.instance.instance import Cluster
from scepsy.placement.feasibility.counts import add_count_rows, add_used, count_variables

from scepsy.planner.allocation.formulation import Row, capacity_rows, chosen_allocation, cut_rows, items, shape_groups
from scepsy.planner.allocation.objective import GpuCount, LatencySum, MaxLatencySum, Objective
from scepsy.planner.allocation.options import Option, configuration

FIX_TOLERANCE = 1e-9


# latency stages: plans within this relative distance of a stage's optimum are compared in
# floating point (search._settle_ties), since the solver's tolerances cannot tell them apart
TIE_WINDOW = 1e-6


@dataclass
class MilpStage:
    name: str
    expr: pulp.LpAffineExpression
    unit: float = 1.0
    llms: tuple[str, ...] = ()  # latency stages: the LLMs whose options the value depends on

    @property
    def slack(self) -> bool:
        return bool(self.llms)


@dataclass
class MilpModel:
    problem: pulp.LpProblem
    options: dict[str, list[Option]]
    x: dict[tuple[str, int], pulp.LpVariable]
    stages: list[MilpStage]
    fractions_per_gpu: int
    exact_gpus: bool = False
    cuts: int = 0
    probe: pulp.LpVariable | None = None  # binary that holds the cuts of an open tie window (open_window)

    def decode(self) -> Allocation:
        return chosen_allocation(self.fractions_per_gpu, self.options, lambda key: (self.x[key].varValue or 0) > 0.5)


def _row(x, row: Row) -> pulp.LpAffineExpression:
    return pulp.lpSum(k * x[key] for k, key in row.terms)


def build_allocation_model(
    cluster: Cluster, options: dict[str, list[Option]], objective: Objective, placement_counts: bool = False
) -> MilpModel:
    problem = pulp.LpProblem("allocation", pulp.LpMinimize)

    # x[m, o]: LLM m runs option o
    x = {(m, i): problem.add_variable(f"x_{m}_{i}", cat="Binary") for m, i, _ in items(options)}

    # one configuration per LLM
    for m, opts in options.items():
        problem += pulp.lpSum(x[(m, i)] for i in range(len(opts))) == 1, f"one_{m}"

    # share units of TP >= t replicas fit the domains of size >= t; bin-packing inequalities
    for k, row in enumerate(capacity_rows(cluster, options)):
        problem += _row(x, row) <= row.rhs, f"cap{k}"

    # placement counts (exact) where the cluster is small enough, with the GPUs they use
    used = _placement_counts(problem, cluster, options, x) if placement_counts else None
    gpus = _gpus_by_type(problem, cluster, options, x, used)

    # latency limits (SLOs)
    for workflow, limit in sorted(objective.latency_limits.items()):
        weights = objective.coefficients[workflow]
        problem += (
            pulp.lpSum(weights[m] * o.latency_s * x[(m, i)] for m, i, o in items(options) if weights.get(m, 0.0) > 0) <= limit,
            f"slo_{workflow}",
        )

    stages = [_stage_expr(problem, options, x, gpus, stage) for stage in objective.stages]
    return MilpModel(problem, options, x, stages, cluster.fractions_per_gpu, exact_gpus=used is not None)


class _PulpCounts:
    """The count model (placement/feasibility/counts.py) on a PuLP problem. Variable names:
    n_j_k, c_j_g_k (k: the shape's index), whole_j_g and used_j_g (j: the domain, g: the GPU)."""

    def __init__(self, problem: pulp.LpProblem):
        self.problem = problem

    def int_var(self, upper: int, kind: str, j: int, gpu, q: int, key) -> pulp.LpVariable:
        where = f"{j}" if gpu is None else f"{j}_{gpu[1]}"
        return self.problem.add_variable(f"{kind}_{where}_{q}", 0, upper, cat="Integer")

    def bool_var(self, kind: str, j: int, gpu) -> pulp.LpVariable:
        return self.problem.add_variable(f"{'whole' if kind == 'x' else kind}_{j}_{gpu[1]}", cat="Binary")

    def weighted(self, terms) -> pulp.LpAffineExpression:
        return pulp.lpSum(k * v for k, v in terms)

    def add(self, constraint) -> None:
        self.problem += constraint

    def never(self) -> None:  # not met: R_k is an expression of x here
        raise AssertionError("the allocation model's replica counts are never fixed numbers")


def _placement_counts(problem, cluster: Cluster, options, x) -> dict[tuple[str, int], pulp.LpVariable]:
    """The count model (placement/feasibility/counts.py), one group per replica shape;
    used[node, gpu] when the GPU hosts a shard."""
    groups, replicas = shape_groups(options)
    solver = _PulpCounts(problem)
    counts = count_variables(solver, cluster, groups)
    add_count_rows(solver, counts, {k: pulp.lpSum(d * x[key] for d, key in terms) for k, terms in replicas.items()})
    return add_used(solver, counts, cluster)


def _gpus_by_type(problem, cluster: Cluster, options, x, used) -> dict[str, pulp.LpAffineExpression]:
    gpus = {}
    for gpu_type in cluster.used_gpu_types():
        if used is not None:
            gpus[gpu_type] = pulp.lpSum(v for (node, _), v in sorted(used.items()) if cluster.node(node).gpu_type == gpu_type)
            continue
        count = problem.add_variable(f"gpus_{gpu_type}", 0, cluster.gpu_count(gpu_type), cat="Integer")
        problem += cluster.fractions_per_gpu * count >= pulp.lpSum(
            o.units * x[(m, i)] for m, i, o in items(options) if o.gpu_type == gpu_type
        )
        gpus[gpu_type] = pulp.lpSum([count])
    return gpus


def _latency(options, x, weights) -> pulp.LpAffineExpression:
    return pulp.lpSum(weights[m] * o.latency_s * x[(m, i)] for m, i, o in items(options) if weights.get(m, 0.0) > 0)


def _stage_expr(problem, options, x, gpus, stage) -> MilpStage:
    if isinstance(stage, LatencySum):
        llms = tuple(m for m in options if stage.weights.get(m, 0.0) > 0)
        return MilpStage(stage.name, _latency(options, x, stage.weights), llms=llms)
    if isinstance(stage, MaxLatencySum):
        # z >= each row's latency sum
        z = problem.add_variable("z", 0)
        for r, row in enumerate(stage.weights.values()):
            problem += z >= _latency(options, x, row), f"ratio{r}"
        llms = tuple(m for m in options if any(row.get(m, 0.0) > 0 for row in stage.weights.values()))
        return MilpStage(stage.name, pulp.lpSum([z]), llms=llms)
    if isinstance(stage, GpuCount):
        return MilpStage(stage.name, pulp.lpSum(stage.cost[g] * n for g, n in sorted(gpus.items()) if stage.cost.get(g, 0) > 0))
    return MilpStage(stage.name, pulp.lpSum(o.units * x[(m, i)] for m, i, o in items(options)))


def add_placement_cut(mm: MilpModel, allocation: Allocation) -> None:
    """Forbid `allocation` and every allocation at least as hard to place (formulation.cut_rows)."""
    fewer = []
    for r, row in enumerate(cut_rows(mm.options, allocation)):
        flag = mm.problem.add_variable(f"cut{mm.cuts}_{r}", cat="Binary")
        big = sum(k for k, _ in row.terms)
        mm.problem += _row(mm.x, row) <= row.rhs + big * (1 - flag), f"cut{mm.cuts}_{r}"
        fewer.append(flag)
    mm.problem += pulp.lpSum(fewer) >= 1, f"cut{mm.cuts}"
    mm.cuts += 1


def add_combination_cut(mm: MilpModel, allocation: Allocation, llms, relax=0) -> None:
    """Forbid the options `allocation` gives the LLMs `llms` together (a plan that breaks an SLO
    beyond the solver's feasibility tolerance, or one seen in a tie search: then `relax` is
    1 - probe, and the cut holds only while the probe is 1)."""
    chosen = [
        mm.x[(m, i)]
        for m in llms
        for i, o in enumerate(mm.options[m])
        if configuration(o) == configuration(allocation.of(m))
    ]
    mm.problem += pulp.lpSum(chosen) <= len(chosen) - 1 + relax, f"combination{mm.cuts}"
    mm.cuts += 1


def open_window(mm: MilpModel, stage: MilpStage, value: float) -> None:
    """Keep the model to plans within TIE_WINDOW of `value`; `forbid(..., probe=True)` cuts hold
    until `close_window` (a binary fixed to 1, then to 0)."""
    mm.problem += stage.expr <= value + TIE_WINDOW * max(1.0, abs(value)), f"window_{stage.name}"
    probe = mm.problem.add_variable(f"probe_{stage.name}", cat="Binary")
    probe.lowBound = probe.upBound = 1
    mm.probe = probe


def forbid(mm: MilpModel, allocation: Allocation, llms, probe: bool = False) -> None:
    relax = 1 - mm.probe if probe and mm.probe is not None else 0
    add_combination_cut(mm, allocation, llms, relax=relax)


def close_window(mm: MilpModel, stage: MilpStage) -> None:
    """Release the probe cuts; the window stays, so later stages choose among its plans."""
    if mm.probe is not None:
        mm.probe.lowBound = mm.probe.upBound = 0


@dataclass(frozen=True)
class StageResult:
    status: str
    value: float | None
    bound: float
    wall_time_s: float


def _solver(time_limit_s: float, workers: int):
    # no optimality gap: HiGHS's default (1e-4 relative, 1e-6 absolute) returns a slightly slower
    # plan as optimal where options nearly tie, and its value as the bound
    highs = _QuietHiGHS(
        msg=False, timeLimit=max(time_limit_s, 0.01), threads=workers, random_seed=0, gapRel=0.0, gapAbs=0.0
    )
    if highs.available():
        return highs
    return pulp.PULP_CBC_CMD(msg=False, timeLimit=max(time_limit_s, 0.01), threads=workers)


# File descriptor 1 belongs to the whole process: one thread at a time may point it elsewhere.
_STDOUT_LOCK = threading.Lock()


@contextmanager
def _quiet_stdout():
    """Point file descriptor 1 at /dev/null, and back. Held under a lock: solves run side by side
    (search.references solves the workflows alone on two threads), and interleaved save/restore
    pairs would leave stdout on /dev/null for good (`plan --backend milp --json` printed nothing)."""
    with _STDOUT_LOCK:
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as devnull:
                os.dup2(devnull.fileno(), 1)
                yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


class _QuietHiGHS(pulp.HiGHS):
    """PuLP's HiGHS interface, its solver object built with stdout silenced: highspy prints the
    HiGHS banner from C++ on file descriptor 1 when the first Highs() is constructed, before
    PuLP can set output_flag (msg=False); the solve itself is quiet. Only the construction is
    silenced, so a solve never holds stdout away from the rest of the process."""

    def createAndConfigureSolver(self, lp):
        with _quiet_stdout():
            super().createAndConfigureSolver(lp)


def solve_stage(mm: MilpModel, stage: MilpStage, time_limit_s: float, workers: int, hint=None):
    """Minimise one stage; (result, decoded allocation or None). `hint` is not used by HiGHS."""
    mm.problem.setObjective(stage.expr)
    solver = _solver(time_limit_s, workers)
    mm.problem.solve(solver)
    status = mm.problem.status
    found = mm.problem.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if status == pulp.LpStatusInfeasible or mm.problem.sol_status == pulp.LpSolutionInfeasible:
        return StageResult("infeasible", None, math.nan, 0.0), None
    if not found:
        return StageResult("unknown", None, math.nan, 0.0), None
    value = pulp.value(stage.expr)
    assert isinstance(value, (int, float)), value  # a plan was found: the stage has a number
    optimal = mm.problem.sol_status == pulp.LpSolutionOptimal
    bound = value if optimal else _dual_bound(mm, value)
    return StageResult("optimal" if optimal else "feasible", value, bound, 0.0), mm.decode()


def _dual_bound(mm: MilpModel, value: float) -> float:
    model = getattr(mm.problem, "solverModel", None)
    if model is None:
        return math.nan
    try:
        return float(model.getInfo().mip_dual_bound)
    except AttributeError:
        return math.nan


def fix_stage(mm: MilpModel, stage: MilpStage, value: float) -> None:
    mm.problem += stage.expr <= value + FIX_TOLERANCE * max(1.0, abs(value)), f"fix_{stage.name}"
