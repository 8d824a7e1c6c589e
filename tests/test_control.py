"""The controller: forecasters, workflow rates by NNLS, the pure policy (step tests, hysteresis,
stabilization, moves cap, missing data), moves against their lower bound, and the closed loop on
the simulator (determinism for a seed, the baselines, the CLI's JSON)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from scepsy import api
from scepsy.cli import app
from scepsy.control.forecast import Forecaster
from scepsy.control.policy import (ControlSettings, ControllerState, Observation, PolicyContext, _choose, _dark_llms, _latencies, _meets,
                                   decide, make_context)
from scepsy.control.rates import workflow_rates
from scepsy.control.replan import Replanner, cheapest_objective, moves, moves_lower_bound, without_replicas
from scepsy.control.simulation import (SYSTEM_TYPES, SYSTEMS, ClosedLoopSettings, _Fleet, fleet_placement, opening_plan, rate_bins,
                                      run_systems, scale_arrivals, shaped_arrivals)
from scepsy.models.simulation.simulator import SimulationSettings, simulate
from scepsy.models.errors import InputError
from scepsy.models.instance.allocation import Allocation, LlmAllocation, Placement, ReplicaPlacement, Shard
from scepsy.models.instance.instance import Instance, Stage
from scepsy.models.performance.alp import predict
from scepsy.placement.objective import evaluate
from scepsy.planner.allocation.planning import make_plan

from conftest import INSTANCES

ROOT = INSTANCES.parent  # the repository
RAG = INSTANCES / "rag-4xa6000.yaml"  # one workflow, three small LLMs: a cheap closed loop
COMBINED = INSTANCES / "combined-8xh100.yaml"


# --------------------------------------------------------------------------------------------
# Forecasters


def _feed(forecaster: Forecaster, values: list[float], dt_s: float = 60.0, horizon_s: float = 240.0) -> list[float]:
    state, out = None, []
    for value in values:
        state = forecaster.update(state, value, dt_s)
        out.append(forecaster.predict(state, horizon_s))
    return out


def test_the_constant_forecast_is_the_last_observation():
    assert _feed(Forecaster("constant"), [3.0, 7.0, 5.0]) == [3.0, 7.0, 5.0]


def test_the_ewma_weighs_the_newest_sample_by_alpha():
    out = _feed(Forecaster("ewma", alpha=0.5), [4.0, 8.0, 8.0])
    assert out == [4.0, 6.0, 7.0]


def test_the_kalman_filter_follows_a_ramp_ahead_and_bounds_a_step():
    ramp = _feed(Forecaster("kalman"), [10.0 + 1.0 * k for k in range(30)])
    assert ramp[-1] > 39.0 + 1.0  # ahead of the last observation (39) on a rising ramp
    assert ramp[-1] < 39.0 * 1.25 + 1e-9  # the trend moves a forecast at most trend_cap of the level
    flat = _feed(Forecaster("kalman"), [20.0] * 10)
    assert all(abs(v - 20.0) < 1e-6 for v in flat)
    step = _feed(Forecaster("kalman"), [20.0] * 5 + [40.0] * 10)
    assert max(step) < 40.0 * 1.6 and abs(step[-1] - 40.0) < 4.0  # bounded overshoot, settles near the new level
    assert all(v >= 0 for v in _feed(Forecaster("kalman"), [20.0] * 5 + [0.0] * 5))


def test_a_noisy_series_moves_the_kalman_level_less():
    """The measurement noise the policy passes (the observed variability) damps a burst's pull."""
    forecaster = Forecaster("kalman")
    state = None
    for _ in range(10):
        state = forecaster.update(state, 20.0, 60.0)
    quiet = forecaster.update(state, 40.0, 60.0)
    noisy = forecaster.update(state, 40.0, 60.0, noise_var=400.0)
    assert 20.0 < noisy.level < quiet.level <= 40.0
    assert forecaster.predict(noisy, 240.0) < forecaster.predict(quiet, 240.0)


def test_an_unknown_predictor_is_refused():
    with pytest.raises(ValueError, match="unknown predictor"):
        Forecaster("arima")


def test_a_scale_up_trigger_below_the_planning_slo_is_refused():
    with pytest.raises(ValueError, match="scale_up_at .* must be at least slo_margin"):
        ControlSettings(scale_up_at=0.7, slo_margin=0.8)
    assert ControlSettings(scale_up_at=0.8, slo_margin=0.8).scale_up_at == 0.8


# --------------------------------------------------------------------------------------------
# Workflow rates from LLM rates


def _shared(instance: Instance) -> Instance:
    """combined-8xh100 with RAG generating on beam's `gen` as well (a shared LLM)."""
    rag = instance.workflows[1]
    stages = rag.stages + (Stage("gen", 2.0, 1.0),)
    return replace(instance, workflows=(instance.workflows[0], replace(rag, stages=stages)))


def test_nnls_recovers_the_workflow_rates_where_an_llm_is_shared():
    instance = _shared(api.load(COMBINED))
    truth = {"beam": 3.0, "rag": 5.0}
    llm_rates = {m.name: instance.with_arrival_rates(truth).offered_rate_rps(m.name) for m in instance.llms}
    assert llm_rates["gen"] == pytest.approx(3.0 * 8.61 + 5.0 * 2.0)
    rates = workflow_rates(instance, llm_rates)
    assert rates == pytest.approx(truth, rel=1e-9)


def test_nnls_never_gives_a_negative_rate_and_ignores_unknown_llms():
    instance = _shared(api.load(COMBINED))
    rates = workflow_rates(instance, {"gen": 0.0, "ver": 0.0, "embed": 9.0, "rerank": 9.0, "rag-gen": 9.0, "other": 5.0})
    assert rates["beam"] == 0.0 and rates["rag"] > 0
    assert workflow_rates(instance, {}) == {"beam": 0.0, "rag": 0.0}


# --------------------------------------------------------------------------------------------
# The policy


@pytest.fixture(scope="module")
def rag() -> Instance:
    return api.load(RAG)


@pytest.fixture(scope="module")
def rag_context(rag: Instance) -> PolicyContext:
    plan = api.plan(rag, time_limit_s=600.0)
    return make_context(rag, ControlSettings(period_s=60.0, startup_s=120.0), allocation=plan.allocation,
                        plan_time_limit_s=600.0)


def _llm_rates(context: PolicyContext, rate: float) -> dict[str, float | None]:
    at = context.instance.with_arrival_rates({"rag": rate})
    return {m.name: at.offered_rate_rps(m.name) for m in context.instance.llms}


