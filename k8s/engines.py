"""Facts about the serving engines that the manifests, the gateways and the controller share:
pinned images, ports and the Prometheus metrics each engine exposes on `GET /metrics`.

Metric names, read from the pinned releases' sources:
- vLLM v0.11.0 (`vllm/v1/metrics/loggers.py`): the gauges `vllm:num_requests_running`,
  `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (0..1), the counter
  `vllm:request_success_total` (label `finished_reason`) and the histogram
  `vllm:e2e_request_latency_seconds` (`PrometheusStatLogger`: labels `model_name`, `engine`;
  observed once per finished request, `record()` with each `finished_request.e2e_latency`, the
  request's arrival to its last token, in seconds); always exposed.
- SGLang v0.5.9 (`sglang/srt/metrics/collector.py`): the gauges `sglang:num_running_reqs`,
  `sglang:num_queue_reqs`, `sglang:token_usage` (0..1, the KV pool in use), the counter
  `sglang:num_requests_total` and the histogram `sglang:e2e_request_latency_seconds`
  (`TokenizerMetricsCollector`, with the counter's labels `model_name`, `engine_type`; observed
  once per finished request, `observe_one_finished_request(..., e2e_latency, ...)`, in seconds);
  exposed only when the server runs with `--enable-metrics`
  (`sglang/srt/entrypoints/http_server.py` adds the route and middleware only then), which every
  emitted SGLang engine has: the drain hook and the controller read them.
The two latency histograms were read in vLLM's and SGLang's sources at revisions other than
the pinned tags (the files and classes named above) and in SGLang's docs, "Production Metrics"
(docs.sglang.io/references/production_metrics.html), which shows
`sglang:e2e_request_latency_seconds` with `_sum`, `_count`, `_bucket` per `model_name`.
"""

from __future__ import annotations

from dataclasses import dataclass

# How each engine serves its waiting requests (what the workflow simulator's `scheduling` models,
# models/performance/replica.py). `priority`: lower `priority` values first, so that the workflow
# entry's tag (each call's workflow request start, `scepsy proxy --workflow-priority`) serves older
# workflow requests first. vLLM: `--scheduling-policy priority` (vllm/config/scheduler.py
# `SchedulerConfig.policy`; the v1 scheduler's PriorityRequestQueue). SGLang:
# `--enable-priority-scheduling` orders by priority, higher values first unless
# `--schedule-low-priority-values-first` (python/sglang/srt/server_args.py). `fcfs` is each engine's
# default. Only LLMs that generate get it: the entry tags chat and completions calls.
# SGLang also lets a waiting request preempt a running one whose priority is worse by more than
# `--priority-scheduling-preemption-threshold` (default 10; python/sglang/srt/managers/
# schedule_policy.py `PrefillAdder.preempt_to_schedule`). The entry's tags are seconds, so the
# default would let every workflow 10 s older preempt, and recompute, the calls in the batch after
# a burst, where vLLM never preempts for a waiting request: the threshold is set to 2^31 - 1, more
# than any two whole-second epoch tags differ, so that tagged calls never preempt each other.
SGLANG_PREEMPTION_THRESHOLD = 2**31 - 1
SCHEDULING_POLICIES = ("priority", "fcfs")
SCHEDULING_ARGS = {
    "vllm": {"priority": ("--scheduling-policy", "priority"), "fcfs": ()},
    "sglang": {"priority": ("--enable-priority-scheduling", "--schedule-low-priority-values-first",
                            "--priority-scheduling-preemption-threshold", str(SGLANG_PREEMPTION_THRESHOLD)), "fcfs": ()},
}

ENGINES = ("vllm", "sglang")
# Pinned releases (tags checked on Docker Hub through public references; see docs/deploy.md)
DEFAULT_IMAGES = {"vllm": "vllm/vllm-openai:v0.11.0", "sglang": "lmsysorg/sglang:v0.5.9"}
ENGINE_PORTS = {"vllm": 8000, "sglang": 30000}


@dataclass(frozen=True)
class EngineMetrics:
    """The engine's metric for each quantity the controller and the drain hook read."""

    running: str  # gauge: requests in the running batch
    waiting: str  # gauge: requests queued for the batch
    kv_cache_usage: str  # gauge, 0..1: share of the KV cache in use
    requests_finished: str  # counter: requests finished
    request_latency: str  # histogram (`_sum`, `_count`, `_bucket`), seconds: each finished request's end-to-end latency


METRICS = {
    "vllm": EngineMetrics("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:request_success_total",
                          "vllm:e2e_request_latency_seconds"),
    "sglang": EngineMetrics("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:num_requests_total",
                            "sglang:e2e_request_latency_seconds"),
}
