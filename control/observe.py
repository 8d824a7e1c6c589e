"""One period's observation for the policy: the engines' metrics (through Prometheus) and the
replicas' readiness (through Kubernetes) as the policy's `Observation`.

Per LLM: the request rate is the rate of finished requests (vLLM `vllm:request_success_total`,
SGLang `sglang:num_requests_total`) summed over its replicas, or None where Prometheus could not
give it (unreachable, slow, no series, NaN, stale: control/prometheus.py), never 0 in its place;
queued requests per ready replica, the requests waiting per LLM (the backlog the policy drains)
and KV-cache usage where known; `llm_rates_rps` is None
as a whole when Prometheus itself did not answer. `llm_latency_s`: the mean latency of the calls
the LLM's engines finished in the window (their end-to-end latency histograms, vLLM
`vllm:e2e_request_latency_seconds`, SGLang `sglang:e2e_request_latency_seconds`); an LLM whose
latency is missing (no call finished in the window, NaN, stale, unanswered) is left out, so the
policy does not update its correction of that LLM's model, and it is None where no LLM has one.
Ready and starting replicas come from the cluster (control/act.py `read_cluster`): a replica
counts as capacity only once its pod is Ready, and a draining one not at all.

Per workflow, where the workflow entry's metrics are scraped (tracing/capture/entry_metrics.py):
the rate of workflow requests arriving at the entry, which a backlog does not hide (completions
understate demand while requests wait), and the mean latency of those that finished in the
window. A workflow rate is None where Prometheus could not give it, like an LLM's; where none
has a series (no entry, or not scraped) `workflow_rates_rps` is None as a whole and the policy
works from the per-LLM completions. A latency is None where no workflow request finished in the
window (the policy reads that as a missed SLO); `workflow_latency_s` is None as a whole where the
latencies could not be read at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from scepsy.control.act import ClusterState
from scepsy.control.policy import Observation
from scepsy.control.prometheus import LlmSamples, Missing, WorkflowSamples

UNANSWERED = ("unreachable", "timeout", "error")  # Prometheus itself gave nothing
NOTHING_FINISHED = ("nan", "no series")  # 0/0 in the window, or no workflow request finished since the entry started


def _value(value: float | Missing) -> float | None:
    return None if isinstance(value, Missing) else value


def _unanswered(value: float | Missing) -> bool:
    return isinstance(value, Missing) and value.reason in UNANSWERED


def workflow_inputs(workflows: WorkflowSamples | None) -> tuple[dict[str, float | None] | None, dict[str, float | None] | None]:
    """The observation's `workflow_rates_rps` and `workflow_latency_s` (module docstring)."""
    if workflows is None or workflows.absent:
        return None, None
    rates = {w: _value(v) for w, v in workflows.rates_rps.items()}
    unknown = any(isinstance(v, Missing) and v.reason not in NOTHING_FINISHED for v in workflows.latency_s.values())
    latency = None if unknown else {w: _value(v) for w, v in workflows.latency_s.items()}
    return rates, latency


def observation(time_s: float, llms: Sequence[str], samples: LlmSamples, cluster: ClusterState,
                workflows: WorkflowSamples | None = None) -> Observation:
    """The policy's input for one period at `time_s` (the controller's clock)."""
    workflow_rates, workflow_latency = workflow_inputs(workflows)
    ready = {llm: cluster.ready(llm) for llm in llms}
    rates = {llm: _value(samples.rates_rps[llm]) for llm in llms}
    down = all(_unanswered(samples.rates_rps[llm]) for llm in llms)
    queue = {llm: w / ready[llm] for llm in llms if (w := _value(samples.waiting[llm])) is not None and ready[llm] > 0}
    kv = {llm: v for llm in llms if (v := _value(samples.kv_usage[llm])) is not None}
    latency = {llm: mean for llm in llms if isinstance(mean := samples.latency_s.get(llm), float)}  # a Missing one left out
    return Observation(
        time_s=time_s,
        llm_rates_rps=None if down and llms else rates,
        ready_replicas=ready,
        starting_replicas={llm: cluster.starting(llm) for llm in llms},
        queue_per_replica=queue or None,
        kv_usage=kv or None,
        waiting_requests={llm: w for llm in llms if (w := _value(samples.waiting[llm])) is not None} or None,
        workflow_rates_rps=workflow_rates,
        workflow_latency_s=workflow_latency,
        llm_latency_s=latency or None,
    )


def missing_llms(samples: LlmSamples) -> dict[str, str]:
    """LLM -> why its rate is missing (for stderr and the decision log)."""
    return {llm: value.text() for llm, value in sorted(samples.rates_rps.items()) if isinstance(value, Missing)}


def missing_workflows(workflows: WorkflowSamples) -> dict[str, str]:
    """Workflow -> why its entry rate is missing (for stderr and the decision log)."""
    return {w: value.text() for w, value in sorted(workflows.rates_rps.items()) if isinstance(value, Missing)}
