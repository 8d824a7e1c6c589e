"""Amortized planning of many scenarios that share a cluster: what a what-if grid reuses, exactly.

A *family* is a list of scenarios with the same cluster, LLMs, workflows and objective that differ
only in their arrival rates (one line or block of a what-if grid). `plan_family` returns, for
each scenario, the plan an independent `make_plan` of it returns (same objective value, same
allocation), found with less work (docs/capacity.md states each argument in full):

* **Options and profiles once.** An LLM's options depend only on the cluster and its own offered
  rate; they are kept per (LLM, offered rate), and each replica shape's profile curve and most
  replicas, which do not depend on rates, once per family.
* **References once per workflow and rate.** The egalitarian ref_w is the optimum of workflow w
  alone on the cluster at its own rate: each distinct (w, rate) is solved once, as a chain of its own.
* **Neighbours' optima as hints**, and placement cuts proven on the cluster shared by every model.
* **The unconstrained optimum** (`_unconstrained`): each LLM at its fastest option, when those
  place together and every other option is slower by more than the model's rounding.
* **Certified blocks** (`_certify`): after a solve returns A*, one CP-SAT feasibility model proves
  A* the unique optimum of a block K of the next scenarios.

Why a certificate is exact. Write L_{o,k} for the latency of option o at scenario k. Row r of the
first stage is R_{r,k}(B) = sum_m w^r_{m,k} L_{B_m,k} (one row for a latency sum, one per
workflow for the egalitarian ratio z = max_r R_r). A rival B ties or beats A* at k only if every
row stays within the margin of z_k(A*); since

    R_{r,k}(B) - z_k(A*) = sum_m w^r_{m,k} (L_{B_m,k} - L_{A*_m,k}) - (z_k(A*) - R_{r,k}(A*))
                        >= sum_m min_{k in K} w^r_{m,k} (L_{B_m,k} - L_{A*_m,k}) - max_{k in K} slack_{r,k},

a rival for some k of the block satisfies, for every row, the *separable* (per LLM, linear in the
option variables) inequality sum_m gap^r_m(B_m) <= margin + max_k slack_{r,k}. `_rival_exists`
asks for a placeable B (capacity rows, placement cuts) that changes an LLM of A*'s binding rows and
meets them all: if there is none, A* wins stage 1 at every k. A B that keeps the binding rows'
LLMs has the same binding rows, so its ratio is never below A*'s; a second model adds the mean
stage's row to separate those. The margin is 2 |M| grid steps of the stage
(planner/allocation/cpsat.py, latency_step): CP-SAT rounds each term by at most half a step, so
a rival worse by more keeps its order, and the independent solve at k returns A* too. A* must be among every k's pruned options, and the
objective latency stages then share units (min_latency; GPU-count stages read the placement).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Sequence

from ortools.sat.python import cp_model

from scepsy.models.errors import ScepsyError
from scepsy.models.instance.allocation import Allocation
from scepsy.models.instance.instance import Instance
from scepsy.models.plan.plan import Plan
from scepsy.placement.feasibility.placeability import Placer, PlacementCheck, check_placement
from scepsy.placement.feasibility.solver import cpsat_solver
from scepsy.planner.allocation import cpsat
from scepsy.planner.allocation.formulation import supported_options
from scepsy.planner.allocation.objective import (
    LatencySum, MaxLatencySum, Objective, ShareUnits, build_objective, latency_rows, needs_references,
)
from scepsy.planner.allocation.options import Option, configuration, options_allocation
from scepsy.planner.allocation.planning import make_plan
from scepsy.planner.allocation.search import (
    Outcome, PlanSettings, assemble_plan, placer_for, plan_options, solo_problem, solo_settings, solve_at_load, stage_values,
)

# a rival must lose by more than ROUNDING_SAFETY x |M| grid steps of the stage
# (planner/allocation/cpsat.py, latency_step): then the model's rounding, at most half a step per term, cannot reverse the order
ROUNDING_SAFETY = 2.0
DELTA_STEPS = 1e4  # integer steps of a certificate row per margin (floor rounding keeps it a lower bound)
BINDING_TOLERANCE = 1e-4  # rows within this share of the max ratio count as binding
GRID_STAGE_PARAMETERS = (("linearization_level", 0), ("symmetry_level", 0))  # CP-SAT, for the stage solves
FIRST_BLOCK = 1  # scenarios certified at once after a solve (doubled after each success)

Key = tuple[str, int, int, int]  # an option's choice: (gpu_type, tp, share, replicas)


@dataclass(frozen=True)
class Answer:
    """One scenario's plan, or why it has none, and how it was found (`solved`: a CP-SAT solve;
    `certified`: proven optimal by a block certificate; `independent`: a plain make_plan)."""

    plan: Plan | None
    error: ScepsyError | None
    method: str


@dataclass(frozen=True)
class Problem:
    """One scenario's allocation problem: the instance at its rates and its objective."""

    instance: Instance
    objective: Objective