def _own_plan(context: PolicyContext, rate: float) -> ControllerState:
    """The state of a controller that runs its own plan for `rate`, settled (a full window seen)."""
    allocation = context.replanner.allocation({"rag": rate * (1 + context.settings.headroom)})
    assert allocation is not None
    placement = context.replanner.place(allocation, None)
    assert placement is not None
    state, _ = _run(context, ControllerState.initial(allocation, placement), [rate] * 12)  # settle: past a window
    return state


def _run(context: PolicyContext, state: ControllerState, rates: list[float], start_s: float = 0.0):
    decisions = []
    for k, rate in enumerate(rates):
        observation = Observation(start_s + context.settings.period_s * (k + 1), _llm_rates(context, rate))
        state, decision = decide(state, observation, context)
        decisions.append(decision)
    return state, decisions


def _meets_slo(context: PolicyContext, allocation: Allocation, rate: float) -> bool:
    prediction = predict(context.instance.with_arrival_rates({"rag": rate}), allocation)
    return prediction.feasible and prediction.workflow("rag").latency_s <= context.slos_s["rag"]


def test_nothing_happens_at_constant_load(rag_context):
    state = _own_plan(rag_context, 8.0)
    after, decisions = _run(rag_context, state, [8.0] * 20, start_s=12 * rag_context.settings.period_s)
    assert [d.action for d in decisions] == ["keep"] * 20
    assert after.allocation == state.allocation and after.placement == state.placement


@pytest.mark.parametrize("factor", [2.0, 0.5, 0.0])
def test_a_step_recovers_the_slo_within_startup_plus_two_periods(rag_context, factor):
    """Rate x2: the scale-up is decided in the second period that sees it (a rise counts once it
    held two periods), so its replicas serve within start-up + 2 periods, and the new plan meets
    the SLO at the new rate. x0.5 and to 0: the
    plan keeps meeting the SLO throughout (scale-downs only after the stabilization window)."""
    s = rag_context.settings
    # rates where the plan for base breaks the SLO at base * factor, or is too large; from 12 req/s the
    # half-rate plan re-shapes rag-gen onto GPUs its replicas hold (a dark swap a scale-down never
    # takes: test_a_scale_down_never_leaves_an_llm_dark), from 14 it stops a replica and re-shapes beside
    base = {2.0: 8.0, 0.5: 14.0, 0.0: 12.0}[factor]
    state = _own_plan(rag_context, base)
    step_s = 12 * s.period_s
    after, decisions = _run(rag_context, state, [base * factor] * 12, start_s=step_s)
    for d in decisions:
        assert d.action in ("keep", "replan")
    replans = [d for d in decisions if d.action == "replan"]
    if factor > 1:
        assert replans and replans[0].time_s <= step_s + 2 * s.period_s  # confirmed in its second period
        assert replans[0].time_s + s.startup_s <= step_s + s.startup_s + 2 * s.period_s
        assert replans[0].allocation is not None and _meets_slo(rag_context, replans[0].allocation, base * factor)
    else:
        assert all(d.time_s >= step_s + s.stabilization_s for d in replans)  # sustained only
        assert replans, "a lower load frees GPUs after the stabilization window"
        assert after.allocation.units < state.allocation.units
        assert all(c.replicas >= 1 for c in after.allocation.llms)  # never below one replica
    assert _meets_slo(rag_context, after.allocation, max(base * factor, 1e-3))


def test_a_burst_shorter_than_startup_does_not_scale_up(rag_context):
    """One period at three times the rate (start-up is two periods): the sustained rate, which the
    running plan serves, does not move, so nothing is started for a burst that would be gone
    before the replica serves. The same rate held for two periods is a step, and is answered."""
    s = rag_context.settings
    assert s.startup_s > s.period_s
    state = _own_plan(rag_context, 6.0)
    _, decisions = _run(rag_context, state, [6.0, 6.0, 18.0, 6.0, 6.0, 6.0, 18.0, 6.0, 6.0], start_s=12 * s.period_s)
    assert [d.action for d in decisions] == ["keep"] * 9
    assert decisions[2].inputs["confirmed_rate_rps"]["rag"] == pytest.approx(6.0, rel=1e-6)
    _, decisions = _run(rag_context, state, [6.0, 6.0, 18.0, 18.0], start_s=12 * s.period_s)
    assert [d.action for d in decisions] == ["keep", "keep", "keep", "replan"]


def _changes(decisions) -> list[tuple[float, str, int, bool]]:
    """(time, llm, +1 / -1, SLO at risk) of every change of an LLM's replica count in decisions."""
    out, last = [], None
    for d in decisions:
        if d.action != "replan" or d.allocation is None:
            continue
        now = {c.llm: c.replicas for c in d.allocation.llms}
        risk = bool(d.inputs.get("flap_guard", {}).get("slo_at_risk", False))
        if last is not None:
            out += [(d.time_s, m, 1 if now[m] > last[m] else -1, risk) for m in sorted(now) if now[m] != last.get(m, now[m])]
        last = now
    return out


def _reversals(changes: list[tuple[float, str, int, bool]], window_s: float) -> list[tuple[float, str, int, bool]]:
    """The changes that reverse their LLM's previous change within `window_s`."""
    out = []
    for llm in sorted({m for _, m, _, _ in changes}):
        own = [c for c in changes if c[1] == llm]
        out += [c1 for c0, c1 in zip(own, own[1:]) if c0[2] != c1[2] and c1[0] - c0[0] <= window_s]
    return out


def test_the_flap_guard_holds_a_reversal_unless_the_slo_is_at_risk(rag_context):
    """After a scale-down, a rise whose forecast with its burst margin breaks the SLO, but whose
    sustained rate does not, does not grow an LLM that shrank within the flap window (the decision
    says so); a rise that breaks the SLO at the sustained rate is answered at once."""
    s = rag_context.settings
    state = _own_plan(rag_context, 12.0)
    state, decisions = _run(rag_context, state, [3.0] * 10, start_s=12 * s.period_s)
    downs = [d for d in decisions if d.action == "replan"]
    assert downs and all(d.reason.startswith("scale down") for d in downs)
    start = decisions[-1].time_s
    # a moderate rise: the SLO breaks at the rate plus the least burst margin, not at the rate
    moderate = next(r for r in (3.0 * (1 + 0.02 * k) for k in range(1, 200))
                    if not _meets_slo_at(rag_context, state.allocation, r * (1 + s.headroom), 1.0)
                    and _meets_slo_at(rag_context, state.allocation, r, 1.0))
    _, held = _run(rag_context, state, [moderate] * 12, start_s=start)
    assert any("flap guard" in d.reason for d in held)
    reversed_ = _reversals(_changes(downs + held), s.flap_window_s)
    assert all(risk for _, _, _, risk in reversed_)  # only where the SLO itself was at risk
    # a rise the running plan cannot serve: the SLO is at risk, the guard gives way
    _, urgent = _run(rag_context, state, [24.0] * 3, start_s=start)
    assert any(d.action == "replan" and d.reason.startswith("scale up") for d in urgent)


