"""The replay profiler against a real loopback server: dependencies kept, saturation found, rows valid."""

from __future__ import annotations

import asyncio
import json

import pytest

from scepsy.models.errors import InputError
from scepsy.models.instance.profile import build_profile, read_profile_frame
from scepsy.tracing.capture.proxy import ServerThread
from scepsy.tracing.capture.records import CallRecord
from scepsy.tracing.profiling.replay import (
    Sweep, SweepSettings, auto_start_rate, merge_profile_rows, probe_service_time, profile_rows, replay_requests,
)
from support.scripted import ScriptedEngine


def record(i, llm, start, end, rid="r0", tokens=4, body=True):
    payload = {"model": llm, "messages": [{"role": "user", "content": f"call {i}"}], "max_tokens": tokens}
    return CallRecord(call_id=f"c{i:03d}", llm=llm, path="/v1/chat/completions", start_s=start, end_s=end, status=200,
                      workflow="wf", workflow_id=rid, request_body=json.dumps(payload).encode() if body else None)


def beam_trace(requests=3, scale=1.0):
    """Per request: 2 parallel gen calls, a ver call, then 2 more parallel gen calls."""
    calls, i = [], 0
    for r in range(requests):
        t = 100.0 * r
        for start, end, llm in [(0, 1, "gen"), (0, 1.2, "gen"), (1.2, 1.5, "ver"), (1.5, 2.5, "gen"), (1.5, 2.4, "gen")]:
            calls.append(record(i, llm, t + scale * start, t + scale * end, f"r{r}"))
            i += 1
    return calls


def test_dependencies_and_gaps_from_the_trace():
    requests = replay_requests(beam_trace(2), "gen")
    assert len(requests) == 2
    calls = requests[0].calls
    assert [c.deps for c in calls] == [(), (), (0, 1), (0, 1)]
    # the gap after the last dependency (the verifier's time) is kept in the recorded offsets
    assert calls[2].rel_start_s == pytest.approx(1.5) and calls[1].rel_end_s == pytest.approx(1.2)
    assert replay_requests(beam_trace(1), "ver")[0].calls[0].deps == ()


def test_no_bodies_or_unknown_llm_is_a_clear_error():
    with pytest.raises(InputError, match="no request bodies"):
        replay_requests([record(0, "gen", 0, 1, body=False)], "gen")
    with pytest.raises(InputError, match="use one of: gen"):
        replay_requests([record(0, "gen", 0, 1)], "ver")


def test_model_override():
    (request,) = replay_requests([record(0, "gen", 0, 1)], "gen", model="served-name")
    assert json.loads(request.calls[0].body)["model"] == "served-name"


