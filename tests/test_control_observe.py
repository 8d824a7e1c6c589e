"""Observing for the controller: a real Prometheus server (Debian package `prometheus`) scraping
`scepsy emulate` replicas that export vLLM's metric names, read through the Prometheus HTTP API by
control/prometheus.py; and the faults a Prometheus can have (unreachable, slow, no series, NaN,
stale, errors), each a typed `Missing`, never a zero.

The real server is driven by events, not by time: the test waits (polling the API) until
Prometheus has scraped every target, then sends requests, then waits until Prometheus shows the
counters at the totals sent. The faults Prometheus cannot be made to produce on demand (a NaN
answer, an answer that never comes, a 503) come from a loopback HTTP double speaking the same API.
"""

from __future__ import annotations

import math
from contextlib import ExitStack

import httpx
import pytest

from support import prometheus_server
from support.prometheus_double import PrometheusDouble, vector
from support.prometheus_server import PrometheusServer

from scepsy.control.act import ClusterState, RunningReplica
from scepsy.control.observe import missing_llms, observation
from scepsy.control.prometheus import (
    Missing,
    PrometheusClient,
    PrometheusSettings,
    freshness_query,
    llm_latency_query,
    rate_query,
    read_llms,
)
from scepsy.tracing.capture.proxy import ServerThread
from scepsy.tracing.emulation.emulator import create_app, emulator_config

needs_prometheus = pytest.mark.skipif(not prometheus_server.available(), reason="the Debian package prometheus is not installed (.ci/run installs it)")


def _replica(stack: ExitStack, llm: str, personality: str = "vllm") -> ServerThread:
    config = emulator_config("llama-3.2-1b", "H100", served_model_names=[llm], speedup=1000.0, personality=personality)
    return stack.enter_context(ServerThread(create_app(config)))