def test_no_reversal_within_the_flap_window_at_steady_bursty_load(rag_context):
    """A steady mean with minute-scale bursts (a seeded gamma series, coefficient of variation
    about 0.6, like the Azure code trace's minutes): the controller scales to it without
    reversing an LLM within the flap window, except where the SLO itself was at risk."""
    import random

    s = rag_context.settings
    rng = random.Random(11)
    rates = [rng.gammavariate(3.0, 12.0 / 3.0) for _ in range(40)]  # mean 12 req/s
    state = _own_plan(rag_context, 3.0)  # its plan meets the SLO at 12 req/s, not in the bursts
    _, decisions = _run(rag_context, state, rates, start_s=12 * s.period_s)
    assert any(d.action == "replan" for d in decisions)  # above the start plan's rate: it scales
    assert all(risk for _, _, _, risk in _reversals(_changes(decisions), s.flap_window_s))


def _meets_slo_at(context: PolicyContext, allocation: Allocation, rate: float, fraction: float) -> bool:
    prediction = predict(context.instance.with_arrival_rates({"rag": rate}), allocation)
    return prediction.feasible and prediction.workflow("rag").latency_s <= context.slos_s["rag"] * fraction


def test_a_re_shape_moves_only_the_llms_whose_relocation_pays(rag_context):
    """A running plan with two LLMs larger than the fresh plan's: the reranker's 4 spare units pay
    for relocating its small replica, the generator's spare unit per shard does not pay for
    relocating its replica (the units saved over a stabilization window against all its units
    held twice for a start-up). The plan taken re-shapes the reranker alone."""
    rate = 8.0
    fresh = rag_context.replanner.allocation({"rag": rate})
    assert fresh is not None
    rerank, generator = fresh.of("rerank"), fresh.of("rag-gen")
    assert rerank.share + 4 <= 10 and generator.share + 1 <= 10
    bigger = {"rerank": replace(rerank, share=rerank.share + 4), "rag-gen": replace(generator, share=generator.share + 1)}
    running = Allocation(fresh.fractions_per_gpu, tuple(bigger.get(c.llm, c) for c in fresh.llms))
    s = rag_context.settings
    spare = generator.tp * generator.replicas  # the generator's units above the fresh plan's
    assert spare * s.stabilization_s < generator.units * s.startup_s  # its re-shape alone does not pay
    chosen = _choose(rag_context, running, {"rag": rate}, alternative=running)
    assert chosen is not None
    assert chosen.of("rerank").shape == rerank.shape
    assert chosen.of("rag-gen").shape == running.of("rag-gen").shape
    assert chosen.units < running.units
    assert _meets_slo_at(rag_context, chosen, rate, s.slo_margin)


def test_hysteresis_keeps_a_plan_under_small_oscillations(rag_context):
    state = _own_plan(rag_context, 8.0)
    _, decisions = _run(rag_context, state, [8.0 * (0.95 if k % 2 else 1.0) for k in range(20)],
                        start_s=12 * rag_context.settings.period_s)
    assert [d.action for d in decisions] == ["keep"] * 20


def test_no_scale_down_within_the_stabilization_window_after_a_scale_up(rag_context):
    s = rag_context.settings
    state = _own_plan(rag_context, 4.0)
    _, decisions = _run(rag_context, state, [16.0, 16.0] + [4.0] * 10, start_s=12 * s.period_s)
    ups = [d for d in decisions if d.action == "replan" and d.reason.startswith("scale up")]
    downs = [d for d in decisions if d.action == "replan" and d.reason.startswith("scale down")]
    assert ups
    assert all(d.time_s - ups[-1].time_s >= s.stabilization_s for d in downs)


def test_the_moves_cap_bounds_a_scale_down_to_stop_only_steps(rag_context):
    s = replace(rag_context.settings, max_moves_per_period=1)
    context = replace(rag_context, settings=s)
    state = _own_plan(context, 24.0)
    before = sum(c.replicas for c in state.allocation.llms)
    _, decisions = _run(context, state, [1.0] * 14, start_s=12 * s.period_s)
    replans = [d for d in decisions if d.action == "replan"]
    assert before > 2 and len(replans) >= 2  # more than one stop needed: taken one a period
    for d in replans:
        assert d.moves <= 1


def test_missing_data_holds_the_last_good_plan_and_never_scales_down(rag_context):
    state = _own_plan(rag_context, 12.0)
    rates = _llm_rates(rag_context, 1.0)
    for k, gap in enumerate([None, {**rates, "rerank": None}, {**rates, "embed": math.nan}]):
        observation = Observation(1000.0 + 60 * k, gap)
        after, decision = decide(state, observation, rag_context)
        assert decision.action == "hold" and decision.allocation is None
        assert after.allocation == state.allocation and after.placement == state.placement
        assert "keeping the last good plan" in decision.reason
        json.dumps(decision.to_json())


def test_a_workflow_counter_is_used_where_every_workflow_has_one(rag_context):
    state = _own_plan(rag_context, 8.0)
    observation = Observation(13 * 60.0, None, workflow_rates_rps={"rag": 8.0})
    _, decision = decide(state, observation, rag_context)
    assert decision.action == "keep" and decision.inputs["rates_from"] == "workflow counters"


def test_completions_that_stall_under_a_backlog_still_scale_up(rag_context):
    """Arrivals at the entry hold at the planned rate while no call completes and rag-gen's queue
    grows: the decision sizes for the arrivals plus draining the queue within one start-up."""
    state = _own_plan(rag_context, 4.0)
    stalled = {m.name: 0.0 for m in rag_context.instance.llms}
    observation = Observation(13 * 60.0, stalled, workflow_rates_rps={"rag": 4.0},
                              waiting_requests={"rag-gen": 2400.0})
    _, decision = decide(state, observation, rag_context)
    assert decision.action == "replan" and decision.reason.startswith("scale up")
    assert decision.allocation is not None and decision.allocation.units > state.allocation.units
    assert decision.inputs["backlog_rps"]["rag"] > 0


def test_no_scale_down_while_a_backlog_stands(rag_context):
    state = _own_plan(rag_context, 24.0)
    ready = {c.llm: c.replicas for c in state.allocation.llms}

    def fall(waiting: float):
        current, decisions = state, []
        for k in range(12):
            observation = Observation(13 * 60.0 + 60.0 * k, _llm_rates(rag_context, 1.0), ready,
                                      workflow_rates_rps={"rag": 1.0}, waiting_requests={"rag-gen": waiting})
            current, decision = decide(current, observation, rag_context)
            decisions.append(decision)
        return decisions

    assert any(d.action == "replan" for d in fall(0.0))  # the fall alone scales down
    standing = fall(3.0 * max(ready.values()))
    assert not any(d.action == "replan" for d in standing)
    assert "a backlog stands on rag-gen" in standing[-1].reason