def plan_family(
    instances: Sequence[Instance], settings: PlanSettings, reuse: bool = True, placer: Placer = check_placement,
    progress: Callable[[int], None] | None = None,
) -> list[Answer]:
    """The plan of each scenario (same cluster and structure, rates differ), in order.

    `reuse=False` plans each one with an independent make_plan (the reference the reuse is tested
    against). `progress(n)` is called as n more scenarios are done."""
    done = progress or (lambda n: None)
    if not reuse or not _certifiable_kind(instances[0], settings):
        return [_independent(instance, settings, placer, done) for instance in instances]
    start = time.perf_counter()
    cache: dict = {}
    # latency objectives: the optimum does not depend on how placeability enters the model, and
    # lazy placement cuts prove it faster than the placement counts on these families, and CP-SAT
    # without its LP relaxation and symmetry detection faster still (bench/whatif_amortized.py)
    settings = replace(settings, placement_counts_limit=0, stage_parameters=GRID_STAGE_PARAMETERS, prune_to_warm_start=True)
    references = _family_references(instances, settings, placer, cache)
    problems: list[Problem | ScepsyError] = []
    for instance, refs in zip(instances, references):
        problems.append(refs if isinstance(refs, ScepsyError) else Problem(instance, build_objective(instance, refs)))
    outcomes = _chain(problems, settings, placer, cache, done)
    answers = []
    for problem, (outcome, method) in zip(problems, outcomes):
        if isinstance(outcome, ScepsyError) or not isinstance(problem, Problem):
            answers.append(Answer(None, outcome, "infeasible"))
        else:
            plan = assemble_plan(problem.instance, problem.objective, outcome, settings, start)
            answers.append(Answer(plan, None, method))
    return answers


def _independent(instance: Instance, settings: PlanSettings, placer: Placer, done) -> Answer:
    try:
        answer = Answer(make_plan(instance, settings, placer), None, "independent")
    except ScepsyError as error:
        answer = Answer(None, error, "infeasible")
    done(1)
    return answer


def _certifiable_kind(instance: Instance, settings: PlanSettings) -> bool:
    """Latency stages then share units, exact CP-SAT: what the certificate covers."""
    return instance.objective == "min_latency" and settings.backend == "cpsat" and settings.epsilon in (None, 0.0)


def _family_references(instances, settings: PlanSettings, placer: Placer, cache: dict) -> list:
    """ref_w of every scenario (None where not needed), each distinct (workflow, rate) solved
    once as a family of solo problems; a scenario whose solo problem fails gets that error."""
    first = instances[0]
    if not needs_references(first, first.objective):
        return [None] * len(instances)
    solo = solo_settings(first, settings)
    by_workflow: dict[str, dict[float, float | ScepsyError]] = {}
    for workflow in (w.name for w in first.workflows if w.latency_slo_s is None):
        rates = sorted({_rate(i, workflow) for i in instances})
        problems = [Problem(*solo_problem(_at_rate(first, workflow, r), workflow)) for r in rates]
        outcomes = _chain(problems, solo, placer, cache, lambda n: None)
        by_workflow[workflow] = {
            r: o if isinstance(o, ScepsyError) else o.values[0] for r, (o, _) in zip(rates, outcomes)
        }
    references = []
    for instance in instances:
        refs = {w: values[_rate(instance, w)] for w, values in by_workflow.items()}
        failed = next((v for v in refs.values() if isinstance(v, ScepsyError)), None)
        references.append(failed or refs)
    return references


def _rate(instance: Instance, workflow: str) -> float:
    return next(w.arrival_rate for w in instance.workflows if w.name == workflow)


def _at_rate(instance: Instance, workflow: str, rate: float) -> Instance:
    return instance.with_arrival_rates({workflow: rate})


# ---------------------------------------------------------------------------------------------
# The chain: solve, then certify blocks of the following scenarios with the same optimum