def _chat(url: str, llm: str, i: int) -> None:
    body = {"model": llm, "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 2}
    assert httpx.post(url + "/v1/chat/completions", json=body, timeout=60.0).status_code == 200


def _total(found: list[dict], llm: str) -> float:
    return sum(float(s["value"][1]) for s in found if s["metric"].get("model_name") == llm)


@needs_prometheus
def test_real_prometheus_gives_per_llm_rates_of_emulated_vllm_replicas(tmp_path):
    recorded: list[float] = []
    with ExitStack() as stack:
        gen = [_replica(stack, "gen"), _replica(stack, "gen")]
        ver = [_replica(stack, "ver")]
        sgl = _replica(stack, "sgl", personality="sglang")  # an SGLang engine: read with SGLang's names
        hosts = {"gen": [s.url.removeprefix("http://") for s in gen], "ver": [s.url.removeprefix("http://") for s in ver],
                 "sgl": [sgl.url.removeprefix("http://")]}
        server = stack.enter_context(PrometheusServer(tmp_path, hosts))
        server.wait_for_targets(4)
        # every replica's counter is in Prometheus at 0 before any request: the increase falls in the window
        server.wait_for("vllm:request_success_total", lambda found: len(found) == 4 * 3)
        server.wait_for("sglang:num_requests_total")
        for i in range(6):
            _chat(gen[i % 2].url, "gen", i)
        for i in range(2):
            _chat(ver[0].url, "ver", i)
        for i in range(3):
            _chat(sgl.url, "sgl", i)
        totals = "sum by (model_name) (vllm:request_success_total)"
        server.wait_for(totals, lambda found: _total(found, "gen") == 6 and _total(found, "ver") == 2)
        server.wait_for("sum by (model_name) (sglang:num_requests_total)", lambda found: _total(found, "sgl") == 3)
        # and their latency histograms, observed once per finished request
        server.wait_for("sum by (model_name) (vllm:e2e_request_latency_seconds_count)",
                        lambda found: (_total(found, "gen"), _total(found, "ver"), _total(found, "sgl")) == (6, 2, 3))
        server.wait_for("sum by (model_name) (sglang:e2e_request_latency_seconds_count)", lambda found: _total(found, "sgl") == 3)

        # vLLM's label set arrived as vLLM writes it: model_name, engine, finished_reason
        series = server.query('vllm:request_success_total{model_name="gen"}')
        assert {s["metric"]["finished_reason"] for s in series} == {"stop", "length", "abort"}
        assert {s["metric"]["engine"] for s in series} == {"0"}

        client = PrometheusClient(PrometheusSettings(server.url, window_s=600.0, max_age_s=600.0), sleep=recorded.append)
        samples = read_llms(client, ["gen", "ver", "absent"])
        gen_rate, ver_rate = samples.rates_rps["gen"], samples.rates_rps["ver"]
        assert isinstance(gen_rate, float) and isinstance(ver_rate, float)
        assert math.isfinite(gen_rate) and math.isfinite(ver_rate)
        assert gen_rate > ver_rate > 0  # 6 against 2 finished requests over the same scrapes
        assert samples.waiting["gen"] == 0.0 and samples.running["ver"] == 0.0
        assert samples.kv_usage["gen"] == 0.0  # idle: nothing cached in use
        absent = samples.rates_rps["absent"]
        assert isinstance(absent, Missing) and absent.reason == "no series"
        assert recorded == []  # nothing retried
        # each LLM's mean call latency over the window, from the engines' histograms
        for llm in ("gen", "ver"):
            latency = samples.latency_s[llm]
            assert isinstance(latency, float) and math.isfinite(latency) and latency > 0, (llm, latency)
        assert isinstance(samples.latency_s["absent"], Missing)
        cluster = ClusterState((_running("gen", 0, True), _running("gen", 1, True), _running("ver", 0, True)), None)
        seen = observation(1.0, ["gen", "ver", "absent"], samples, cluster)
        assert seen.llm_latency_s == {"gen": samples.latency_s["gen"], "ver": samples.latency_s["ver"]}  # absent left out

        sglang = read_llms(PrometheusClient(PrometheusSettings(server.url, window_s=600.0, max_age_s=600.0, engine="sglang")), ["sgl", "gen"])
        sgl_rate = sglang.rates_rps["sgl"]
        assert isinstance(sgl_rate, float) and sgl_rate > 0 and sglang.waiting["sgl"] == 0.0
        sgl_latency = sglang.latency_s["sgl"]
        assert isinstance(sgl_latency, float) and math.isfinite(sgl_latency) and sgl_latency > 0
        assert isinstance(sglang.rates_rps["gen"], Missing)  # a vLLM engine has no SGLang series

        # the freshness query reads the newest sample's time from the real server
        ages = client.query(freshness_query(client.settings))
        assert ages.missing is None and {s.labels["model_name"] for s in ages.samples} == {"gen", "ver", "sgl"}

        # a replica whose target goes down: Prometheus marks its series stale, and the rate is missing, not 0
        ver[0].stop()
        server.wait_for('up{job="engines-ver"} == 0')
        samples = read_llms(client, ["gen", "ver"])
        assert isinstance(samples.rates_rps["gen"], float)
        down = samples.rates_rps["ver"]
        assert isinstance(down, Missing) and down.reason == "no series"
        assert list(missing_llms(samples)) == ["ver"]

        # Prometheus stops: unreachable, after 3 tries with backoff 0.5 s then 1 s (the injected sleep)
        server.stop()
        samples = read_llms(client, ["gen", "ver"])
        assert all(isinstance(v, Missing) and v.reason == "unreachable" for v in samples.rates_rps.values())
        assert recorded == [0.5, 1.0]  # and only for the first query: the others do not wait on it again
        assert samples.queries[0].attempts == 3


# ---------------------------------------------------------------------------------------------
# Faults through a loopback double of the HTTP API


@pytest.fixture()
def scripted():
    double = PrometheusDouble()
    yield double
    double.close()


def _client(url: str, sleeps: list[float], **kwargs) -> PrometheusClient:
    return PrometheusClient(PrometheusSettings(url, **kwargs), sleep=sleeps.append)


def test_nan_and_infinite_rates_are_missing_not_zero(scripted):
    settings = PrometheusSettings(scripted.url)
    scripted.answers[rate_query(settings)] = [(200, vector([("gen", 1000.0, "NaN"), ("ver", 1000.0, "+Inf"), ("emb", 1000.0, "2.5")]))]
    scripted.answers[freshness_query(settings)] = [(200, vector([("gen", 1000.0, "999"), ("ver", 1000.0, "999"), ("emb", 1000.0, "999")]))]
    samples = read_llms(_client(scripted.url, []), ["gen", "ver", "emb"])
    assert samples.rates_rps["emb"] == 2.5
    for llm in ("gen", "ver"):
        value = samples.rates_rps[llm]
        assert isinstance(value, Missing) and value.reason == "nan"


def test_a_sample_older_than_max_age_is_stale(scripted):
    settings = PrometheusSettings(scripted.url, max_age_s=60.0)
    scripted.answers[rate_query(settings)] = [(200, vector([("gen", 1000.0, "3"), ("ver", 1000.0, "1")]))]
    scripted.answers[freshness_query(settings)] = [(200, vector([("gen", 1000.0, "995"), ("ver", 1000.0, "939")]))]
    samples = read_llms(_client(scripted.url, [], max_age_s=60.0), ["gen", "ver"])
    assert samples.rates_rps["gen"] == 3.0
    stale = samples.rates_rps["ver"]
    assert isinstance(stale, Missing) and stale.reason == "stale" and "61 s old" in stale.detail


def test_a_prometheus_that_never_answers_times_out_after_every_try(scripted):
    scripted.hang.set()
    sleeps: list[float] = []
    client = _client(scripted.url, sleeps, timeout_s=0.2, attempts=2, backoff_s=3.0)
    samples = read_llms(client, ["gen"])
    value = samples.rates_rps["gen"]
    assert isinstance(value, Missing) and value.reason == "timeout"
    assert sleeps == [3.0]
    assert len(scripted.asked) == 2  # two tries of the rate query; nothing else asked of a Prometheus that is down


def test_server_errors_are_retried_and_bad_queries_are_not(scripted):
    settings = PrometheusSettings(scripted.url)
    unavailable = (503, {"status": "error", "errorType": "unavailable", "error": "starting"})
    scripted.answers[rate_query(settings)] = [unavailable, unavailable, (200, vector([("gen", 10.0, "1.5")]))]
    scripted.answers[freshness_query(settings)] = [(200, vector([("gen", 10.0, "9")]))]
    sleeps: list[float] = []
    samples = read_llms(_client(scripted.url, sleeps), ["gen"])
    assert samples.rates_rps["gen"] == 1.5 and sleeps == [0.5, 1.0] and samples.queries[0].attempts == 3

    sleeps.clear()
    bad = (400, {"status": "error", "errorType": "bad_data", "error": "parse error"})
    scripted.answers["sum("] = [bad]
    answer = _client(scripted.url, sleeps).query("sum(")
    assert answer.missing is not None and answer.missing.reason == "error" and "parse error" in answer.missing.detail
    assert sleeps == [] and answer.attempts == 1


def test_missing_reasons_are_typed():
    with pytest.raises(ValueError):
        Missing("zero", "a made-up reason")


# ---------------------------------------------------------------------------------------------
# samples -> the policy's Observation


def _running(llm: str, replica: int, ready: bool, deleting: bool = False) -> RunningReplica:
    return RunningReplica(f"{llm}-r{replica}", llm, replica, "node-0", (replica,), 1.0, ready, deleting)


def test_observation_counts_only_ready_replicas_and_passes_missing_as_none(scripted):
    settings = PrometheusSettings(scripted.url)
    scripted.answers[rate_query(settings)] = [(200, vector([("gen", 100.0, "4"), ("ver", 100.0, "NaN")]))]
    scripted.answers[freshness_query(settings)] = [(200, vector([("gen", 100.0, "99"), ("ver", 100.0, "99")]))]
    scripted.default = (200, vector([("gen", 100.0, "6"), ("ver", 100.0, "0.5")]))
    samples = read_llms(_client(scripted.url, []), ["gen", "ver"])
    cluster = ClusterState((_running("gen", 0, True), _running("gen", 1, True), _running("gen", 2, False),
                            _running("ver", 0, True), _running("ver", 1, True, deleting=True)), None)
    seen = observation(7.0, ["gen", "ver"], samples, cluster)
    assert seen.time_s == 7.0
    assert seen.llm_rates_rps == {"gen": 4.0, "ver": None}
    assert seen.ready_replicas == {"gen": 2, "ver": 1} and seen.starting_replicas == {"gen": 1, "ver": 0}
    assert seen.queue_per_replica == {"gen": 3.0, "ver": 0.5}  # waiting 6 over 2 ready, 0.5 over 1 ready
    assert seen.waiting_requests == {"gen": 6.0, "ver": 0.5}  # the backlog, whatever is ready
    assert seen.kv_usage == {"gen": 6.0, "ver": 0.5}

    scripted.hang.set()
    down = read_llms(_client(scripted.url, [], timeout_s=0.2, attempts=1), ["gen", "ver"])
    assert observation(8.0, ["gen", "ver"], down, cluster).llm_rates_rps is None  # Prometheus itself gave nothing


@pytest.mark.parametrize("body", [
    {"status": "success", "data": []},
    {"status": "success", "data": {"resultType": "matrix", "result": []}},
    {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": ["x"]}]}},
    {"status": "success", "data": {"resultType": "vector", "result": None}},
], ids=["data a list", "a matrix", "a short value", "no result list"])
def test_a_garbled_answer_is_an_error_not_a_number(scripted, body):
    scripted.default = (200, body)
    answer = _client(scripted.url, []).query("up")
    assert answer.missing is not None and answer.missing.reason == "error" and answer.samples == ()


def test_an_llm_whose_latency_is_nan_stale_or_absent_is_left_out_of_the_observation(scripted):
    """NaN (no call finished in the window: 0/0), infinite, stale or no series: the LLM has no
    latency in the observation (never 0), and the policy keeps its correction; where none has one,
    `llm_latency_s` is None."""
    settings = PrometheusSettings(scripted.url, max_age_s=60.0)
    llms = ["gen", "ver", "emb", "rr", "old"]
    scripted.answers[rate_query(settings)] = [(200, vector([(m, 1000.0, "1") for m in llms]))]
    scripted.answers[freshness_query(settings)] = [(200, vector([(m, 1000.0, "999") for m in llms[:-1]] + [("old", 1000.0, "900")]))]
    scripted.answers[llm_latency_query(settings)] = [(200, vector([("gen", 1000.0, "0.25"), ("ver", 1000.0, "NaN"),
                                                                   ("emb", 1000.0, "+Inf"), ("old", 1000.0, "0.5")]))]
    samples = read_llms(_client(scripted.url, [], max_age_s=60.0), llms)
    assert samples.latency_s["gen"] == 0.25
    reasons = {m: v.reason for m, v in samples.latency_s.items() if isinstance(v, Missing)}
    assert reasons == {"ver": "nan", "emb": "nan", "rr": "no series", "old": "stale"}
    cluster = ClusterState(tuple(_running(m, 0, True) for m in llms), None)
    assert observation(5.0, llms, samples, cluster).llm_latency_s == {"gen": 0.25}

    scripted.answers[llm_latency_query(settings)] = [(200, vector([("gen", 1000.0, "NaN")]))]
    nothing = read_llms(_client(scripted.url, [], max_age_s=60.0), llms)
    assert observation(6.0, llms, nothing, cluster).llm_latency_s is None


def test_the_latency_query_divides_the_histograms_rates_through_the_selector():
    vllm = PrometheusSettings("http://prometheus", window_s=60.0, selector='namespace="scepsy"')
    assert llm_latency_query(vllm) == ('sum by (model_name) (rate(vllm:e2e_request_latency_seconds_sum{namespace="scepsy"}[60s]))'
                                       ' / sum by (model_name) (rate(vllm:e2e_request_latency_seconds_count{namespace="scepsy"}[60s]))')
    sglang = PrometheusSettings("http://prometheus", window_s=30.0, engine="sglang")
    assert llm_latency_query(sglang) == ("sum by (model_name) (rate(sglang:e2e_request_latency_seconds_sum[30s]))"
                                         " / sum by (model_name) (rate(sglang:e2e_request_latency_seconds_count[30s]))")
