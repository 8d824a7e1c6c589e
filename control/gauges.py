"""The controller's decisions as Prometheus gauges, for clusters that actuate through KEDA.

With `act` "gauges" the controller changes nothing itself: it serves `GET /metrics` (prometheus_client)
with

    scepsy_desired_replicas{llm}                   replicas of the LLM in the target plan
    scepsy_desired_replica{llm, deployment, node}  1 for each engine Deployment of the target plan,
                                                   0 for one that runs and should go
    scepsy_decisions_total{action}                 decisions by action (keep, replan, hold)
    scepsy_observation_missing{llm}                1 while the LLM's rate could not be read

Each engine Deployment is one replica (`<llm>-r<k>`, one pod, pinned to its planned GPUs), so a
KEDA ScaledObject per Deployment with `minReplicaCount: 0`, `maxReplicaCount: 1` and a
`prometheus` trigger on `scepsy_desired_replica{deployment="<llm>-r<k>"}` (threshold 1) starts and
stops exactly the replicas of the target plan. The Deployments of a new plan must exist (`scepsy
manifests` of it applied with `replicas: 0`) for KEDA to scale them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from scepsy.k8s import names
from scepsy.models.instance.allocation import Placement


class DesiredGauges:
    """The gauges of one controller (its own registry)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.replicas = Gauge("scepsy_desired_replicas", "Replicas of the LLM in the target plan.", ["llm"], registry=self.registry)
        self.replica = Gauge("scepsy_desired_replica", "1 for an engine Deployment of the target plan, 0 for one that should go.",
                             ["llm", "deployment", "node"], registry=self.registry)
        self.decisions = Counter("scepsy_decisions", "Controller decisions by action.", ["action"], registry=self.registry)
        self.missing = Gauge("scepsy_observation_missing", "1 while the LLM's request rate could not be read.", ["llm"],
                             registry=self.registry)

    def publish(self, target: Placement, running: Iterable[tuple[str, str, str]] = ()) -> None:
        """Set the gauges to the target placement; `running` (llm, deployment, node) of replicas
        that run now and are not in the target read 0."""
        counts: dict[str, int] = {}
        wanted = set()
        for r in target.replicas:
            counts[r.llm] = counts.get(r.llm, 0) + 1
            deployment = names.engine_deployment(r.llm, r.replica)
            wanted.add(deployment)
            self.replica.labels(r.llm, deployment, r.node).set(1)
        for llm, deployment, node in running:
            if deployment not in wanted:
                self.replica.labels(llm, deployment, node).set(0)
                counts.setdefault(llm, 0)
        for llm, count in counts.items():
            self.replicas.labels(llm).set(count)

    def observed(self, missing: Mapping[str, bool]) -> None:
        for llm, flag in missing.items():
            self.missing.labels(llm).set(1 if flag else 0)

    def decided(self, action: str) -> None:
        self.decisions.labels(action).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """Serve `/metrics` on `port` from a background thread (prometheus_client's server)."""
        from prometheus_client import start_http_server

        start_http_server(port, addr=host, registry=self.registry)