def _chain(problems, settings: PlanSettings, placer: Placer, cache: dict, done) -> list[tuple]:
    """(Outcome or error, method) per problem, in order."""
    results: list[tuple] = [()] * len(problems)
    options_at = ScenarioOptions(problems, settings, cache)
    hint: Allocation | None = None
    pause = _Backoff()
    i = 0
    while i < len(problems):
        problem = problems[i]
        if isinstance(problem, ScepsyError):
            results[i] = (problem, "infeasible")
            i, _ = i + 1, done(1)
            continue
        if options_at(i)[1] == 0 and all(options_at(i)[0].values()):
            free = _unconstrained(problem, options_at(i)[0], placer)
            if free is not None:
                results[i] = (free, "unconstrained")
                hint = free.allocation
                i, _ = i + 1, done(1)
                continue
        try:
            deadline = time.perf_counter() + settings.time_limit_s
            outcome = solve_at_load(
                problem.instance, problem.objective, settings, placer, deadline, hint, cache, options_at.unplaceable
            )
        except ScepsyError as error:
            results[i] = (error, "infeasible")
            i, _ = i + 1, done(1)
            continue
        results[i] = (outcome, "solved")
        hint = outcome.allocation
        i, _ = i + 1, done(1)
        if outcome.status != "optimal" or options_at(i - 1)[1] != 0 or pause.skip():
            continue
        before = i
        i = _certify_forward(problems, i, outcome, options_at, settings, placer, results, done)
        pause.record(i > before)
    return results


class ScenarioOptions:
    """The options of each scenario of a chain (`options_at(k)` -> (options, epsilon), computed
    once), the chain's LLMs in the instance's order, and the allocations proven unplaceable on the
    family's cluster: cuts for every model of every chain of the family (solo chains' cuts hold
    for joint models and back: a cut forbids allocations with at least as many replicas of each
    shape, at any rates, and placeability does not depend on the rates)."""

    def __init__(self, problems, settings: PlanSettings, cache: dict):
        self.problems, self.settings, self.cache = problems, settings, cache
        self.options: dict[int, tuple] = {}
        self.unplaceable: list[Allocation] = cache.setdefault("unplaceable", [])
        first = next((p for p in problems if not isinstance(p, ScepsyError)), None)
        self.llms = [m.name for m in first.instance.llms] if first is not None else []

    def __call__(self, k: int):
        if k not in self.options:
            problem = self.problems[k]
            self.options[k] = plan_options(problem.instance, self.settings, problem.objective, self.cache)
        return self.options[k]


@dataclass
class _Backoff:
    """Where the optimum changes at every rate, a certificate fails and costs about a solve: after
    f failures in a row, the next 2^f - 1 solves skip it (a success resets)."""

    failures: int = 0
    waiting: int = 0

    def skip(self) -> bool:
        if self.waiting > 0:
            self.waiting -= 1
            return True
        return False

    def record(self, success: bool) -> None:
        self.failures = 0 if success else self.failures + 1
        self.waiting = 2 ** self.failures - 1


def _certify_forward(problems, i: int, anchor: Outcome, options_at, settings, placer, results, done) -> int:
    """Certify blocks of scenarios from i on with the anchor's optimum; the first index left."""
    size = FIRST_BLOCK
    while i < len(problems) and size >= 1:
        block = []
        for k in range(i, min(i + size, len(problems))):
            if isinstance(problems[k], ScepsyError) or options_at(k)[1] != 0:
                break
            if not _holds(options_at(k)[0], anchor.allocation):
                break
            block.append(k)
        if not block:
            return i
        if _certify(problems, block, anchor.allocation, options_at, settings, placer):
            for k in block:
                results[k] = (_certified_outcome(problems[k], options_at(k)[0], anchor), "certified")
            done(len(block))
            i += len(block)
            size = 2 * len(block)
        else:
            return i  # the optimum changes within the block: solve at its start
    return i


def _holds(options: dict[str, list[Option]], allocation: Allocation) -> bool:
    """The allocation is made of this scenario's (pruned) options."""
    return all(configuration(c) in {configuration(o) for o in options[c.llm]} for c in allocation.llms)


def _certified_outcome(problem: Problem, options, anchor: Outcome) -> Outcome:
    """What a solve at this scenario returns, given the certificate: the anchor's allocation and
    placement (placement depends on the cluster and allocation only), its values at these rates."""
    check: PlacementCheck = anchor.placement_check
    values = stage_values(problem.objective, options, problem.instance.cluster, anchor.allocation, check.placement)
    note = "certified optimal without a solve: the optimum of a neighbouring rate (docs/capacity.md)"
    return Outcome(anchor.allocation, check, "optimal", values, values[0], iterations=0, cuts=0, notes=(note,))


