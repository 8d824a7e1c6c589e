"""The objectives against exhaustive search, and the MILP backend against CP-SAT, on seeded
random instances (1 node of 2-4 GPUs, F = 4, with SLOs, two GPU types for min_cost and min_units).
min_units: a few seeds in every test run, the rest of its matrix in the exhaustive run."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from scepsy.models.errors import InfeasibleError, InputError
from scepsy.models.instance.instance import load_instance
from scepsy.models.plan.document import plan_json
from support.synthetic import random_instance
from scepsy.planner.allocation.loadfactor import capacity_bound
from scepsy.models.instance.placement_check import validate_placement
from scepsy.planner.allocation.search import PlanSettings
from scepsy.planner.allocation.planning import make_plan

from conftest import INSTANCES

DOMAINS = ([[0, 1], [2, 3]], [[0, 1, 2, 3]], [], [[0, 1, 2]])


def instance(seed: int, **overrides):
    rng = np.random.default_rng(5000 + seed)
    gpus = int(rng.choice([2, 3, 4]))
    return random_instance(
        seed,
        n_llms=int(rng.choice([2, 3])),
        gpus_per_node=gpus,
        domains=[d for d in DOMAINS[seed % 4] if max(d) < gpus],
        fractions_per_gpu=4,
        n_workflows=int(rng.choice([1, 2])),
        load=float(rng.choice([0.2, 0.4, 0.8])),
        **overrides,
    )


def solve(inst, backend):
    try:
        return make_plan(inst, PlanSettings(backend=backend))
    except InfeasibleError:
        return None


def agree(inst, backends=("cpsat", "bruteforce", "milp")):
    plans = {b: solve(inst, b) for b in backends}
    feasible = [p for p in plans.values() if p is not None]
    assert len(feasible) in (0, len(backends)), {b: p and p.objective_value for b, p in plans.items()}
    if feasible:
        values = [p.objective_value for p in feasible]
        assert max(values) - min(values) <= 2e-3 * max(abs(min(values)), 1e-9), values
        for plan in feasible:
            assert validate_placement(inst.cluster, plan.allocation, plan.placement) == []
    return plans


def slo_factor(seed):
    return float(np.random.default_rng(seed).choice([1.2, 2.0, 4.0]))


def seeds(every_run: int, total: int) -> list:
    """range(total), the seeds from `every_run` on in the exhaustive run only."""
    return [pytest.param(seed, marks=[] if seed < every_run else [pytest.mark.exhaustive]) for seed in range(total)]


@pytest.mark.parametrize("seed", range(50))
def test_milp_agrees_with_cpsat_and_bruteforce_on_min_latency(seed):
    agree(instance(seed))


@pytest.mark.parametrize("seed", range(30))
def test_social_welfare(seed):
    plans = agree(instance(seed, welfare="social"))
    plan = plans["cpsat"]
    if plan is not None and len(plan.prediction.workflows) > 1:
        inst = instance(seed, welfare="social")
        weights = {w.name: w.weight * w.arrival_rate for w in inst.workflows}
        mean = sum(weights[w.name] * w.latency_s for w in plan.prediction.workflows) / sum(weights.values())
        assert plan.objective_value == pytest.approx(mean, rel=1e-6)


@pytest.mark.parametrize("seed", range(40))
def test_min_gpus_meets_slos_with_fewest_gpus(seed):
    plans = agree(instance(seed, objective="min_gpus", slo_factor=slo_factor(seed)))
    plan = plans["cpsat"]
    if plan is not None:
        busy = {(r.node, s.gpu) for r in plan.placement.replicas for s in r.shards}
        assert plan.objective_value == len(busy)
        assert all(w.meets_slo is not False for w in plan.prediction.workflows)


def assert_fewest_units(inst, plans):
    """The min_units plan holds its objective value in share units, meets every SLO, and uses no
    more units than the min_gpus plan (which meets the same SLOs)."""
    plan = plans["cpsat"]
    if plan is None:
        return
    assert plan.objective_value == plan.allocation.units
    assert all(w.meets_slo is not False for w in plan.prediction.workflows)
    fewest_gpus = solve(inst.with_objective("min_gpus"), "cpsat")
    assert fewest_gpus is not None and plan.allocation.units <= fewest_gpus.allocation.units


@pytest.mark.parametrize("seed", seeds(10, 40))
def test_min_units_meets_slos_with_fewest_units(seed):
    inst = instance(seed, objective="min_units", slo_factor=slo_factor(seed))
    assert_fewest_units(inst, agree(inst))


@pytest.mark.parametrize("seed", seeds(4, 30))
def test_min_units_on_two_gpu_types(seed):
    inst = instance(seed, objective="min_units", slo_factor=slo_factor(seed), second_type_nodes=1)
    assert_fewest_units(inst, agree(inst))


@pytest.mark.parametrize("seed", range(30))
def test_min_cost_on_two_gpu_types(seed):
    inst = instance(seed, objective="min_cost", slo_factor=slo_factor(seed), second_type_nodes=1)
    plans = agree(inst)
    plan = plans["cpsat"]
    if plan is not None:
        types = {n.name: n.gpu_type for n in inst.cluster.nodes}
        busy = {(r.node, s.gpu) for r in plan.placement.replicas for s in r.shards}
        cost = sum(inst.cluster.gpu_types[types[node]].cost_per_hour or math.nan for node, _ in busy)  # min_cost: all priced
        assert plan.objective_value == pytest.approx(cost)
        for choice in plan.allocation.llms:  # all replicas of an LLM on its one gpu type
            assert {types[r.node] for r in plan.placement.replicas if r.llm == choice.llm} == {choice.gpu_type}


@pytest.mark.parametrize("seed", range(30))
def test_max_throughput_is_the_largest_feasible_load(seed):
    inst = instance(seed, objective="max_throughput", slo_factor=slo_factor(seed))
    plans = agree(inst)
    plan = plans["cpsat"]
    if plan is None:
        return
    load = plan.objective_value
    assert plan_json(plan)["load_factor"] == pytest.approx(load)
    assert load <= capacity_bound(inst, PlanSettings()) * (1 + 1e-9)
    assert all(w.meets_slo is not False for w in plan.prediction.workflows)
    assert plan.prediction.workflows[0].arrival_rate_rps == pytest.approx(inst.workflows[0].arrival_rate * load)
    above = inst.scaled(load * 1.01).with_objective("min_gpus")  # any feasibility check will do
    assert load * 1.01 > plan.bound and solve(above, "bruteforce") is None  # monotone feasibility


@pytest.mark.parametrize("objective", ["min_gpus", "min_units"])
def test_enumerate_refuses_gpu_and_unit_objectives(objective):
    inst = load_instance(INSTANCES / "beam-4xa6000.yaml").with_objective(objective)
    with pytest.raises(InputError):
        make_plan(inst, PlanSettings(backend="enumerate"))


# beam-4xa6000 shares each A6000 in 10 units: at 2 req/s min_gpus takes one GPU and fills it (10
# units), at 5 req/s two (20 units); min_units holds only what meets the SLO on as many GPUs
@pytest.mark.parametrize("rate", [2.0, 5.0])
def test_min_units_holds_fewer_units_than_min_gpus_on_a_sharing_cluster(rate):
    inst = load_instance(INSTANCES / "beam-4xa6000.yaml").with_arrival_rates({"beam": rate}).with_latency_slos({"beam": 8.0})
    assert inst.cluster.fractions_per_gpu > 1
    fewest_gpus = make_plan(inst.with_objective("min_gpus"))
    fewest_units = {b: make_plan(inst.with_objective("min_units"), PlanSettings(backend=b)) for b in ("cpsat", "milp")}
    plan = fewest_units["cpsat"]
    assert plan.allocation.units < fewest_gpus.allocation.units
    assert fewest_units["milp"].objective_value == plan.objective_value == plan.allocation.units
    assert all(w.meets_slo for w in plan.prediction.workflows)
    assert plan.status == "optimal" and plan.bound == plan.objective_value
    assert len(plan.placement.busy_gpus()) == fewest_gpus.objective_value
    assert validate_placement(inst.cluster, plan.allocation, plan.placement) == []


def test_min_units_plans_are_byte_identical():
    """Two workflows with SLOs (egalitarian latency stages break the ties of the units)."""
    inst = load_instance(INSTANCES / "combined-8xh100.yaml").with_latency_slos({"beam": 1.3, "rag": 0.6}).with_objective("min_units")
    first, again = (json.dumps(plan_json(make_plan(inst), include_wall_time=False), indent=2) for _ in range(2))
    assert first == again


def test_min_cost_needs_prices():
    with pytest.raises(InputError) as err:
        load_instance(INSTANCES / "beam-4xa6000.yaml").with_objective("min_cost")
    assert "cost_per_hour" in (err.value.field or "")


def test_shipped_instances_milp_equals_cpsat():
    for name in ("beam-8xa6000.yaml", "rag-8xa6000.yaml", "combined-8xh100.yaml"):
        inst = load_instance(INSTANCES / name)
        cpsat, milp = make_plan(inst), make_plan(inst, PlanSettings(backend="milp"))
        assert milp.objective_value == pytest.approx(cpsat.objective_value, rel=1e-3), name
        assert milp.status == "optimal"


# ---------------------------------------------------------------------------------------------
# Optima exactly on an SLO, and ties closer than CP-SAT's integer grid


def exact_slo_instance(seed: int, objective: str):
    """Each workflow's SLO set to its latency in the exact min_latency plan: that plan meets every
    SLO exactly, so the GPU objectives must be feasible in every backend."""
    inst = instance(seed)
    best = solve(inst, "bruteforce")
    if best is None:
        return None
    slos = {w.name: w.latency_s for w in best.prediction.workflows}
    inst = inst.with_latency_slos(slos)
    return inst.with_objective(objective) if objective != "min_cost" else inst.with_objective("min_cost")


EXACT_SLO_CASES = [
    *[pytest.param(seed, objective, id=f"{objective}-{seed}") for objective in ("min_gpus", "max_throughput") for seed in range(30)],
    *[pytest.param(seed, "min_units", id=f"min_units-{seed}", marks=[] if seed < 8 else [pytest.mark.exhaustive]) for seed in range(30)],
]


@pytest.mark.parametrize("seed, objective", EXACT_SLO_CASES)
def test_an_optimum_exactly_on_the_slo_is_feasible_in_every_backend(seed, objective):
    inst = exact_slo_instance(seed, objective)
    if inst is None:
        return
    plans = agree(inst)
    found = {backend: p for backend, p in plans.items() if p is not None}
    assert len(found) == len(plans), "a plan meeting every SLO exactly exists"
    for plan in found.values():
        assert all(w.meets_slo for w in plan.prediction.workflows)
        assert plan.bound <= found["bruteforce"].objective_value * (1 + 1e-12) or objective == "max_throughput"
    if objective == "max_throughput":  # the load factor 1 meets the SLOs exactly, and no more
        assert all(p.objective_value == pytest.approx(1.0, rel=2e-3) for p in found.values())


def _slower(llm, factor: float):
    """The LLM with every latency of its profile multiplied by `factor`."""
    curves = {
        key: tuple(
            replace(c, latencies_s={m: np.asarray(v) * factor for m, v in c.latencies_s.items()}) for c in curves
        )
        for key, curves in llm.profile.curves.items()
    }
    return replace(llm, profile=replace(llm.profile, curves=curves))


def near_tie_instance(seed: int):
    """Two or three copies of one LLM with the same statistics, each a hair slower than the one
    before (1e-7 relative: far below the 1e-5 integer grid), so that mirrored plans nearly tie."""
    inst = instance(seed)
    first = inst.llms[0]
    clones = tuple(_slower(replace(first, name=m.name), 1 + k * 1e-7) for k, m in enumerate(inst.llms))
    workflows = tuple(
        replace(w, stages=tuple(replace(s, invocations=2.0, parallelism=1.0) for s in w.stages)) for w in inst.workflows
    )
    return replace(inst, llms=clones, workflows=workflows)


@pytest.mark.parametrize("seed", range(40))
def test_near_ties_resolve_exactly_and_the_bound_is_a_bound(seed):
    inst = near_tie_instance(seed)
    plans = {b: solve(inst, b) for b in ("cpsat", "bruteforce", "milp")}
    exact = plans["bruteforce"]
    if exact is None:
        assert all(p is None for p in plans.values())
        return
    for backend, plan in plans.items():
        assert plan is not None, backend
        assert plan.objective_value == pytest.approx(exact.objective_value, rel=1e-12, abs=0), backend
        assert plan.bound <= exact.objective_value * (1 + 1e-12), backend
        assert plan.status == "optimal"