def test_a_missed_slo_with_a_growing_queue_is_never_kept(rag_context):
    """At the rate the plan was made for, the prediction says the SLO holds, but users see three
    times the SLO and rag-gen's queue grows: the decision is a larger plan."""
    state = _own_plan(rag_context, 4.0)
    ready = {c.llm: c.replicas for c in state.allocation.llms}
    slow = {"rag": 3.0 * rag_context.slos_s["rag"]}
    decisions = []
    for k, waiting in enumerate([20.0, 40.0]):
        observation = Observation(13 * 60.0 + 60.0 * k, _llm_rates(rag_context, 4.0), ready, workflow_rates_rps={"rag": 4.0},
                                  waiting_requests={"rag-gen": waiting}, workflow_latency_s=slow)
        state, decision = decide(state, observation, rag_context)
        decisions.append(decision)
    assert decisions[-1].action == "replan" and "missed and the queue grows" in decisions[-1].reason
    assert decisions[-1].allocation is not None and decisions[-1].allocation.units > _own_plan(rag_context, 4.0).allocation.units


def _predicted_llm_latencies(context: PolicyContext, allocation: Allocation, rate: float) -> dict[str, float]:
    prediction = predict(context.instance.with_arrival_rates({"rag": rate}), allocation)
    return {p.llm: p.latency_s for p in prediction.llms}


def _slow_periods(context: PolicyContext, state: ControllerState, factors: list[dict[str, float]], rate: float,
                  **extra) -> tuple[ControllerState, list]:
    """Periods at `rate` whose LLMs' observed call latency is `factors[k]` times the prediction."""
    ready = {c.llm: c.replicas for c in state.allocation.llms}
    decisions = []
    for k, factor in enumerate(factors):
        predicted = _predicted_llm_latencies(context, state.allocation, rate)
        seen = {m: v * factor.get(m, 1.0) for m, v in predicted.items()}
        observation = Observation(13 * 60.0 + 60.0 * k, _llm_rates(context, rate), ready, workflow_rates_rps={"rag": rate},
                                  llm_latency_s=seen, **extra)
        state, decision = decide(state, observation, context)
        decisions.append(decision)
    return state, decisions


def test_an_llm_slower_than_its_profile_is_planned_as_measured(rag_context):
    """rag-gen's calls take 1.8 times what the pipeline predicts, the other LLMs' as predicted: the
    correction grows for rag-gen only, stays within max_correction, and the plan that meets the
    SLO with the corrected model is larger, at the rate that arrives."""
    state = _own_plan(rag_context, 8.0)
    state, decisions = _slow_periods(rag_context, state, [{"rag-gen": 1.8}] * 8, 8.0)
    corrections = decisions[-1].inputs["latency_correction"]
    assert 1.5 < corrections["rag-gen"] <= rag_context.settings.max_correction
    assert all(v == 1.0 for m, v in corrections.items() if m != "rag-gen")  # the others measured as predicted
    grown = [d for d in decisions if d.action == "replan"]
    assert grown and grown[0].reason.startswith("scale up")
    assert grown[0].allocation is not None and grown[0].allocation.units > _own_plan(rag_context, 8.0).allocation.units
    assert decisions[-1].inputs["workflow_rates_rps"] == {"rag": 8.0}  # the rate is what arrives, not inflated


def test_the_correction_is_not_biased_by_noise_and_ignores_queueing(rag_context):
    """Observed latencies alternating 20% above and below the prediction leave the correction near
    1 (a geometric mean, bounded after averaging); a standing backlog and starting replicas
    measure queueing and start-up, not the model: they do not move it."""
    state = _own_plan(rag_context, 8.0)
    noisy = [{m.name: (1.2 if k % 2 else 1 / 1.2) for m in rag_context.instance.llms} for k in range(10)]
    _, decisions = _slow_periods(rag_context, state, noisy, 8.0)
    assert all(v < 1.1 for v in decisions[-1].inputs["latency_correction"].values())
    ready = {c.llm: c.replicas for c in state.allocation.llms}
    queued = {m: 10.0 * ready[m] for m in ready}
    _, behind = _slow_periods(rag_context, state, [{"rag-gen": 3.0}] * 4, 8.0, waiting_requests=queued)
    assert behind[-1].inputs["latency_correction"]["rag-gen"] == 1.0
    _, starting = _slow_periods(rag_context, state, [{"rag-gen": 3.0}] * 4, 8.0, starting_replicas={"rag-gen": 1})
    assert starting[-1].inputs["latency_correction"]["rag-gen"] == 1.0


def test_an_slo_from_an_overloaded_plan_is_refused(rag, rag_plan):
    overloaded = rag.with_arrival_rates({"rag": 1000.0})
    with pytest.raises(InputError, match="latency_slo_s"):
        make_context(overloaded, allocation=rag_plan.allocation)
    with pytest.raises(InputError, match="latency_slo_s"):
        make_context(rag)


def test_decide_is_pure(rag_context):
    state = _own_plan(rag_context, 8.0)
    observation = Observation(13 * 60.0, _llm_rates(rag_context, 20.0))
    first = decide(state, observation, rag_context)
    second = decide(state, observation, rag_context)
    assert first == second


# --------------------------------------------------------------------------------------------
# Moves


def _placement(*replicas: tuple[str, int, tuple[int, ...], int]) -> Placement:
    return Placement(10, tuple(ReplicaPlacement(m, i, "n", tuple(Shard(g, u) for g in gpus)) for m, i, gpus, u in replicas))


def test_moves_count_starts_stops_and_relocations_against_the_lower_bound():
    old = _placement(("a", 0, (0,), 10), ("a", 1, (1,), 10), ("b", 0, (2,), 5))
    new = _placement(("a", 0, (0,), 10), ("b", 0, (3,), 5), ("b", 1, (2,), 5), ("c", 0, (4,), 10))
    assert moves(old, new) == 1 + 1 + 1  # a: a stop; b: a start (its replica stays); c: a start
    a_old = Allocation(10, (LlmAllocation("a", "H100", 1, 10, 2), LlmAllocation("b", "H100", 1, 5, 1)))
    a_new = Allocation(10, (LlmAllocation("a", "H100", 1, 10, 1), LlmAllocation("b", "H100", 1, 5, 2),
                            LlmAllocation("c", "H100", 1, 10, 1)))
    assert moves_lower_bound(a_old, a_new) == 3
    reshaped = Allocation(10, (LlmAllocation("a", "H100", 2, 10, 1), LlmAllocation("b", "H100", 1, 5, 1)))
    assert moves_lower_bound(a_old, reshaped) == 2  # a changes shape: 2 old out, 1 new in, paired
    allocation, placement = without_replicas(a_old, old, {"a": 1})
    assert allocation.of("a").replicas == 1 and [r.replica for r in placement.replicas if r.llm == "a"] == [0]


