"""Allocation search: CP-SAT against exhaustive search on seeded random instances, enumeration as a
baseline that is never better, the egalitarian objective, determinism and the time limit."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from scepsy.models.instance.allocation import Allocation, LlmAllocation
from scepsy.models.performance.alp import predict
from scepsy.models.errors import InfeasibleError
from scepsy.models.instance.instance import load_instance
from scepsy.models.plan.document import plan_json
from support.synthetic import random_instance
from scepsy.planner.allocation.options import SearchSpace, all_options
from scepsy.models.instance.placement_check import validate_placement
from scepsy.planner.allocation.search import PlanSettings, references
from scepsy.placement.feasibility.placeability import check_placement
from scepsy.planner.allocation.planning import make_plan

from conftest import INSTANCES, profile_rows

DOMAIN_LAYOUTS = ([[0, 1], [2, 3]], [[0, 1, 2, 3]], [], [[0, 1, 2]])
SEEDS = range(240)


def small_instance(seed: int):
    """1 node of 2-4 GPUs, 2-3 LLMs, F = 4, one or two workflows, loads from light to impossible.
    Every third instance clones one LLM's model and profile into all, so that LLMs share replica
    shapes (what the placement counts must add up)."""
    rng = np.random.default_rng(1000 + seed)
    gpus = int(rng.choice([2, 3, 4]))
    domains = [d for d in DOMAIN_LAYOUTS[seed % 4] if max(d) < gpus]
    instance = random_instance(
        seed,
        n_llms=int(rng.choice([2, 3])),
        gpus_per_node=gpus,
        domains=domains,
        fractions_per_gpu=4,
        n_workflows=int(rng.choice([1, 1, 2])),
        load=float(rng.choice([0.3, 0.6, 1.0, 1.5])),
    )
    if seed % 3 == 2:
        first = instance.llms[0]
        clones = tuple(replace(first, name=m.name) for m in instance.llms)
        instance = replace(instance, llms=clones)
    return instance


def solve(instance, backend):
    try:
        return make_plan(instance, PlanSettings(backend=backend))
    except InfeasibleError:
        return None


@pytest.fixture(scope="module")
def outcomes():
    return {seed: {b: solve(small_instance(seed), b) for b in ("cpsat", "bruteforce", "enumerate")} for seed in SEEDS}


def test_random_instances_cover_feasible_and_infeasible(outcomes):
    feasible = sum(o["bruteforce"] is not None for o in outcomes.values())
    assert 0.3 * len(SEEDS) < feasible < 0.8 * len(SEEDS)
    egalitarian = sum(o["bruteforce"] is not None and "mean_latency_s" in plan_json(o["bruteforce"]) for o in outcomes.values())
    assert egalitarian >= 20


@pytest.mark.parametrize("seed", SEEDS)
def test_cpsat_equals_bruteforce(outcomes, seed):
    cpsat, brute = outcomes[seed]["cpsat"], outcomes[seed]["bruteforce"]
    assert (cpsat is None) == (brute is None)
    if brute is None:
        return
    assert cpsat.status == "optimal"
    assert cpsat.objective_value == pytest.approx(brute.objective_value, rel=1e-3)
    instance = small_instance(seed)
    assert validate_placement(instance.cluster, cpsat.allocation, cpsat.placement) == []
    assert validate_placement(instance.cluster, brute.allocation, brute.placement) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_enumerate_is_never_better(outcomes, seed):
    cpsat, enum = outcomes[seed]["cpsat"], outcomes[seed]["enumerate"]
    if enum is not None:
        assert cpsat is not None
        assert enum.objective_value >= cpsat.objective_value * (1 - 1e-3)
        instance = small_instance(seed)
        assert validate_placement(instance.cluster, enum.allocation, enum.placement) == []


def test_dominance_pruning_drops_options():
    instance = load_instance(INSTANCES / "rag-8xa6000.yaml")
    pruned, full = all_options(instance), all_options(instance, prune=False)
    assert sum(map(len, pruned.values())) < sum(map(len, full.values()))


def test_plan_prediction_matches_objective(outcomes):
    for seed, o in outcomes.items():
        plan = o["cpsat"]
        if plan is None or len(plan.prediction.workflows) != 1:
            continue
        assert plan.objective_value == pytest.approx(plan.prediction.workflows[0].latency_s)


def test_egalitarian_favours_the_workflow_with_the_tight_slo(write_instance):
    """Two workflows on disjoint LLMs share one GPU: tightening b's SLO shifts units to its LLM."""
    profiles = {"gen.csv": profile_rows(tps=(1,), light_s=1.0, capacity_rps=20.0),
                "ver.csv": profile_rows(tps=(1,), light_s=2.0, capacity_rps=8.0)}

    def one_gpu(slo_a, slo_b):
        def mutate(doc):
            doc["cluster"]["nodes"] = [{"name": "n", "gpu_type": "A6000", "gpus": 1}]
            for llm in doc["llms"]:
                llm["tp_degrees"] = [1]
            doc["workflows"] = [
                {"name": "a", "arrival_rate": 2.5, "latency_slo_s": slo_a,
                 "stages": [{"llm": "gen", "invocations": 4.0, "parallelism": 1.0}]},
                {"name": "b", "arrival_rate": 0.6, "latency_slo_s": slo_b,
                 "stages": [{"llm": "ver", "invocations": 2.0, "parallelism": 1.0}]},
            ]
        return mutate

    balanced = make_plan(load_instance(write_instance(one_gpu(10.0, 10.0), profiles)))
    tight = make_plan(load_instance(write_instance(one_gpu(10.0, 1.0), profiles, name="tight.yaml")))
    for plan in (balanced, tight):
        latency = {w.name: w.latency_s for w in plan.prediction.workflows}
        slo = {w.name: w.latency_slo_s or math.nan for w in plan.prediction.workflows}  # every workflow has one
        assert plan.objective_value == pytest.approx(max(latency[w] / slo[w] for w in latency))
        assert plan.instance is not None
        brute = make_plan(load_instance(plan.instance), PlanSettings(backend="bruteforce"))
        assert plan.objective_value == pytest.approx(brute.objective_value, rel=1e-3)
    assert tight.allocation.of("ver").units > balanced.allocation.of("ver").units
    assert tight.prediction.workflow("b").latency_s < balanced.prediction.workflow("b").latency_s
    assert tight.prediction.workflow("a").latency_s > balanced.prediction.workflow("a").latency_s


