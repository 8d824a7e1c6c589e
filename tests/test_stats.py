"""Workflow statistics against hand-built traces with known n and p."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import yaml
from hypothesis import given, settings, strategies as st

from scepsy.models.instance.instance import InstanceSpec
from scepsy.tracing.capture.records import CallRecord
from scepsy.models.instance.statistic import union_length
from scepsy.tracing.statistics.stats import aggregate, stats_to_dict

_ids = itertools.count()


def call(llm: str, start: float, end: float, workflow_id: str | None = "r0", workflow: str | None = "wf", status: int = 200,
         outcome: str = "ok") -> CallRecord:
    return CallRecord(call_id=f"c{next(_ids):05d}", llm=llm, path="/v1/chat/completions", start_s=start, end_s=end,
                      status=status, outcome=outcome, workflow=workflow, workflow_id=workflow_id)


def beam_request(rid: str, t0: float, width: int, steps: int, gen_s: float, ver_s: float) -> list[CallRecord]:
    """`steps` rounds of `width` parallel generator calls, then `width` parallel verifier calls."""
    calls, t = [], t0
    for _ in range(steps):
        calls += [call("gen", t, t + gen_s, rid) for _ in range(width)]
        t += gen_s
        calls += [call("ver", t, t + ver_s, rid) for _ in range(width)]
        t += ver_s
    return calls


def test_parallel_fan_out_gives_known_n_and_p():
    calls = []
    for r in range(5):
        calls += beam_request(f"r{r}", 100.0 * r, width=3, steps=3, gen_s=1.0, ver_s=0.5)
    stats = aggregate(calls).workflow("wf")
    gen, ver = stats.llms
    assert (gen.llm, gen.invocations, gen.parallelism) == ("gen", 9.0, pytest.approx(3.0))
    assert (ver.llm, ver.invocations, ver.parallelism) == ("ver", 9.0, pytest.approx(3.0))
    assert stats.requests == 5 and stats.calls == 90
    assert stats.latency_s["mean"] == pytest.approx(4.5)
    assert stats.llm_time_fraction == pytest.approx(1.0)
    assert gen.time_share["mean"] == pytest.approx(3.0 / 4.5)


def test_serial_engine_fan_out_gives_k_plus_one_over_two():
    # k calls sent together to an engine that serves one at a time: call i ends at (i + 1) * s
    k, s = 4, 0.5
    calls = [call("gen", 0.0, (i + 1) * s) for i in range(k)]
    stats = aggregate(calls).workflow("wf").llms[0]
    assert stats.parallelism == pytest.approx((k + 1) / 2)
    # and the pipeline's contribution L * n / p equals the busy time k * s exactly
    assert stats.call_latency_s["mean"] * stats.invocations / stats.parallelism == pytest.approx(k * s)


def test_invocations_count_requests_without_calls_and_p_is_pooled():
    calls = [call("gen", 0, 1, "a"), call("gen", 0, 1, "a"), call("ver", 1, 2, "a")]  # gen p = 2 over 1 s
    calls += [call("ver", 10, 11, "b")]  # request b never calls gen
    calls += [call("gen", 20, 24, "c"), call("ver", 24, 25, "c")]  # gen p = 1 over 4 s
    gen = aggregate(calls).workflow("wf").llms[0]
    assert gen.invocations == pytest.approx(3 / 3)  # (2 + 0 + 1) / 3 requests
    assert gen.parallelism == pytest.approx((2 + 4) / (1 + 4))  # pooled D / U, not the mean of 2 and 1
    assert gen.parallelism_summary["mean"] == pytest.approx(1.5)
    assert gen.invocations_summary == {"mean": 1.0, "std": 1.0, "min": 0.0, "max": 2.0}
    assert gen.requests_calling == 2


def test_pooled_statistics_reproduce_mean_busy_time():
    rng = np.random.default_rng(7)
    calls = []
    for r in range(30):
        t = 1000.0 * r
        for _ in range(rng.integers(1, 6)):
            width = int(rng.integers(1, 5))
            lengths = rng.uniform(0.2, 2.0, width)
            calls += [call("gen", t, t + x, f"r{r}") for x in lengths]
            t += lengths.max() + 0.1
    stats = aggregate(calls).workflow("wf")
    gen = stats.llms[0]
    busy = np.mean([union_length((c.start_s, c.end_s) for c in calls if c.workflow_id == f"r{r}") for r in range(30)])
    assert gen.call_latency_s["mean"] * gen.invocations / gen.parallelism == pytest.approx(busy)


def test_untagged_and_failed_calls_are_skipped_and_counted():
    calls = [call("gen", 0, 1), call("gen", 0, 1, workflow_id=None), call("gen", 0, 1, status=500),
             call("gen", 0, 1, outcome="client_disconnect")]
    stats = aggregate(calls)
    assert (stats.calls_total, stats.calls_untagged, stats.calls_failed) == (4, 1, 2)
    assert stats.workflows[0].calls == 1


def test_workflow_names_and_default():
    calls = [call("gen", 0, 1, workflow="beam"), call("gen", 0, 1, "x", workflow=None)]
    stats = aggregate(calls, default_workflow="unnamed")
    assert [w.name for w in stats.workflows] == ["beam", "unnamed"]


def test_relative_share_more_stable_than_absolute_time():
    # requests of very different sizes with the same 2:1 split between gen and ver
    calls = []
    for r, scale in enumerate([1, 3, 10, 30]):
        calls += beam_request(f"r{r}", 1000.0 * r, width=1, steps=scale, gen_s=2.0, ver_s=1.0)
    gen = aggregate(calls).workflow("wf").llms[0]
    assert gen.time_share["mean"] == pytest.approx(2 / 3) and gen.time_share_cv == pytest.approx(0.0, abs=1e-12)
    assert gen.busy_time_cv is not None and gen.busy_time_cv > 1.0 and gen.stability_ratio is None  # a zero-spread share: ratio undefined


def test_output_drops_into_an_instance():
    calls = beam_request("r0", 0, 2, 2, 1.0, 1.0)
    data = stats_to_dict(aggregate(calls))
    stages = data["workflows"][0]["stages"]
    assert stages == [{"llm": "gen", "invocations": 4.0, "parallelism": 2.0}, {"llm": "ver", "invocations": 4.0, "parallelism": 2.0}]
    spec = {
        "cluster": {"gpu_types": {"A": {"memory_gib": 10}}, "nodes": [{"name": "n", "gpu_type": "A", "gpus": 1}]},
        "llms": [{"name": m, "model": m, "weights_gib": 1, "profile": "p.csv"} for m in ("gen", "ver")],
        "workflows": [{"name": "wf", "arrival_rate": 1.0, "stages": stages}],
    }
    InstanceSpec.model_validate(yaml.safe_load(yaml.safe_dump(spec)))
    assert yaml.safe_dump(data) == yaml.safe_dump(stats_to_dict(aggregate(list(reversed(calls)))))  # order-free


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), min_size=0, max_size=12))
def test_union_length_matches_a_unit_grid(pairs):
    intervals = [(float(a), float(a + d)) for a, d in pairs]
    covered = {t for a, b in intervals for t in range(int(a), int(b))}
    assert union_length(intervals) == pytest.approx(len(covered))


def test_critical_path_share_and_latency_ratios_drop_into_an_instance():
    """Serial requests keep f = 1 (and no `critical_path` in the stages); two judges side by side
    share their overlap; the end-to-end latency spread gives the ratios an instance takes."""
    serial = stats_to_dict(aggregate(beam_request("r0", 0, 2, 2, 1.0, 1.0) + beam_request("r1", 10, 2, 4, 1.0, 1.0)))
    assert all("critical_path" not in s for s in serial["workflows"][0]["stages"])
    ratios = serial["workflows"][0]["latency_ratios"]  # requests of 4 s and 8 s: mean 6
    assert ratios["p50"] == pytest.approx(1.0) and ratios["p99"] == pytest.approx(7.96 / 6, rel=1e-5)  # 6 digits
    calls = []
    for k in range(4):  # judges a [0, 1] and b [0, 3] side by side, then the aggregator [3, 4]
        t = 10.0 * k
        calls += [call("a", t, t + 1, f"e{k}"), call("b", t, t + 3, f"e{k}"), call("agg", t + 3, t + 4, f"e{k}")]
    stats = aggregate(calls).workflow("wf")
    shares = {s.llm: s.critical_path for s in stats.llms}
    assert shares == pytest.approx({"a": 0.5, "b": (0.5 + 2) / 3, "agg": 1.0})
    stages = stats_to_dict(aggregate(calls))["workflows"][0]["stages"]
    spec = {
        "cluster": {"gpu_types": {"A": {"memory_gib": 10}}, "nodes": [{"name": "n", "gpu_type": "A", "gpus": 1}]},
        "llms": [{"name": m, "model": m, "weights_gib": 1, "profile": "p.csv"} for m in ("a", "b", "agg")],
        "workflows": [{"name": "wf", "arrival_rate": 1.0, "stages": stages}],
    }
    InstanceSpec.model_validate(yaml.safe_load(yaml.safe_dump(spec)))
