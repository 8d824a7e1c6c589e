"""The critical-path share (models/instance/statistic.py): exact for serial requests, the request's LLM
time split among the LLMs running side by side, and the pipeline unchanged where f = 1."""

from __future__ import annotations

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy.models.instance.statistic import critical_time_s, merged_segments, union_length
from scepsy.models.instance.allocation import Allocation, LlmAllocation
from scepsy.models.performance.alp import predict
from scepsy.models.instance.instance import load_instance
from scepsy.models.simulation.simulator import SimulationSettings, simulate

from conftest import INSTANCES

LLMS = ("a", "b", "c")
gaps = st.floats(0.0, 2.0, allow_nan=False)
durations = st.floats(0.001, 3.0, allow_nan=False)


@st.composite
def serial_request(draw):
    """Calls of several LLMs one stage after another; within a stage, calls of one LLM at once."""
    spans: dict[str, list[tuple[float, float]]] = {m: [] for m in LLMS}
    t = 0.0
    for _ in range(draw(st.integers(1, 8))):
        llm = draw(st.sampled_from(LLMS))
        t += draw(gaps)
        ends = [t + draw(durations) for _ in range(draw(st.integers(1, 4)))]
        spans[llm] += [(t, end) for end in ends]
        t = max(ends)
    return spans


@settings(max_examples=200, deadline=None)
@given(serial_request())
def test_serial_requests_are_all_on_the_critical_path(spans):
    credit = critical_time_s(spans)
    for llm, intervals in spans.items():
        assert credit[llm] == union_length(intervals)  # bit for bit: f = 1 exactly


@st.composite
def any_request(draw):
    return {m: [(s, s + draw(durations)) for s in draw(st.lists(st.floats(0, 10), max_size=4))] for m in LLMS}


@settings(max_examples=200, deadline=None)
@given(any_request())
def test_the_shares_add_up_to_the_request_llm_time(spans):
    credit = critical_time_s(spans)
    every = [iv for intervals in spans.values() for iv in intervals]
    own = {llm: union_length(intervals) for llm, intervals in spans.items()}
    # the request's LLM time, once; overlaps of under 5% of a segment (tracing jitter) count twice
    assert union_length(every) - 1e-9 <= sum(credit.values()) <= sum(own.values()) + 1e-9
    if all(b[1] <= a[0] or a[1] <= b[0] for x, y in ((x, y) for x in LLMS for y in LLMS if x < y)
           for a in spans[x] for b in spans[y]):
        assert sum(credit.values()) == pytest.approx(union_length(every), abs=1e-9)
    for llm, intervals in spans.items():
        assert -1e-12 <= credit[llm] <= own[llm] + 1e-9


def test_three_judges_side_by_side_then_an_aggregator():
    # judges busy [0, 1], [0, 2], [0, 4]; aggregator [4, 5]
    spans = {"j1": [(0, 1)], "j2": [(0, 2)], "j3": [(0, 4)], "agg": [(4, 5)]}
    credit = critical_time_s(spans)
    assert credit == {"j1": 1 / 3, "j2": 1 / 3 + 1 / 2, "j3": 1 / 3 + 1 / 2 + 2, "agg": 1}
    assert merged_segments([(0, 1), (0.5, 2), (3, 4)]) == [(0, 2), (3, 4)]


def test_a_default_stage_predicts_exactly_as_n_over_p(write_instance):
    instance = load_instance(write_instance())
    stage = instance.workflows[0].stages[0]
    assert stage.critical_path == 1.0 and stage.latency_weight == stage.invocations / stage.parallelism
    prediction = predict(instance, Allocation(10, (LlmAllocation("gen", "A6000", 1, 10, 1), LlmAllocation("ver", "A6000", 2, 5, 1))))
    gen = prediction.llm("gen")
    assert prediction.workflow("beam").stages[0].latency_contribution_s == gen.latency_s * stage.invocations / stage.parallelism


def test_the_ensemble_program_runs_its_judges_side_by_side():
    instance = load_instance(INSTANCES / "ensemble-4xa6000.yaml").scaled(0.25)
    allocation = Allocation(10, tuple(LlmAllocation(m.name, "A6000", 1, 10, 1) for m in instance.llms))
    result = simulate(instance, allocation, SimulationSettings(duration_s=40.0, seed=0)).workflow("ensemble")
    shares = {s.llm: s.critical_path for s in result.stages}
    assert shares["aggregator"] == 1.0 and all(s.invocations == 1.0 for s in result.stages)
    assert all(shares[j] < 0.8 for j in ("judge-small", "judge-mistral", "judge-qwen"))
    # the shipped stages carry the traced shares; the prediction at this light load is close
    predicted = predict(instance, allocation).workflow("ensemble").latency_s
    assert abs(predicted - result.latency_mean_s) <= 0.1 * result.latency_mean_s


def test_tracing_jitter_between_serial_calls_keeps_f_one():
    # the next stage's call starts 0.2 ms before the proxy stamped the previous call's end
    spans = {"embed": [(0.0, 0.1)], "gen": [(0.0998, 1.0)]}
    assert critical_time_s(spans) == {"embed": union_length(spans["embed"]), "gen": union_length(spans["gen"])}