def test_egalitarian_reference_is_the_solo_optimum():
    instance = load_instance(INSTANCES / "combined-8xh100.yaml")
    plan = make_plan(instance)
    ratios = []
    for workflow in instance.workflows:
        alone = make_plan(instance.only_workflow(workflow.name)).prediction.workflows[0].latency_s
        ratios.append(plan.prediction.workflow(workflow.name).latency_s / alone)
        assert ratios[-1] >= 1 - 1e-6  # sharing the cluster never beats having it alone
    assert plan.objective_value == pytest.approx(max(ratios), rel=1e-6)


def test_same_input_same_plan():
    instance = load_instance(INSTANCES / "rag-8xa6000.yaml")
    first = json.dumps(plan_json(make_plan(instance), include_wall_time=False), indent=2)
    again = json.dumps(plan_json(make_plan(load_instance(INSTANCES / "rag-8xa6000.yaml")), include_wall_time=False), indent=2)
    assert first == again


# CP-SAT's deterministic time (work units, the same on any machine at one worker) stops the solves
# at the same point on a fast or a loaded machine, where a wall-clock limit would stop them
# anywhere: none, the solo references only, and the joint solve cut short
@pytest.mark.parametrize("deterministic_s", [0.0, 0.02, 0.05])
def test_a_solve_stopped_by_its_limit_returns_a_placed_plan_with_a_true_gap(deterministic_s):
    instance = load_instance(INSTANCES / "combined-8xh100.yaml")
    optimum = make_plan(instance)
    assert optimum.status == "optimal"
    stopped = make_plan(instance, PlanSettings(stage_parameters=(("max_deterministic_time", deterministic_s),)))
    assert stopped.status == "feasible"  # stopped early: never claimed optimal
    assert validate_placement(instance.cluster, stopped.allocation, stopped.placement) == []
    if deterministic_s == 0.0:  # no time to search: the warm start, the cheapest placeable plan
        assert any("returning the warm start" in note for note in stopped.solver.notes)
    if math.isnan(stopped.gap):  # no gap claimed: the solver had no bound
        return
    # the stopped plan's true value: its egalitarian ratio against the proven solo optima
    true_refs = references(instance, PlanSettings(), check_placement)
    assert true_refs is not None
    true_value = max(
        w.weight * stopped.prediction.workflow(w.name).latency_s / true_refs[w.name] for w in instance.workflows
    )
    # the claimed bound holds for the true optimum, and the claimed gap covers the true one
    assert stopped.bound <= optimum.objective_value * (1 + 1e-9)
    assert stopped.gap == pytest.approx((stopped.objective_value - stopped.bound) / stopped.objective_value)
    assert (true_value - optimum.objective_value) / true_value <= stopped.gap + 1e-9