# --------------------------------------------------------------------------------------------
# The closed loop


def _step_arrivals(rate: float, factor: float, minutes: float = 8.0, step_min: float = 3.0) -> dict[str, list[float]]:
    times, t = [], 0.0
    import random

    rng = random.Random(7)
    while t < minutes * 60:
        t += rng.expovariate(rate if t < step_min * 60 else rate * factor)
        times.append(t)
    return {"rag": [x for x in times if x < minutes * 60]}


@pytest.fixture(scope="module")
def rag_plan(rag: Instance):
    return api.plan(rag, time_limit_s=600.0)


def test_the_closed_loop_is_deterministic_for_a_seed(rag, rag_plan):
    arrivals = _step_arrivals(4.0, 2.0, minutes=6.0)
    settings = ClosedLoopSettings(ControlSettings(startup_s=60.0, period_s=60.0), seed=3)
    first = run_systems(rag, rag_plan.allocation, rag_plan.placement, arrivals, ["scepsy-control", "saturation"], settings)
    second = run_systems(rag, rag_plan.allocation, rag_plan.placement, arrivals, ["scepsy-control", "saturation"], settings)
    for a, b in zip(first, second):
        assert replace(a, decision_times_s=()) == replace(b, decision_times_s=())


def test_the_replanner_plans_the_fewest_units_where_gpus_are_shared(rag):
    """On rag-4xa6000 (10 units per A6000) the re-planner's plan is the min_units plan at the
    rounded rate, within the SLO and on fewer units than min_gpus'; on a whole-GPU cluster the
    re-planner keeps min_gpus."""
    planning = rag.with_latency_slos({"rag": 3.0})
    replanner = Replanner(planning)
    at = planning.with_arrival_rates(replanner.rounded({"rag": 4.0}))
    allocation = replanner.allocation({"rag": 4.0})
    assert cheapest_objective(planning) == "min_units" and allocation is not None
    assert allocation == make_plan(at.with_objective("min_units")).allocation
    assert allocation.units < make_plan(at.with_objective("min_gpus")).allocation.units
    assert predict(at, allocation).workflow("rag").meets_slo
    assert cheapest_objective(replace(rag, cluster=replace(rag.cluster, fractions_per_gpu=1))) == "min_gpus"


def test_a_closed_loop_step_recovers_and_every_baseline_runs(rag, rag_plan):
    """Rate x4 at minute 3 from the plan for 4 req/s (the fewest share units: at x3 that plan is
    overloaded): scepsy-control scales up in the first period that sees the step, and the SLO holds
    again once the overload's backlog drained, from start-up + 3 periods after the step; every
    system reports its fields."""
    slo = 2 * predict(rag, rag_plan.allocation).workflow("rag").latency_s
    own = make_context(rag, ControlSettings(), allocation=rag_plan.allocation).replanner
    start = own.allocation({"rag": 4.4})
    assert start is not None
    placement = own.place(start, None)
    assert placement is not None
    arrivals = _step_arrivals(4.0, 4.0, minutes=11.0)
    settings = ClosedLoopSettings(ControlSettings(startup_s=60.0, period_s=60.0))
    runs = run_systems(rag, start, placement, arrivals, list(SYSTEMS), settings, slos_s={"rag": slo})
    assert [r.name for r in runs] == list(SYSTEMS)
    ours = runs[0]
    ups = [d for d in ours.decisions if d.action == "replan" and d.reason.startswith("scale up")]
    assert ups and ups[0].time_s <= 180.0 + 60.0  # the first period that sees the step
    late = [s for s in ours.timeline if 180.0 + 60.0 + 3 * 60.0 <= s.time_s - 60.0 < 11 * 60.0]  # periods that begin then
    assert len(late) >= 3 and all(not (s.latency_s["rag"] > slo) for s in late), [(s.time_s, s.latency_s) for s in late]
    for run in runs:
        assert run.gpu_hours > 0 and run.replicas_moved >= run.replicas_moved_lower_bound >= 0
        assert run.workflows[0].requests == len(arrivals["rag"])
    # the oracle sees the step a start-up ahead; the reactive reference, in the first period after its first minute
    first_up = {run.name: min(d.time_s for d in run.decisions if d.action == "replan" and d.reason.startswith("scale up"))
                for run in runs if run.name in ("oracle", "reactive")}
    assert first_up["oracle"] < 180.0 and first_up["reactive"] == 240.0, first_up


def test_every_system_is_one_object_with_one_interface():
    """Each system of the closed loop is a class of its own (its process, its counting of
    replicas and GPUs), so run_system neither switches on names nor smuggles values out."""
    assert tuple(SYSTEM_TYPES) == SYSTEMS
    base = SYSTEM_TYPES["static"].__mro__[-2]
    assert all(issubclass(kind, base) for kind in SYSTEM_TYPES.values())
    source = (ROOT / "control" / "simulation.py").read_text()
    assert "type: ignore" not in source and "_box" not in source


def test_a_swap_on_a_full_cluster_never_holds_more_gpus_than_the_cluster(rag, rag_plan):
    """The plan fills every A6000 of rag-4xa6000 (10 of 10 units on each); the target swaps embed
    (GPU 0) with the rerank replica on GPU 1. Neither successor has free GPUs: each waits until
    the replica in its place has drained, embed's calls wait at its router meanwhile, and no
    moment holds more than the cluster's 4 GPUs or more than 10 units on a GPU."""
    placement = rag_plan.placement
    assert {(r.llm, s.gpu, s.units) for r in placement.replicas for s in r.shards} >= {("embed", 0, 1), ("rerank", 1, 1)}

    def moved(r: ReplicaPlacement) -> ReplicaPlacement:
        if r.llm == "embed":
            return replace(r, shards=(Shard(1, 1),))
        return replace(r, shards=(Shard(0, 1),)) if r.llm == "rerank" and r.shards == (Shard(1, 1),) else r

    swapped = Placement(placement.fractions_per_gpu, tuple(moved(r) for r in placement.replicas))
    arrivals = _step_arrivals(3.0, 1.0, minutes=5.0)
    sim = SimulationSettings(duration_s=300.0, warmup_s=0.0, drain_s=600.0)
    held: list[float] = []
    units: list[int] = []
    fleets: list[_Fleet] = []

    def controller(env, cluster):
        fleet = _Fleet(env, rag, sim, 60.0, rag_plan.allocation, placement)
        fleet.attach(cluster)
        fleets.append(fleet)
        yield env.timeout(60.0)
        fleet.apply(rag_plan.allocation, swapped)
        while True:
            held.append(fleet.gpus_held())
            units.append(max(fleet._used_units().values()))
            yield env.timeout(1.0)

    result = simulate(rag, rag_plan.allocation, sim, arrivals=arrivals, controller=controller)
    assert max(held) <= 4.0 + 1e-9 and max(units) <= placement.fractions_per_gpu
    assert fleets[0].peak_gpus <= 4.0 + 1e-9
    key = lambda p: sorted((r.llm, r.node, r.shards) for r in p.replicas)  # noqa: E731
    assert key(fleet_placement(fleets[0])) == key(swapped)
    assert all(fleets[0].ready(m.name) == rag_plan.allocation.of(m.name).replicas for m in rag.llms)
    assert result.workflow("rag").unfinished == 0


