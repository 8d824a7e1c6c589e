"""Objects an operator expects around the serving pods: PriorityClass, PodDisruptionBudgets and
(with `--prometheus`) prometheus-operator PodMonitors.

- PriorityClass `scepsy-serving` (value 100000, not the global default, preempts lower priorities):
  every engine and gateway pod names it, so that under pressure batch work is evicted first.
- PodDisruptionBudget `<llm>` with `maxUnavailable: 1` over the engine pods of every LLM with more
  than one replica: a node drain takes one replica of it at a time. A single-replica LLM gets none
  (a budget that allows no disruption would block every drain); neither do the gateways (one pod).
- PodMonitor `<llm>-engines` (port `http`, path `/metrics`: vLLM's and SGLang's Prometheus
  endpoints) and `<llm>-gateway` (port `metrics`, the gateway's `--prometheus-port`), schema of
  prometheus-operator's monitoring.coreos.com/v1 PodMonitor (`spec.selector`,
  `spec.podMetricsEndpoints[].{port, path, interval}`); with the workflow entry, PodMonitor
  `scepsy-entry` (port `http`, path `/metrics`: the entry's workflow requests, what `scepsy control`
  reads as demand).
"""

from __future__ import annotations

from scepsy.k8s import entry, names
from scepsy.k8s.plan_input import PlacedPlan

PRIORITY_CLASS = "scepsy-serving"
PRIORITY_VALUE = 100000  # far below system-cluster-critical (2e9), above the default 0
SCRAPE_INTERVAL = "15s"


def priority_class() -> dict:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": PRIORITY_CLASS, "labels": names.labels("scepsy", PRIORITY_CLASS, "priority")},
        "value": PRIORITY_VALUE,
        "globalDefault": False,
        "preemptionPolicy": "PreemptLowerPriority",
        "description": "LLM engines and gateways of a scepsy plan",
    }


def disruption_budgets(plan: PlacedPlan, namespace: str, engine: str) -> list[dict]:
    budgets = []
    for llm in sorted(plan.llms, key=lambda m: m.name):
        if llm.replicas < 2:
            continue
        name = names.llm_service(llm.name)
        labels = names.labels(engine, name, "engine", llm=llm.name)
        selector = {names.LLM_LABEL: labels[names.LLM_LABEL], "app.kubernetes.io/component": "engine"}
        budgets.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": name, "namespace": namespace, "labels": labels},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
            }
        )
    return budgets


def _pod_monitor(name: str, namespace: str, labels: dict[str, str], selector: dict[str, str], port: str) -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": selector},
            "podMetricsEndpoints": [{"port": port, "path": "/metrics", "interval": SCRAPE_INTERVAL}],
        },
    }


def pod_monitors(plan: PlacedPlan, namespace: str, engine: str, gateways: set[str]) -> list[dict]:
    """One PodMonitor for each LLM's engines and one for its gateway (if it has one)."""
    monitors = []
    for llm in sorted(m.name for m in plan.llms):
        llm_value = names.label_value(llm)
        engines = f"{names.dns_label(llm)}-engines"
        monitors.append(
            _pod_monitor(engines, namespace, names.labels(engine, engines, "monitoring", llm=llm),
                         {names.LLM_LABEL: llm_value, "app.kubernetes.io/component": "engine"}, "http")
        )
        if llm in gateways:
            gateway = names.gateway(llm)
            monitors.append(
                _pod_monitor(gateway, namespace, names.labels("sgl-model-gateway", gateway, "monitoring", llm=llm),
                             {names.LLM_LABEL: llm_value, "app.kubernetes.io/component": "gateway"}, "metrics")
            )
    return monitors


def endpoint_picker_monitors(plan: PlacedPlan, namespace: str) -> list[dict]:
    """One PodMonitor per LLM's endpoint picker (`--router inference-gateway`): its port `metrics` (9090)."""
    monitors = []
    for llm in sorted(m.name for m in plan.llms):
        name = f"{names.dns_label(llm)}-epp"
        selector = {names.LLM_LABEL: names.label_value(llm), "app.kubernetes.io/component": "endpoint-picker"}
        monitors.append(_pod_monitor(name, namespace, names.labels("gateway-api-inference-extension", name, "monitoring", llm=llm), selector, "metrics"))
    return monitors


def entry_monitor(namespace: str) -> dict:
    """The workflow entry's PodMonitor (`--entry-image`): its port `http` serves /metrics too."""
    return _pod_monitor(entry.NAME, namespace, names.labels(entry.NAME, entry.NAME, "monitoring"), dict(entry.SELECTOR), "http")
