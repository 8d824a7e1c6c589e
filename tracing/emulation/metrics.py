"""The emulator's `GET /metrics`: the replica's state under the engines' own Prometheus names and
label sets, written by prometheus_client, so that Prometheus, the drain hook and the controller read
an emulated replica as they read a real engine.

vLLM (`vllm/v1/metrics/loggers.py`, `PrometheusStatLogger`, of the v0.11 line the manifests pin,
k8s/engines.py): every metric has the
labels `model_name` (the served model name) and `engine` (the engine core's index, "0" for one
engine); the gauges `vllm:num_requests_running`, `vllm:num_requests_waiting`,
`vllm:kv_cache_usage_perc` (0..1) and its deprecated twin `vllm:gpu_cache_usage_perc`; the counters
`vllm:num_preemptions`, `vllm:prompt_tokens`, `vllm:generation_tokens`, `vllm:prefix_cache_hits`
(prometheus_client adds `_total`) and `vllm:request_success` with the extra label
`finished_reason`, one series per reason from the start (`FINISH_REASON_STRINGS` of
`vllm/v1/engine/__init__.py`: stop, length, abort); the histogram
`vllm:e2e_request_latency_seconds` (`_bucket` at vLLM's `request_latency_buckets`, `_sum`,
`_count`), observed once per request answered in full, as vLLM observes each finished request.

SGLang (`python/sglang/srt/metrics/collector.py` and the labels `tokenizer_manager.py` and
`scheduler.py` give it), only with the `sglang` personality, as SGLang serves them
only with `--enable-metrics`: the scheduler's gauges `sglang:num_running_reqs`,
`sglang:num_queue_reqs`, `sglang:token_usage` (0..1) with the scheduler's labels `model_name`,
`engine_type` ("unified" without disaggregation), `tp_rank`, `pp_rank`; the tokenizer manager's
counter `sglang:num_requests_total` with `model_name`, `engine_type`, and beside it the tokenizer
manager's histogram `sglang:e2e_request_latency_seconds` with the same labels (at SGLang's default
`bucket_e2e_request_latency`).

A request's latency is the engine model's: from its arrival in the scheduler to its last
sequence's last token (what vLLM's and SGLang's `e2e_latency` measure), in seconds of the wall
clock, which the client and Prometheus' rates share: with `speedup` s, the modelled latency over s.

The emulator's own quantities are `scepsy_emulator_*`. Values are read from the live replica when
Prometheus scrapes (a collector, not state kept twice); the latency histograms, which no replica
keeps, are prometheus_client's own, observed as each request is answered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# vllm/v1/engine/__init__.py FINISH_REASON_STRINGS of the pinned release (later ones add more)
VLLM_FINISH_REASONS = ("stop", "length", "abort")
VLLM_LABELS = ("model_name", "engine")
SGLANG_SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank")
SGLANG_TOKENIZER_LABELS = ("model_name", "engine_type")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Latency buckets (upper bounds, s): vLLM's `request_latency_buckets` (vllm/v1/metrics/loggers.py)
# and SGLang's default `bucket_e2e_request_latency` (sglang/srt/metrics/collector.py)
VLLM_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                        480.0, 960.0, 1920.0, 7680.0)
SGLANG_LATENCY_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
                          400.0, 600.0, 1200.0, 1800.0, 2400.0)


def latency_histograms(registry: CollectorRegistry, personality: str, model_name: str) -> list[Histogram]:
    """The engine's end-to-end latency histograms in the replica's registry, as the real engines
    label them (vLLM's always, SGLang's with the `sglang` personality): each request answered in
    full is observed in every one."""
    out = [Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", list(VLLM_LABELS),
                     buckets=VLLM_LATENCY_BUCKETS, registry=registry).labels(model_name, "0")]
    if personality == "sglang":
        out.append(Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                             list(SGLANG_TOKENIZER_LABELS), buckets=SGLANG_LATENCY_BUCKETS, registry=registry).labels(model_name, "unified"))
    return out


@dataclass(frozen=True)
class Snapshot:
    """The replica's numbers at one scrape (tracing/emulation/endpoints.py `Emulator.snapshot`)."""

    model_name: str
    personality: str
    running: int
    waiting: int
    kv_usage: float
    preemptions: int
    prompt_tokens: int
    generation_tokens: int
    cached_tokens: int
    finished: Mapping[str, int]  # requests answered in full, by finish reason
    iterations: int
    busy_s: float
    aborted_sequences: int
    lag_s_max: float
    lag_s_mean: float
    speedup: float

    @property
    def requests(self) -> int:
        return sum(self.finished.values())


class EmulatorCollector(Collector):
    """The metric families of one emulated replica, read at scrape time."""

    def __init__(self, read: Callable[[], Snapshot]):
        self.read = read

    def collect(self) -> Iterator[Metric]:
        now = self.read()
        vllm = [now.model_name, "0"]

        def gauge(metric: str, text: str, value: float, labels: tuple[str, ...] = VLLM_LABELS, values: list[str] = vllm) -> Metric:
            family = GaugeMetricFamily(metric, text, labels=list(labels))
            family.add_metric(values, float(value))
            return family

        def counter(metric: str, text: str, value: float, labels: tuple[str, ...] = VLLM_LABELS, values: list[str] = vllm) -> Metric:
            family = CounterMetricFamily(metric, text, labels=list(labels))
            family.add_metric(values, float(value))
            return family

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", now.running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", now.waiting)
        yield gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead.", now.kv_usage)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", now.kv_usage)
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", now.preemptions)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", now.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", now.generation_tokens)
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", now.cached_tokens)
        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=[*VLLM_LABELS, "finished_reason"])
        for reason in VLLM_FINISH_REASONS:
            success.add_metric([*vllm, reason], float(now.finished.get(reason, 0)))
        yield success
        if now.personality == "sglang":
            scheduler = [now.model_name, "unified", "0", "0"]
            yield gauge("sglang:num_running_reqs", "The number of running requests.", now.running, SGLANG_SCHEDULER_LABELS, scheduler)
            yield gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", now.waiting, SGLANG_SCHEDULER_LABELS, scheduler)
            yield gauge("sglang:token_usage", "The token usage.", now.kv_usage, SGLANG_SCHEDULER_LABELS, scheduler)
            yield counter("sglang:num_requests", "Number of requests processed.", now.requests,
                          SGLANG_TOKENIZER_LABELS, [now.model_name, "unified"])
        yield counter("scepsy_emulator_iterations", "Engine iterations run.", now.iterations)
        yield counter("scepsy_emulator_busy_seconds", "Modelled seconds spent in iterations.", now.busy_s)
        yield counter("scepsy_emulator_aborted_sequences", "Sequences dropped because their client left.", now.aborted_sequences)
        yield gauge("scepsy_emulator_lag_seconds_max", "Largest wall-clock lateness of an iteration end.", now.lag_s_max)
        yield gauge("scepsy_emulator_lag_seconds_mean", "Mean wall-clock lateness of iteration ends.", now.lag_s_mean)
        yield gauge("scepsy_emulator_speedup", "Modelled seconds per wall-clock second.", now.speedup)


def registry(read: Callable[[], Snapshot]) -> CollectorRegistry:
    """A registry of one replica alone (not the process-wide default: several emulators may share
    a process, as in the tests)."""
    out = CollectorRegistry(auto_describe=False)
    out.register(EmulatorCollector(read))
    return out


def exposition(registry: CollectorRegistry) -> bytes:
    """The Prometheus text exposition (format 0.0.4) of the registry."""
    return generate_latest(registry)