def ONE_AT_A_TIME(llm: str) -> bool:
    """Every LLM with two or more replicas may swap them one at a time."""
    return True


def NEVER(llm: str) -> bool:
    """No LLM may (one replica serves, or the others could not carry the load)."""
    return False


@pytest.fixture(scope="module")
def beam_context() -> PolicyContext:
    """beam-4xa6000 (gen and ver on 4 A6000s) with the SLO of bench/control.py's scenarios."""
    beam = api.load(INSTANCES / "beam-4xa6000.yaml")
    return make_context(beam, ControlSettings(period_s=60.0, startup_s=120.0), {"beam": 2.84}, plan_time_limit_s=600.0)


def _settled(context: PolicyContext, rate: float, plan_rate: float) -> ControllerState:
    allocation = context.replanner.allocation({"beam": plan_rate})
    assert allocation is not None
    placement = context.replanner.place(allocation, None)
    assert placement is not None
    state = ControllerState.initial(allocation, placement)
    ready = {c.llm: c.replicas for c in allocation.llms}
    for k in range(12):
        at = context.instance.with_arrival_rates({"beam": rate})
        observed = {m.name: at.offered_rate_rps(m.name) for m in context.instance.llms}
        state, _ = decide(state, Observation(60.0 * k, observed, ready, workflow_rates_rps={"beam": rate}), context)
    return state


def test_a_swap_that_leaves_an_llm_dark_waits_while_the_running_plan_carries_the_load(beam_context):
    """The plan for 10.5 req/s holds every GPU (gen on 2, ver on the other 2). A backlog on
    ver asks for the plan for more, which re-shapes gen onto one GPU: its successor needs the GPUs
    its only replica holds, so gen would serve nothing for a start-up. While the running plan
    carries the sustained rate the decision keeps it (the backlog drains); where the running plan
    is overloaded at the sustained rate, the swap is taken."""
    state = _settled(beam_context, 10.5, 10.5)
    assert state.allocation.of("gen").tp == 2 and state.allocation.of("ver").replicas == 2  # every GPU holds a replica
    ready = {c.llm: c.replicas for c in state.allocation.llms}
    at = beam_context.instance.with_arrival_rates({"beam": 10.5})
    observed = {m.name: at.offered_rate_rps(m.name) for m in beam_context.instance.llms}
    backlog = Observation(12 * 60.0, observed, ready, workflow_rates_rps={"beam": 10.5}, waiting_requests={"ver": 2500.0})
    _, decision = decide(state, backlog, beam_context)
    assert decision.action == "keep" and decision.inputs["dark_llms"] == ["gen"]
    swap = beam_context.replanner.allocation({"beam": 14.0})
    placed = beam_context.replanner.place(swap, state.placement)
    assert swap.of("gen").tp == 1 and _dark_llms(beam_context, state.placement, placed, ONE_AT_A_TIME) == ["gen"]
    assert _dark_llms(beam_context, state.placement, state.placement, NEVER) == []
    overloaded = _settled(beam_context, 14.0, 10.5)
    assert overloaded.allocation.of("gen").tp == 1  # taken: the running plan would never drain


def test_a_scale_up_that_would_leave_an_llm_dark_starts_replicas_of_the_running_shapes(beam_context):
    """The plan for 5.5 req/s (gen on two GPUs at 8 of 10 units each, ver on a third) when the load
    doubles: the fresh plan re-shapes gen onto whole GPUs, the units its only replica holds, so gen
    would serve nothing for a start-up (as would the plan for the rate plus margin, which re-shapes
    ver). The decision starts replicas of the running shapes on the free GPUs instead: they carry
    the doubled rate, and no LLM stops serving."""
    state = _settled(beam_context, 5.5, 5.5)
    assert (state.allocation.of("gen").tp, state.allocation.of("gen").share) == (2, 8)
    fresh = beam_context.replanner.allocation({"beam": 11.0})
    assert fresh.of("gen").share == 10
    assert _dark_llms(beam_context, state.placement, beam_context.replanner.place(fresh, state.placement), ONE_AT_A_TIME) == ["gen"]
    ready = {c.llm: c.replicas for c in state.allocation.llms}
    at = beam_context.instance.with_arrival_rates({"beam": 11.0})
    observed = {m.name: at.offered_rate_rps(m.name) for m in beam_context.instance.llms}
    replans = []
    for k in range(12, 15):
        before = state
        state, decision = decide(state, Observation(60.0 * k, observed, ready, workflow_rates_rps={"beam": 11.0}), beam_context)
        if decision.action == "replan":
            replans.append((before, decision))
    before, decision = replans[0]
    assert decision.allocation is not None and decision.placement is not None and decision.inputs["dark_llms"]
    assert "running shapes with more replicas" in decision.reason
    assert [c.shape for c in decision.allocation.llms] == [c.shape for c in before.allocation.llms]
    assert decision.allocation.units > before.allocation.units
    assert _dark_llms(beam_context, before.placement, decision.placement, NEVER) == []
    latencies = predict(beam_context.instance.with_arrival_rates({"beam": 11.0}), decision.allocation)
    assert latencies.feasible