def test_whole_gpu_ablation_uses_whole_gpus():
    instance = load_instance(INSTANCES / "rag-4xa6000.yaml")
    plan = make_plan(instance, PlanSettings(space=SearchSpace(whole_gpus_only=True, tp_one_only=True)))
    assert all(c.share == 10 and c.tp == 1 for c in plan.allocation.llms)
    assert plan.objective_value >= make_plan(instance).objective_value


def test_planning_does_not_change_the_instance():
    instance = load_instance(INSTANCES / "beam-8xa6000.yaml")
    before = (instance.workflows, instance.cluster, tuple((m.name, m.tp_degrees) for m in instance.llms))
    make_plan(instance)
    assert (instance.workflows, instance.cluster, tuple((m.name, m.tp_degrees) for m in instance.llms)) == before


def test_prediction_of_the_plan_is_feasible_and_placed():
    instance = load_instance(INSTANCES / "rag-16xa6000.yaml")
    plan = make_plan(instance)
    assert predict(instance, plan.allocation).feasible
    total = sum(len(r.shards) * r.shards[0].units for r in plan.placement.replicas)
    assert total == plan.allocation.units
    manual = Allocation(10, tuple(LlmAllocation(c.llm, c.gpu_type, c.tp, c.share, c.replicas) for c in plan.allocation.llms))
    assert manual == plan.allocation


def _measured(rows):
    return pd.DataFrame(
        [dict(gpu_type="A6000", tp=1, fraction=0.5, arrival_rate=r, throughput=r, latency_mean=l,
              latency_p50=l, latency_p90=1.3 * l, latency_p99=1.4 * l) for r, l in rows]
    )


def test_two_halves_of_one_gpu(write_instance):
    """Regression (the shape of the end-to-end instances on a CPU engine): F = 2, one GPU, each LLM profiled at 0.5 only,
    with the noisy, non-monotone latencies of a real replay, so that each LLM keeps exactly one
    option and both share one replica shape: the placement counts must allow both replicas."""
    profiles = {"gen.csv": _measured([(0.900518, 0.378498), (1.80104, 0.350447), (2.70155, 0.356231)]),
                "ver.csv": _measured([(0.808548, 0.392289), (1.6171, 0.36168), (2.42564, 0.373147)])}

    def one_gpu(doc):
        doc["cluster"]["fractions_per_gpu"] = 2
        doc["cluster"]["gpu_types"]["A6000"]["memory_gib"] = 24
        doc["cluster"]["nodes"] = [{"name": "cpu", "gpu_type": "A6000", "gpus": 1}]
        for llm in doc["llms"]:
            llm.update(weights_gib=0.1, min_kv_gib=0.1, tp_degrees=[1])
        doc["workflows"][0]["arrival_rate"] = 0.303205
        doc["workflows"][0]["stages"] = [
            {"llm": "gen", "invocations": 4.0, "parallelism": 1.72625}, {"llm": "ver", "invocations": 4.0, "parallelism": 1.62812},
        ]

    instance = load_instance(write_instance(one_gpu, profiles))
    options = all_options(instance)
    assert [len(o) for o in options.values()] == [1, 1] and options["gen"][0].shape == options["ver"][0].shape
    plans = {b: make_plan(instance, PlanSettings(backend=b)) for b in ("cpsat", "milp", "bruteforce", "enumerate")}
    for plan in plans.values():
        assert [(c.share, c.replicas) for c in plan.allocation.llms] == [(1, 1), (1, 1)]
        assert plan.objective_value == pytest.approx(plans["bruteforce"].objective_value)