def test_replay_keeps_order_inside_each_request():
    engine = ScriptedEngine(token_delay_s=0.01)  # 4 tokens: ~30 ms per call
    with ServerThread(engine.app()) as server:
        sweep = Sweep(replay_requests(beam_trace(3), "gen"), server.url, SweepSettings(rates_rps=(20.0,), duration_s=0, min_requests=3), 1)
        (point,) = asyncio.run(sweep.run())
    assert point.completed == point.calls == 12 and point.failed == 0
    by_request = {}
    for item in engine.received:
        content = json.loads(item["body"])["messages"][0]["content"]
        by_request.setdefault(int(content.split()[1]) // 5, []).append((int(content.split()[1]) % 5, item["time"]))
    for sent in by_request.values():
        times = dict(sent)
        # calls 3 and 4 depend on calls 0 and 1 (~30 ms each) plus the 0.3 s verifier gap
        assert min(times[3], times[4]) - max(times[0], times[1]) > 0.3


def test_sweep_finds_saturation_of_a_serial_engine(tmp_path):
    engine = ScriptedEngine(token_delay_s=0.01, serial=True)  # 4 tokens: 30 ms per call -> ~33 calls/s
    calls = [record(i, "gen", 10.0 * i, 10.0 * i + 0.03, f"r{i}") for i in range(20)]
    with ServerThread(engine.app()) as server:
        requests = replay_requests(calls, "gen")
        service = asyncio.run(probe_service_time(requests, server.url))
        assert service >= 0.03  # 3 token delays of 10 ms (the sleeps bound it below; load only adds)
        sweep = Sweep(requests, server.url, SweepSettings(duration_s=0.5, min_requests=8), auto_start_rate(service))
        points = asyncio.run(sweep.run())
    stable = [p for p in points if not p.saturated]
    saturated = [p for p in points if p.saturated]
    assert stable and saturated
    assert points[0].latency_s["mean"] >= 0.03
    capacity = max(p.arrival_rate_rps for p in stable)
    assert capacity < 40  # a serial engine of 30 ms per call serves at most ~33 calls/s, whatever the load
    rows = profile_rows(points, "cpu", 1, 0.5)
    path = tmp_path / "p.csv"
    from scepsy.models.instance.profile import write_profile

    write_profile(rows, path)
    profile = build_profile(read_profile_frame(path), str(path))
    assert profile.has("cpu", 1)
    assert profile.curves[("cpu", 1)][0].capacity_rps == pytest.approx(capacity, rel=1e-5)


def test_a_sweep_started_above_capacity_halves_its_rate_to_a_stable_point():
    """A start the engine cannot take (the service-time probe met a slow moment): the sweep goes
    down until a point is stable, then bisects, so the profile has a capacity."""
    engine = ScriptedEngine(token_delay_s=0.01, serial=True)  # 30 ms per call -> ~33 calls/s
    calls = [record(i, "gen", 10.0 * i, 10.0 * i + 0.03, f"r{i}") for i in range(20)]
    with ServerThread(engine.app()) as server:
        sweep = Sweep(replay_requests(calls, "gen"), server.url, SweepSettings(duration_s=0.5, min_requests=8), 200.0)
        points = asyncio.run(sweep.run())
    rates = [p.target_rate_rps for p in points]
    assert points[0].saturated and rates[:2] == [200.0, 100.0]
    stable = [p for p in points if not p.saturated]
    assert stable and max(p.arrival_rate_rps for p in stable) < 40
    assert min(p.target_rate_rps for p in points if p.saturated) > max(p.target_rate_rps for p in stable)


def test_merge_keeps_other_configurations():
    import pandas as pd

    old = pd.DataFrame([{"gpu_type": "A", "tp": 1, "fraction": 0.5, "arrival_rate": 1, "throughput": 1, "latency_mean": 1,
                         "latency_p50": 1, "latency_p90": 1, "latency_p99": 1},
                        {"gpu_type": "A", "tp": 2, "fraction": 0.5, "arrival_rate": 1, "throughput": 1, "latency_mean": 2,
                         "latency_p50": 2, "latency_p90": 2, "latency_p99": 2}])
    new = old.iloc[[0]].assign(latency_mean=9.0)
    merged = merge_profile_rows(old, new)
    assert sorted(zip(merged["tp"], merged["latency_mean"])) == [(1, 9.0), (2, 2.0)]


def test_arrival_processes():
    import random

    from scepsy.tracing.profiling.replay import arrival_times

    assert arrival_times(4, 2.0, "uniform", random.Random(0)) == [0.0, 0.5, 1.0, 1.5]
    poisson = arrival_times(2000, 2.0, "poisson", random.Random(0))
    assert poisson == arrival_times(2000, 2.0, "poisson", random.Random(0))  # seeded
    assert poisson[-1] / 1999 == pytest.approx(0.5, rel=0.1)
    with pytest.raises(InputError, match="poisson, uniform"):
        arrival_times(2, 1.0, "bursty", random.Random(0))


def test_a_long_request_arriving_last_is_not_lost_throughput():
    from scepsy.tracing.profiling.replay import replay_throughput

    light = {"short": 1.0, "long": 20.0}
    # 10 requests, one per second; the long one arrives last and ends 20 s later, as on an idle engine
    finished = [("short", float(a), a + 1.0) for a in range(9)] + [("long", 9.0, 29.0)]
    assert replay_throughput(30, 10.0, 1.0, finished, light) == pytest.approx(3.0)
    # a backlog still counts: every request 5 s later than its idle time by the end
    backlog = [("short", float(a), a + 1.0 + 0.5 * a) for a in range(10)]
    assert replay_throughput(30, 10.0, 1.0, backlog, light) == pytest.approx(30 / (4.5 + 9.0 + 1.0))