def test_a_dark_swap_waits_while_the_backlog_falls_and_for_a_start_up_of_overload(beam_context):
    """The plan for 10.5 req/s holds every GPU; at 14 req/s it is overloaded and the only larger
    plan leaves gen dark. While the requests waiting fall (the load that overloaded it has passed
    its peak) the decision keeps the plan that drains them; once they grow, the overload's clock
    starts, and the swap is taken when it has run a start-up (120 s), not before (ski rental)."""
    state = _settled(beam_context, 10.5, 10.5)
    ready = {c.llm: c.replicas for c in state.allocation.llms}
    at = beam_context.instance.with_arrival_rates({"beam": 14.0})
    observed = {m.name: at.offered_rate_rps(m.name) for m in beam_context.instance.llms}

    def period(k: int, waiting: float):
        return Observation(60.0 * k, observed, ready, workflow_rates_rps={"beam": 14.0}, waiting_requests={"ver": waiting})

    falling = replace(state, waiting={"ver": 4000.0})
    for k, waiting in enumerate((3000.0, 2000.0, 1000.0)):
        falling, decision = decide(falling, period(12 + k, waiting), beam_context)
        assert decision.action == "keep" and decision.inputs["dark_llms"] == ["gen"]
    growing = falling
    for k, waiting in ((15, 1500.0), (16, 2000.0)):
        growing, decision = decide(growing, period(k, waiting), beam_context)
        assert decision.action == "keep" and decision.inputs["dark_llms"] == ["gen"]
        assert growing.overloaded_since_s == 15 * 60.0
    _, decision = decide(growing, period(17, 2500.0), beam_context)
    assert decision.action == "replan" and decision.allocation is not None and decision.inputs["dark_llms"] == ["gen"]
    assert decision.allocation.of("gen").shape != state.allocation.of("gen").shape
    # where the engines report their queues, the clock runs on the backlog alone: the model's overload
    # at 14 req/s with no request waiting (a forecast ahead of the load) does not start it
    empty, _ = decide(state, period(12, 0.0), beam_context)
    assert empty.overloaded_since_s is None
    # a fall restarts the clock: the overload must last a start-up again
    fell, _ = decide(growing, period(17, 1800.0), beam_context)
    assert fell.overloaded_since_s is None
    fell, decision = decide(fell, period(18, 2300.0), beam_context)
    assert decision.action == "keep" and fell.overloaded_since_s == 18 * 60.0


def test_a_dark_swap_waits_for_overload_the_median_confirms(beam_context):
    """The plan for 10.5 req/s holds every GPU. With the Kalman predictor, a rise from 6 to 11 req/s
    extrapolates to 13.8 req/s, past what the plan carries, and the only larger plan leaves gen
    dark; the rate that holds now (the running median, 11 req/s) is within the plan's capacity, so
    the decision keeps it rather than go dark on a trend."""
    context = replace(beam_context, settings=replace(beam_context.settings, predictor="kalman"),
                      forecaster=Forecaster("kalman"))
    allocation = context.replanner.allocation({"beam": 10.5})
    assert allocation is not None
    placement = context.replanner.place(allocation, None)
    assert placement is not None
    state = ControllerState.initial(allocation, placement)
    ready = {c.llm: c.replicas for c in allocation.llms}
    decisions = []
    for k, rate in enumerate((6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 11.0)):
        at = context.instance.with_arrival_rates({"beam": rate})
        observed = {m.name: at.offered_rate_rps(m.name) for m in context.instance.llms}
        state, decision = decide(state, Observation(60.0 * k, observed, ready, workflow_rates_rps={"beam": rate}), context)
        decisions.append(decision)
    dark = [d for d in decisions if d.inputs.get("dark_llms")]
    assert dark and all(d.action == "keep" for d in dark)
    assert dark[-1].inputs["forecast_rps"]["beam"] > 13.0 and dark[-1].inputs["confirmed_rate_rps"]["beam"] == 11.0
    overloaded = _latencies(context, allocation, {"beam": dark[-1].inputs["forecast_rps"]["beam"]})
    assert overloaded is not None and math.isinf(overloaded["beam"])  # at the forecast, a swap would pay
    assert _meets(_latencies(context, allocation, {"beam": 11.0}), {"beam": math.inf})  # it carries what holds now


def _full_beam(context: PolicyContext) -> tuple[Allocation, Placement, Allocation, Placement]:
    """The plan for 10.5 req/s on beam-4xa6000 (gen on GPUs 0-1, ver's two replicas on GPUs 2 and
    3: no GPU with 7 units free), and the same plan with ver re-shaped to 7 units on the same GPUs
    (each successor needs its predecessor's GPU)."""
    allocation = context.replanner.allocation({"beam": 10.5})
    assert allocation is not None
    placement = context.replanner.place(allocation, None)
    assert placement is not None
    assert allocation.of("ver").replicas == 2 and allocation.of("ver").share == 10 and allocation.units >= 38  # no GPU has 7 units free
    smaller = Allocation(allocation.fractions_per_gpu, tuple(replace(c, share=7) if c.llm == "ver" else c for c in allocation.llms))
    reshaped = Placement(placement.fractions_per_gpu, tuple(
        replace(r, replica=r.replica + 2, shards=tuple(Shard(x.gpu, 7) for x in r.shards)) if r.llm == "ver" else r
        for r in placement.replicas))
    return allocation, placement, smaller, reshaped


def test_a_reshape_of_an_llm_with_two_replicas_rolls_and_is_not_dark(beam_context):
    """ver's two replicas each hold a whole GPU and their successors need those GPUs: the policy
    does not count ver dark (one stops while the other serves), and the simulated fleet swaps
    them one at a time: ver always has a replica serving, and no moment holds more than 4 GPUs."""
    allocation, placement, smaller, reshaped = _full_beam(beam_context)
    assert _dark_llms(beam_context, placement, reshaped, ONE_AT_A_TIME) == []
    assert _dark_llms(beam_context, placement, reshaped, NEVER) == ["ver"]  # one of two still starts, or the other could not carry the load
    single = Placement(placement.fractions_per_gpu, tuple(r for r in reshaped.replicas if not (r.llm == "ver" and r.replica == 3)))
    assert _dark_llms(beam_context, without_replicas(allocation, placement, {"ver": 1})[1], single, ONE_AT_A_TIME) == ["ver"]
    beam = beam_context.instance
    sim = SimulationSettings(duration_s=600.0, warmup_s=0.0, drain_s=600.0)
    serving: list[int] = []
    held: list[float] = []
    fleets: list[_Fleet] = []

    def controller(env, cluster):
        fleet = _Fleet(env, beam, sim, 60.0, allocation, placement)
        fleet.attach(cluster)
        fleets.append(fleet)
        yield env.timeout(60.0)
        fleet.apply(smaller, reshaped)
        while True:
            serving.append(fleet.serving("ver"))
            held.append(fleet.gpus_held())
            yield env.timeout(1.0)

    import random
    rng = random.Random(3)
    times, t = [], 0.0
    while t < 600.0:
        t += rng.expovariate(4.0)
        times.append(t)
    result = simulate(beam, allocation, sim, arrivals={"beam": [x for x in times if x < 600.0]}, controller=controller)
    assert min(serving) >= 1 and max(held) <= 4.0 + 1e-9
    key = lambda p: sorted((r.llm, r.node, r.shards) for r in p.replicas)  # noqa: E731
    assert key(fleet_placement(fleets[0])) == key(reshaped)
    ver_changes = sorted(t for t, llm, _ in fleets[0].changes if llm == "ver")
    assert ver_changes  # the swap happened
    assert result.workflow("beam").unfinished == 0


