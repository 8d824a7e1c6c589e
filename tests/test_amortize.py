"""Amortized what-if families: every scenario equals an independent make_plan of it (objective and
allocation), the certificates reject a candidate that is not the optimum, and the shortcuts fire
where they should (so that the equality tests exercise them)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from scepsy.models.instance.instance import load_instance
from scepsy.planner.studies import amortize
from scepsy.planner.studies.amortize import Problem, plan_family
from scepsy.planner.allocation.objective import build_objective
from scepsy.planner.allocation.search import PlanSettings, plan_options, references
from scepsy.planner.allocation.planning import make_plan

from conftest import INSTANCES

COMBINED = load_instance(INSTANCES / "combined-8xh100.yaml")
BEAM = load_instance(INSTANCES / "beam-4xa6000.yaml")


def assert_equal_to_independent(instances, answers):
    for instance, answer in zip(instances, answers):
        plan = make_plan(instance)
        assert answer.plan is not None, answer.error
        assert answer.plan.allocation == plan.allocation, (answer.method, instance.workflows)
        assert answer.plan.objective_value == pytest.approx(plan.objective_value, rel=1e-9)
        assert answer.plan.status == plan.status


@pytest.mark.slow
def test_combined_rate_line_equals_independent_plans():
    """The bench instance on 8 GPUs: a line of total rates planned once with reuse, each compared
    with its own make_plan; the line holds certified blocks and solves."""
    base = COMBINED.with_cluster_size(8)
    instances = [base.with_total_rate(r) for r in (2.0, 8.0, 12.0, 16.0, 20.0, 24.0, 36.0, 40.0)]
    answers = plan_family(instances, PlanSettings())
    assert {"solved", "certified"} <= {a.method for a in answers}
    assert_equal_to_independent(instances, answers)


@pytest.mark.slow
def test_per_workflow_rates_and_the_unconstrained_optimum():
    """Fig. 9's axis (beam fixed, rag varied) on 64 GPUs: the shared beam reference is solved once,
    and at low rates every LLM gets its fastest option without a solve (at 2 and 6 requests/s: the
    embedder's shares 0.8, 0.9 and 1.0 are 14 microseconds apart at light load, e5-base-v2 on H100);
    at 30 and 60 requests/s the fastest options no longer place together and are solved."""
    base = COMBINED.with_cluster_size(64).with_arrival_rates({"beam": 5.0})
    instances = [base.with_arrival_rates({"rag": r}) for r in (2.0, 6.0, 30.0, 60.0)]
    answers = plan_family(instances, PlanSettings())
    assert [a.method for a in answers] == ["unconstrained", "unconstrained", "solved", "solved"]
    assert_equal_to_independent(instances, answers)


def test_unconstrained_needs_every_fastest_option_fastest_by_a_margin():
    """The 2 requests/s scenario above takes the shortcut; with the embedder's second-fastest option
    moved to within a microsecond of its fastest, the model's rounding could hide the difference,
    so there is no shortcut (the scenario is solved)."""
    instance = COMBINED.with_cluster_size(64).with_arrival_rates({"beam": 5.0, "rag": 2.0})
    problem = _problem(instance)
    options, _ = plan_options(instance, PlanSettings(), problem.objective)
    assert amortize._unconstrained(problem, options, amortize.check_placement) is not None
    fastest, runner_up = sorted(options["embed"], key=lambda o: (o.latency_s, o.units))[:2]
    close = replace(runner_up, latency_s=fastest.latency_s + 1e-6)
    tied = {**options, "embed": [close if o is runner_up else o for o in options["embed"]]}
    assert amortize._unconstrained(problem, tied, amortize.check_placement) is None


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpus=st.sampled_from([4, 8]),
    rates=st.lists(st.floats(min_value=0.5, max_value=12.0).map(lambda r: round(r, 2)), min_size=2, max_size=6, unique=True),
)
def test_random_lines_equal_independent_plans(gpus, rates):
    """Random rate lines (sorted, as a grid orders them) on small clusters, infeasible rates
    included: the same answers as independent plans."""
    base = BEAM.with_cluster_size(gpus)
    instances = [base.with_arrival_rates({"beam": r}) for r in sorted(rates)]
    for instance, answer in zip(instances, plan_family(instances, PlanSettings())):
        try:
            plan = make_plan(instance)
        except Exception as error:  # infeasible: the family reports the same reason
            assert answer.plan is None and str(answer.error) == str(error)
            continue
        assert answer.plan is not None and answer.plan.allocation == plan.allocation
        assert answer.plan.objective_value == pytest.approx(plan.objective_value, rel=1e-9)


def _problem(instance):
    refs = references(instance, PlanSettings(placement_counts_limit=0), amortize.check_placement)
    return Problem(instance, build_objective(instance, refs))


def test_certificate_rejects_an_optimum_of_another_rate():
    """Where independent plans at two rates differ, the certificate must refuse the other rate's
    optimum (and accept each rate's own)."""
    base = COMBINED.with_cluster_size(8)
    low, high = base.with_total_rate(2.0), base.with_total_rate(60.0)  # they differ in ver and rerank shares
    plans = [make_plan(low), make_plan(high)]
    assert plans[0].allocation != plans[1].allocation
    problems = [_problem(low), _problem(high)]
    fast = PlanSettings(placement_counts_limit=0)
    options_at = amortize.ScenarioOptions(problems, fast, {})
    certify = lambda k, allocation: amortize._certify(problems, [k], allocation, options_at, fast, amortize.check_placement)  # noqa: E731
    if amortize._holds(options_at(1)[0], plans[0].allocation):
        assert not certify(1, plans[0].allocation)
    if amortize._holds(options_at(0)[0], plans[1].allocation):
        assert not certify(0, plans[1].allocation)
    assert certify(1, plans[1].allocation)


def test_unconstrained_needs_room_for_every_fastest_option():
    """On 8 GPUs the fastest options of all five LLMs cannot be placed together: no shortcut."""
    instance = COMBINED.with_cluster_size(8)
    problem = _problem(instance)
    options, _ = plan_options(instance, PlanSettings(), problem.objective)
    assert amortize._unconstrained(problem, options, amortize.check_placement) is None


def test_without_reuse_every_scenario_is_an_independent_plan():
    instances = [BEAM.with_arrival_rates({"beam": r}) for r in (1.0, 2.0)]
    answers = plan_family(instances, PlanSettings(), reuse=False)
    assert [a.method for a in answers] == ["independent", "independent"]
    assert_equal_to_independent(instances, answers)


def test_objectives_outside_the_certificate_plan_independently():
    instance = replace(BEAM, objective="min_gpus").with_latency_slos({"beam": 5.0})
    answers = plan_family([instance], PlanSettings())
    assert answers[0].method == "independent"


def _choices(options):
    """Every choice of one option per LLM (exhaustive, for small option sets)."""
    import itertools

    llms = list(options)
    return [dict(zip(llms, combo)) for combo in itertools.product(*(options[m] for m in llms))]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=3),
    data=st.data(),
)
def test_supported_options_keeps_every_option_of_a_feasible_choice(sizes, data):
    """Random rows over random small option sets, against exhaustive search: every option that
    some choice meeting all rows uses is kept, nothing outside the input is returned, None only
    when no choice meets the rows; with one row the propagation is exact (kept = used)."""
    from scepsy.planner.allocation.formulation import supported_options

    options = {f"m{k}": [f"m{k}o{i}" for i in range(n)] for k, n in enumerate(sizes)}
    n_rows = data.draw(st.integers(min_value=1, max_value=3))
    rows = []
    for _ in range(n_rows):
        table = {o: data.draw(st.integers(min_value=-5, max_value=10)) for opts in options.values() for o in opts}
        rows.append((lambda m, o, table=table: table[o], data.draw(st.integers(min_value=-5, max_value=20))))
    feasible = [c for c in _choices(options) if all(sum(f(m, o) for m, o in c.items()) <= rhs for f, rhs in rows)]
    used = {m: {c[m] for c in feasible} for m in options}
    kept = supported_options(options, rows)
    if kept is None:
        assert not feasible
        return
    for m in options:
        assert used[m] <= set(kept[m]) <= set(options[m])
        assert kept[m] == [o for o in options[m] if o in kept[m]]  # the input's order
    if n_rows == 1 and feasible:
        assert {m: set(kept[m]) for m in options} == used


def test_pruning_to_the_warm_start_keeps_the_plan():
    """A plan from a neighbouring rate's optimum as the warm start, with and without dropping the
    options no allocation as good as it can use: the same plan, from fewer options."""
    from scepsy.planner.allocation import search

    base = COMBINED.with_cluster_size(16)
    neighbour = make_plan(base.with_total_rate(60.0)).allocation
    instance = base.with_total_rate(64.0)
    problem = _problem(instance)
    options, _ = plan_options(instance, PlanSettings(), problem.objective)
    pruned = search._within_warm_start(options, problem.objective, neighbour)
    assert sum(map(len, pruned.values())) < sum(map(len, options.values())) / 2
    plans = []
    for prune in (False, True):
        settings_ = PlanSettings(placement_counts_limit=0, prune_to_warm_start=prune)
        plans.append(search.solve_at_load(instance, problem.objective, settings_, amortize.check_placement, 1e18, hint=neighbour))
    assert plans[0].allocation == plans[1].allocation
    assert plans[0].values == pytest.approx(plans[1].values, rel=1e-12)
    assert plans[1].allocation == make_plan(instance).allocation
