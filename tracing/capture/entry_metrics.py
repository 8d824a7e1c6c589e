"""The workflow entry's Prometheus metrics: `GET /metrics` of `scepsy proxy` (the entry of a
deployment, k8s/entry.py), what `scepsy control` reads as the demand of each workflow.

The entry sees LLM calls, not workflow requests. A workflow request is the calls that carry one
workflow request id (`X-Workflow-Id`, else the trace id of a W3C `traceparent`:
proxy.workflow_request_id); its workflow is the `X-Workflow-Name` of its first call. Calls without
a workflow request id count in neither metric (one call is not a workflow request).

- `scepsy_entry_requests_total{workflow}` (counter): workflow requests that arrived, counted at
  their first call's arrival, before the entry holds it (`--max-in-flight`) and also when that
  call is answered 429: demand, which completions understate while a backlog waits.
- `scepsy_entry_request_duration_seconds{workflow}` (histogram): of finished workflow requests,
  the first call's arrival to the end of the last call. The entry cannot see the application end
  a workflow request, so one counts as finished once none of its calls has been in flight for
  `done_s` (default WORKFLOW_DONE_S: longer than the usual tool call between two LLM calls);
  it is observed then, `done_s` after its end. A later call with the same id (while the id is
  remembered: proxy.MAX_TRACKED_WORKFLOWS) is neither a new arrival nor a second duration.

Label values are bounded: past MAX_WORKFLOW_LABELS distinct workflow names, further names count
under OTHER_WORKFLOW, so that a client cannot grow the entry's memory or Prometheus' series
without end; a first call without `X-Workflow-Name` counts under the empty name (no label).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

WORKFLOW_DONE_S = 30.0
MAX_WORKFLOW_LABELS = 100
OTHER_WORKFLOW = "(other)"
# workflow latencies run from about a second (one short call) to many minutes (deep agent loops)
DURATION_BUCKETS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0)
REQUESTS_METRIC = "scepsy_entry_requests_total"
DURATION_METRIC = "scepsy_entry_request_duration_seconds"


@dataclass
class _Open:
    """A workflow request not yet finished."""

    workflow: str  # its label value
    start_s: float
    in_flight: int = 0
    last_end_s: float = 0.0


class EntryMetrics:
    """The two metrics of the module docstring, in a registry of their own (a process may run
    several proxies: tests, benchmarks). Not thread-safe: the proxy calls it from its event loop."""

    def __init__(self, limit: int, done_s: float = WORKFLOW_DONE_S):
        self.done_s = done_s
        self.limit = limit  # open workflow requests kept at most (the proxy's ids remembered)
        self.registry = CollectorRegistry(auto_describe=True)
        self.arrivals = Counter(REQUESTS_METRIC.removesuffix("_total"), "Workflow requests arrived at the entry (their first call)",
                                ["workflow"], registry=self.registry)
        self.durations = Histogram(DURATION_METRIC, "Finished workflow requests: first call's arrival to the last call's end",
                                   ["workflow"], buckets=DURATION_BUCKETS_S, registry=self.registry)
        self._open: dict[str, _Open] = {}
        self._idle: OrderedDict[str, None] = OrderedDict()  # open ids with no call in flight, oldest end first
        self._labels: set[str] = set()

    def _label(self, workflow: str | None) -> str:
        name = workflow or ""
        if name not in self._labels and len(self._labels) >= MAX_WORKFLOW_LABELS:
            return OTHER_WORKFLOW
        self._labels.add(name)
        return name

    def call_started(self, workflow_id: str | None, workflow: str | None, start_s: float, new: bool) -> None:
        """A traced call arrived (before any hold): of the workflow request that started at
        `start_s`, its first call where `new` (the proxy's WorkflowStarts did not know the id)."""
        if workflow_id is None:
            return
        if new:
            label = self._label(workflow)
            self.arrivals.labels(workflow=label).inc()
            self._open[workflow_id] = _Open(label, start_s)
        request = self._open.get(workflow_id)
        if request is None:
            return  # a call after its workflow request counted as finished
        request.in_flight += 1
        self._idle.pop(workflow_id, None)

    def call_ended(self, workflow_id: str | None, now_s: float) -> None:
        """A call that `call_started` saw ended (answered, failed or abandoned)."""
        if workflow_id is None or (request := self._open.get(workflow_id)) is None:
            return
        request.in_flight -= 1
        request.last_end_s = now_s
        if request.in_flight == 0:
            self._idle[workflow_id] = None
        self.sweep(now_s)

    def sweep(self, now_s: float) -> None:
        """Observe every workflow request idle for `done_s` (or the oldest idle ones, past `limit`)."""
        while self._idle:
            workflow_id = next(iter(self._idle))
            request = self._open[workflow_id]
            if request.last_end_s > now_s - self.done_s and len(self._open) <= self.limit:
                return
            del self._idle[workflow_id], self._open[workflow_id]
            self.durations.labels(workflow=request.workflow).observe(max(0.0, request.last_end_s - request.start_s))

    def exposition(self, now_s: float) -> tuple[bytes, str]:
        """The text format and its content type, with every finished workflow request observed."""
        self.sweep(now_s)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