def test_a_scale_down_never_leaves_an_llm_dark(beam_context):
    """gen runs on GPUs 0-1 and ver on GPU 2 (the plan for 10.5 req/s less a ver replica) when the
    load falls to 1 req/s: the cheapest plan re-shapes both. A scale-down is taken only where every
    LLM keeps a serving replica through it; where its successors need the GPUs their
    predecessors hold, the decision keeps the plan and says why."""
    full = beam_context.replanner.allocation({"beam": 10.5})
    allocation, placement = without_replicas(full, beam_context.replanner.place(full, None), {"ver": 1})
    state = ControllerState.initial(allocation, placement)
    ready = {c.llm: c.replicas for c in allocation.llms}
    at = beam_context.instance.with_arrival_rates({"beam": 1.0})
    observed = {m.name: at.offered_rate_rps(m.name) for m in beam_context.instance.llms}
    decisions = []
    for k in range(10):
        before = state.placement
        state, decision = decide(state, Observation(60.0 * k, observed, ready, workflow_rates_rps={"beam": 1.0}), beam_context)
        decisions.append(decision)
        if decision.action == "replan":
            assert decision.placement is not None
            assert _dark_llms(beam_context, before, decision.placement, NEVER) == []
            ready = {c.llm: c.replicas for c in state.allocation.llms}
    guarded = [d for d in decisions if "dark_llms" in d.inputs]
    assert all("without a serving replica" in d.reason for d in guarded)
    assert guarded or any(d.action == "replan" for d in decisions)  # the cheaper plan was seen


def test_a_reshape_places_the_new_replicas_on_the_gpus_free_now(beam_context):
    """Scaling down from 3 req/s (gen and ver on one GPU each, two GPUs free) to 1 req/s re-shapes
    ver to a smaller share: the re-placement puts its new replica on a GPU free now, so it starts
    before its predecessor stops (no unit waits for one that runs: occupied units 0)."""
    replanner = beam_context.replanner
    small = replanner.allocation({"beam": 1.0})
    running = replanner.place(replanner.allocation({"beam": 3.0}), None)
    reshaped = {c.llm for c in small.llms} - {c.llm for c in replanner.allocation({"beam": 3.0}).llms if c == small.of(c.llm)}
    assert reshaped  # something must move for the stage to decide
    placed = replanner.place(small, running)
    assert _dark_llms(beam_context, running, placed, NEVER) == []
    assert evaluate(beam_context.instance.cluster, small, placed, running).occupied_units == 0
    held_now = {s.gpu for r in running.replicas for s in r.shards}
    moved = [r for r in placed.replicas if r.llm in reshaped]
    assert moved and all(not held_now & {s.gpu for s in r.shards} for r in moved)


def test_every_system_starts_from_the_plan_for_the_first_minutes_rate(rag, rag_plan):
    """Given the plan for rag's full rate and arrivals at 2 req/s, the controller and the static
    plan both start from the plan for the first 5 minutes' rate, not from the given one."""
    arrivals = _step_arrivals(2.0, 1.0, minutes=3.0)
    settings = ClosedLoopSettings(ControlSettings(startup_s=60.0, period_s=60.0))
    runs = run_systems(rag, rag_plan.allocation, rag_plan.placement, arrivals, ["scepsy-control", "static"], settings)
    context = make_context(rag, settings.control, allocation=rag_plan.allocation)
    start, _ = opening_plan(context, arrivals)
    assert start.gpus() < rag_plan.allocation.gpus()
    assert [run.timeline[0].gpus for run in runs] == [start.gpus(), start.gpus()]


@pytest.mark.parametrize("shape, during, ratio", [
    ("ramp", (12, 20), 3.0 / 1.4), ("step", (6, 20), 2.0), ("burst", (5, 7), 1.5), ("dip", (5, 15), 0.1), ("constant", (5, 20), 1.0)])
def test_the_scenarios_load_shapes(shape, during, ratio):
    """Each bench scenario's arrivals: the rate within `during` (minutes) over the first four
    minutes' is the shape's ratio (within Poisson noise at 20 req/s; the ramp's first four
    minutes run at 1.4 times its start on average)."""
    arrivals = shaped_arrivals({"w": 20.0}, shape, 20.0, seed=1)
    minutes = rate_bins(arrivals, 1200.0, 60.0)["w"]
    observed = float(minutes[during[0]:during[1]].mean()) / float(minutes[:4].mean())
    assert observed == pytest.approx(ratio, rel=0.1)
    assert shaped_arrivals({"w": 20.0}, shape, 20.0, seed=1) == arrivals
    with pytest.raises(InputError, match="unknown load shape"):
        shaped_arrivals({"w": 1.0}, "wave", 1.0)


def test_scaled_arrivals_keep_the_shape_and_the_seed():
    times = [float(k) for k in range(100)]
    assert len(scale_arrivals(times, 2.0)) == 200
    assert scale_arrivals(times, 1.5, seed=1) == scale_arrivals(times, 1.5, seed=1)
    assert 30 <= len(scale_arrivals(times, 0.5)) <= 70


def test_the_cli_prints_the_systems_as_json(tmp_path, rag, rag_plan):
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(api.plan_document(rag_plan)))
    arrivals = tmp_path / "arrivals.jsonl"
    arrivals.write_text("".join(json.dumps({"workflow": "rag", "arrival_s": t}) + "\n"
                                for t in _step_arrivals(4.0, 1.0, minutes=3.0)["rag"]))
    result = CliRunner().invoke(app, ["control", str(RAG), "--plan", str(plan_path), "--simulate", "--arrivals", str(arrivals),
                                      "--startup-s", "60", "--baselines", "static", "--json", "--plot", str(tmp_path / "c.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")
    document = json.loads(result.output)
    assert [s["name"] for s in document["systems"]] == ["scepsy-control", "static"]
    for system in document["systems"]:
        assert set(system) >= {"name", "gpu_hours", "replicas_moved", "replicas_moved_lower_bound", "flaps", "decision_p99_s",
                               "workflows"}
        for workflow in system["workflows"]:
            assert set(workflow) >= {"name", "slo_miss_minutes", "requests_unfinished", "latency_mean_s", "latency_p99_s"}
    bad = CliRunner().invoke(app, ["control", str(RAG), "--plan", str(plan_path), "--simulate", "--arrivals", str(arrivals),
                                   "--baselines", "hpa"])
    assert bad.exit_code == 2 and "--baselines" in bad.output