def _unconstrained(problem: Problem, options: dict[str, list[Option]], placer: Placer) -> Outcome | None:
    """Each LLM at its own fastest option, when that places and each LLM's fastest option is
    fastest by a margin: then it is the optimum, without a solve (docs/capacity.md).

    Why: every stage row is a non-negative combination of LLM latencies, so no allocation has a
    row below this one's (also after the model's monotone integer rounding); any other allocation
    changes some LLM m to a slower option, which raises the separating stage (the mean latency
    after an egalitarian ratio, else the first stage) by w_m (L_o - L_m) > 2 grid steps, more
    than the rounding of its two terms (half a step each) can hide."""
    objective = problem.objective
    stages = objective.stages
    if objective.latency_limits or not isinstance(stages[0], (LatencySum, MaxLatencySum)):
        return None
    separating = stages[1] if isinstance(stages[0], MaxLatencySum) else stages[0]
    if not isinstance(separating, LatencySum) or not all(isinstance(s, (LatencySum, ShareUnits)) for s in stages[1:]):
        return None
    fastest = {m: min(opts, key=lambda o: (o.latency_s, o.units)) for m, opts in options.items()}
    margin = ROUNDING_SAFETY * cpsat.latency_step(options, separating)  # per changed LLM
    for m, opts in options.items():
        weight = separating.weights.get(m, 0.0)
        if any(o is not fastest[m] and weight * (o.latency_s - fastest[m].latency_s) <= margin for o in opts):
            return None
    allocation = options_allocation(problem.instance.cluster.fractions_per_gpu, fastest.values())
    check = placer_for(objective, placer)(problem.instance.cluster, allocation)
    if not check.placeable:
        return None
    values = stage_values(objective, options, problem.instance.cluster, allocation, check.placement)
    note = "optimal without a solve: every LLM at its fastest option, and they place (docs/capacity.md)"
    return Outcome(allocation, check, "optimal", values, values[0], iterations=0, cuts=0, notes=(note,))


# ---------------------------------------------------------------------------------------------
# The certificate


def _certify(problems, block: list[int], candidate: Allocation, options_at, settings, placer) -> bool:
    """True when `candidate` is the unique optimum of every scenario of `block` (module docstring)."""
    objective = problems[block[0]].objective
    stages = objective.stages
    if not isinstance(stages[0], (LatencySum, MaxLatencySum)) or objective.latency_limits:
        return False
    if not all(isinstance(s, (LatencySum, ShareUnits)) for s in stages[1:]):
        return False
    llms = [c.llm for c in candidate.llms]
    chosen = {c.llm: configuration(c) for c in candidate.llms}
    rows: dict[str, dict] = {}  # stage-1 row -> (llm, option key) -> min over k of delta
    slack: dict[str, float] = {}  # stage-1 row -> max over k of (z_A - row value of A)
    mean_gap: dict = {}
    binding: set[str] = set()
    first_step = mean_step = 0.0
    union: dict[tuple[str, Key], Option] = {}
    for k in block:
        options = options_at(k)[0]
        latency = {m: next(o.latency_s for o in options[m] if configuration(o) == chosen[m]) for m in llms}
        weights = latency_rows(problems[k].objective.stages[0])
        values = {r: sum(w * latency[m] for m, w in row.items()) for r, row in weights.items()}
        top = max(values.values())
        first_step = max(first_step, cpsat.latency_step(options, problems[k].objective.stages[0]))
        binding |= {m for r, v in values.items() if v >= top * (1 - BINDING_TOLERANCE) for m, w in weights[r].items() if w > 0}
        mean = problems[k].objective.stages[1] if len(stages) > 2 else None
        if mean is not None:
            mean_step = max(mean_step, cpsat.latency_step(options, mean))
        for r in weights:
            slack[r] = max(slack.get(r, 0.0), top - values[r])
        row_gaps = [(rows.setdefault(r, {}), row) for r, row in weights.items()]
        for m in llms:
            mine = latency[m]
            mean_weight = mean.weights.get(m, 0.0) if mean is not None else 0.0
            for o in options[m]:
                key = (m, configuration(o))
                union.setdefault(key, o)
                extra = o.latency_s - mine
                for gaps, row in row_gaps:
                    gap = row.get(m, 0.0) * extra
                    if gap < gaps.get(key, math.inf):
                        gaps[key] = gap
                if mean is not None and mean_weight * extra < mean_gap.get(key, math.inf):
                    mean_gap[key] = mean_weight * extra
    cluster = problems[block[0]].instance.cluster
    placer = placer_for(objective, placer)
    # the block's options only: a model over the whole chain's options with the others fixed off
    # asks the same question, but CP-SAT spends its time on the fixed terms
    options = {m: [o for (mm, _), o in sorted(union.items(), key=lambda kv: kv[0]) if mm == m] for m in options_at.llms}
    margin = ROUNDING_SAFETY * len(llms) * first_step
    # a rival ties or beats A* at stage 1 only if every row stays within the margin of z_A
    within = [(rows[r], margin + slack[r], margin) for r in sorted(rows)]
    # rivals that change an LLM of a binding row: none may stay within the margin on every row
    if _rival_exists(options_at.unplaceable, cluster, options, chosen, within, [], sorted(binding), settings, placer):
        return False
    others = [m for m in llms if m not in binding]
    if not others:
        return True
    if len(stages) <= 2:
        return False  # no mean stage to separate allocations that only change other LLMs
    # rivals that keep the binding LLMs tie at stage 1 at best: they must lose the mean stage
    mean_margin = ROUNDING_SAFETY * len(llms) * mean_step
    within.append((mean_gap, mean_margin, mean_margin))
    return not _rival_exists(options_at.unplaceable, cluster, options, chosen, within, sorted(binding), others, settings, placer)


