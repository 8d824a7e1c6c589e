"""The workflow entry (emitted by `scepsy manifests` unless `--no-entry`): `scepsy proxy` in front
of the LLMs' Services, the one address a workflow application calls. Its image is scepsy's own,
built from the repository's Dockerfile (DEFAULT_ENTRY_IMAGE, or `--entry-image`; docs/deploy.md).

- Deployment `scepsy-entry`: one replica of `scepsy proxy --workflow-priority --no-store
  --max-in-flight LLM=N ...` with one `--upstream LLM=http://LLM.NAMESPACE.svc:PORT` per LLM (the
  Service clients call, gateway.entry_service). It tags every chat and completions call with its
  workflow request's start (the engines' priority scheduling serves older workflow requests
  first) and holds each LLM's calls beyond its entry limit, letting them on oldest workflow
  request first: behind the SGLang model gateway, which drops `priority` from chat completions
  bodies, this is what keeps a burst from locking the engines (docs/deploy.md). N is the plan's
  `entry_limit` (models/performance/recovery.py). The hold counts per process: a second replica
  would let twice the calls through, so the entry runs one, rolled out with a surge of one.
- Service `scepsy-entry` on port 9000: clients send `/LLM/v1/...` or `/v1/...` with the body's
  `model` naming the LLM, with `X-Workflow-Id` (or a W3C `traceparent`) on every call of a
  workflow request, and `X-Workflow-Name` naming its workflow for the entry's metrics.
- its `/metrics` (port `http`): workflow requests arrived and the durations of finished ones, per
  workflow (tracing/capture/entry_metrics.py), scraped with `--prometheus` (PodMonitor
  `scepsy-entry`, operations.py) and read by `scepsy control` as each workflow's demand.
"""

from __future__ import annotations

from scepsy.k8s import names
from scepsy.k8s.gateway import GATEWAY_PORT
from scepsy.k8s.plan_input import PlacedPlan

NAME = "scepsy-entry"
# the image `docker build -t ghcr.io/scepsy/scepsy:0.1.0 .` makes from the repository's Dockerfile
# (its tag is the package's version; a test checks both)
DEFAULT_ENTRY_IMAGE = "ghcr.io/scepsy/scepsy:0.1.0"
PORT = 9000
SELECTOR = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": "entry"}  # its pods (Service, PodMonitor)


def entry_limits(plan: PlacedPlan) -> dict[str, int]:
    """The plan's entry limit per LLM (its prediction at the plan's rates)."""
    return {p.llm: p.entry_limit for p in plan.prediction.llms if p.entry_limit is not None}


def entry_args(plan: PlacedPlan, namespace: str) -> list[str]:
    args = ["proxy", "--host", "0.0.0.0", "--port", str(PORT), "--no-store", "--workflow-priority"]
    for llm in sorted(m.name for m in plan.llms):
        args += ["--upstream", f"{llm}=http://{names.llm_service(llm)}.{namespace}.svc:{GATEWAY_PORT}"]
    for llm, limit in sorted(entry_limits(plan).items()):
        args += ["--max-in-flight", f"{llm}={limit}"]
    return args


def entry_objects(plan: PlacedPlan, namespace: str, image: str) -> list[dict]:
    labels = names.labels(NAME, namespace, "entry")
    selector = dict(SELECTOR)
    probe = {"tcpSocket": {"port": "http"}, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3}
    container = {
        "name": "entry",
        "image": image,
        "command": ["scepsy"],
        "args": entry_args(plan, namespace),
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "readinessProbe": {**probe, "failureThreshold": 1},
        "livenessProbe": probe,
        # one event loop; the held calls are small (their bodies, bounded by the proxy's 10,000 per LLM)
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "namespace": namespace, "labels": labels},
        "spec": {"type": "ClusterIP", "selector": selector,
                 "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]},
    }
    return [deployment, service]
