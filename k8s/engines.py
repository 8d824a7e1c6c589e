"""Facts about the serving engines that the manifests, the gateways and the controller share:
pinned images, ports and the Prometheus metrics each engine exposes on `GET /metrics`.

Metric names, read from the pinned releases' sources:
- vLLM v0.11.0 (`vllm/v1/metrics/loggers.py`): the gauges `vllm:num_requests_running`,
  `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (0..1) and the counter
  `vllm:request_success_total` (label `finished_reason`); always exposed.
- SGLang v0.5.9 (`sglang/srt/metrics/collector.py`): the gauges `sglang:num_running_reqs`,
  `sglang:num_queue_reqs`, `sglang:token_usage` (0..1, the KV pool in use) and the counter
  `sglang:num_requests_total`; exposed only when the server runs with `--enable-metrics`
  (`sglang/srt/entrypoints/http_server.py` adds the route and middleware only then), which every
  emitted SGLang engine has: the drain hook and the controller read them.
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
SCHEDULING_POLICIES = ("priority", "fcfs")
SCHEDULING_ARGS = {
    "vllm": {"priority": ("--scheduling-policy", "priority"), "fcfs": ()},
    "sglang": {"priority": ("--enable-priority-scheduling", "--schedule-low-priority-values-first"), "fcfs": ()},
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


METRICS = {
    "vllm": EngineMetrics("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:request_success_total"),
    "sglang": EngineMetrics("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:num_requests_total"),
}