def _coefficient(coefficients: dict[tuple[str, Key], int], llm: str, option: Option) -> float:
    return coefficients[(llm, configuration(option))]


def _rival_exists(
    unplaceable: list, cluster, options: dict[str, list[Option]], chosen: dict[str, Key], rows: list[tuple[dict, float, float]],
    keep: list[str], change: list[str], settings: PlanSettings, placer: Placer,
) -> bool:
    """Is there a placeable B of the block's `options` that keeps `keep` at the candidate's
    choice, changes at least one of `change`, and has sum_m gap[m, B_m] <= bound for every row
    (gap, bound, margin)?

    Data (the block's options, each row with its gaps floor-scaled on a grid of margin / 1e4, so a
    scaled row above its scaled bound proves the true row above the bound; the allocations proven
    unplaceable so far) -> the options some choice meeting every row can use (`supported_options`; most
    of the block's are slower than the candidate by more than any row allows) -> variables (the
    allocation model's x over those, its capacity rows) -> constraints (placement cuts; change;
    the rows) -> solve for feasibility -> a rival found is checked for placement, and cut off (for
    the whole family) if it does not place."""
    scaled = []  # each row on its integer grid: ({(llm, option key): coefficient}, right-hand side)
    for gaps, bound, margin in rows:
        if margin <= 0:
            return True  # nothing to separate by: treat as not proven
        step = margin / DELTA_STEPS
        scaled.append(({key: math.floor(gap / step) for key, gap in gaps.items()}, math.floor(bound / step)))
    candidates = {m: [o for o in opts if m not in keep or configuration(o) == chosen[m]] for m, opts in options.items()}
    kept = supported_options(candidates, [(partial(_coefficient, c), rhs) for c, rhs in scaled])
    if kept is None or all(len(kept[m]) == 1 and configuration(kept[m][0]) == chosen[m] for m in change):
        return False  # the rows alone leave no rival
    options = kept
    units_only = Objective("min_latency", (ShareUnits(),), {}, {})
    am = cpsat.build_allocation_model(cluster, options, units_only, placement_counts=False)
    model, x = am.model, am.x
    for allocation in unplaceable:
        cpsat.add_placement_cut(am, allocation)
    keyed = [((m, configuration(o)), (m, i)) for m, opts in options.items() for i, o in enumerate(opts)]
    index = {key: mi for key, mi in keyed}
    unchanged = [x[index[(m, chosen[m])]] for m in change if (m, chosen[m]) in index]
    if len(unchanged) == len(change):  # else an LLM to change has lost its candidate option: it changes
        model.add(sum(unchanged) <= len(change) - 1)
    for coefficients, rhs in scaled:
        terms = [(coefficients[key], x[mi]) for key, mi in keyed]
        model.add(cp_model.LinearExpr.weighted_sum([v for _, v in terms], [c for c, _ in terms]) <= rhs)
    deadline = time.perf_counter() + settings.time_limit_s
    while True:
        # presolve and probing as in planner/allocation/cpsat.py (they cost more than they save
        # here); no LP relaxation: faster on these feasibility models
        solver = cpsat_solver(
            deadline - time.perf_counter(), settings.workers,
            cp_model_presolve=False, cp_model_probing_level=0, linearization_level=0,
        )
        status = solver.solve(model)
        if status == cp_model.INFEASIBLE:
            return False
        if status != cp_model.FEASIBLE and status != cp_model.OPTIMAL:
            return True  # time limit: not proven
        rival = am.decode(solver)
        check = placer(cluster, rival)
        if check.placeable or not check.proven:
            return True  # a placeable rival (or one not proven unplaceable): not certified
        cpsat.add_placement_cut(am, rival)  # a cut holds for every scenario of the family
        unplaceable.append(rival)
        if time.perf_counter() >= deadline:
            return True
