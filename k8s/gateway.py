"""The SGLang model gateway in front of each LLM: one gateway per LLM, workers listed by URL.

Design (why, in docs/deploy.md, "Routing"): every LLM gets its own gateway Deployment
`<llm>-gateway` in the gateway's regular (single-model) mode, started with `--worker-urls` listing
one URL per replica of that LLM and nothing else:

    python3 -m sglang_router.launch_router --host 0.0.0.0 --port 30000 --policy P
        --worker-urls http://<llm>-r0.<ns>.svc:<engine port> ... http://<llm>-r<n-1>.<ns>.svc:<port>
        --worker-startup-timeout-secs 1800 --shutdown-grace-period-secs 180
        --prometheus-host 0.0.0.0 --prometheus-port 29000

Each replica has its own ClusterIP Service `<llm>-r<k>` (a stable DNS name for a pod that the plan
fixes), so the gateway sees every replica and its policy (cache_aware for decoders, whose prompts
share prefixes; round_robin for encoders, which keep no KV cache) balances over exactly the LLM's
replicas. No request can reach another LLM's replica: the gateway knows no other worker. Clients
call the LLM's Service `<llm>:30000`, which selects the gateway's pod.

One exception, found by running the gateway: its rerank endpoints parse the worker's answer as
SGLang's rerank list, which vLLM's `/v1/rerank` (`{"results": [...]}`) is not, and they forward the
model as "unknown", which vLLM rejects. So a vLLM reranker gets no gateway: its Service `<llm>`
selects its engine pods directly (kube-proxy spreads requests; rerankers keep no cache to route
for).

The image is the gateway release whose PyPI wheel (`sglang-router`) the tests run: the image's
Dockerfile (sgl-project/sglang docker/gateway.Dockerfile) installs that wheel and has the same
entry point.
"""

from __future__ import annotations

from scepsy.models.catalog.catalog import serving_task

from . import names
from .plan_input import PlacedPlan
from .sizing import gateway_resources

GATEWAY_VERSION = "0.3.2"  # sglang-router on PyPI == lmsysorg/sgl-model-gateway tag (pyproject test extra)
GATEWAY_IMAGE = f"lmsysorg/sgl-model-gateway:v{GATEWAY_VERSION}"
GATEWAY_COMMAND = ("python3", "-m", "sglang_router.launch_router")  # the image's ENTRYPOINT
GATEWAY_PORT = 30000
GATEWAY_METRICS_PORT = 29000
GATEWAY_DRAIN_S = 180  # --shutdown-grace-period-secs: in-flight requests finish before exit
WORKER_STARTUP_TIMEOUT_S = 1800  # as long as the engines' startup probe allows (30 min)
# terminationGracePeriodSeconds of gateway and engine pods: longer than the gateway's drain, so
# that neither the gateway nor the engines it drains to are killed mid-request
TERMINATION_GRACE_S = GATEWAY_DRAIN_S + 30


def policy(model: str) -> str:
    """cache_aware for decoders (shared prompt prefixes hit one replica's KV cache), round_robin
    for encoders (no cache to route for)."""
    return "cache_aware" if serving_task(model) == "generate" else "round_robin"


def has_gateway(engine: str, model: str) -> bool:
    """Every LLM gets a gateway except a vLLM reranker (see the module docstring)."""
    return not (engine == "vllm" and serving_task(model) == "score")


def worker_urls(plan: PlacedPlan, llm: str, namespace: str, engine_port: int) -> list[str]:
    count = plan.llm(llm).replicas
    return [f"http://{names.replica_service(llm, k)}.{namespace}.svc:{engine_port}" for k in range(count)]


def gateway_args(plan: PlacedPlan, llm: str, namespace: str, engine_port: int) -> list[str]:
    args = ["--host", "0.0.0.0", "--port", str(GATEWAY_PORT), "--policy", policy(plan.llm(llm).model)]
    args += ["--worker-urls", *worker_urls(plan, llm, namespace, engine_port)]
    args += ["--worker-startup-timeout-secs", str(WORKER_STARTUP_TIMEOUT_S), "--shutdown-grace-period-secs", str(GATEWAY_DRAIN_S)]
    args += ["--prometheus-host", "0.0.0.0", "--prometheus-port", str(GATEWAY_METRICS_PORT)]
    return args


def gateway_labels(plan: PlacedPlan, llm: str) -> dict[str, str]:
    out = names.labels("sgl-model-gateway", names.gateway(llm), "gateway", llm=llm)
    for workflow in plan.workflows_of(llm):
        out[names.workflow_member_label(workflow)] = "true"
    return out


def gateway_deployment(plan: PlacedPlan, llm: str, namespace: str, engine_port: int, image: str, priority_class: str) -> dict:
    name = names.gateway(llm)
    labels = gateway_labels(plan, llm)
    selector = {names.LLM_LABEL: labels[names.LLM_LABEL], "app.kubernetes.io/component": "gateway"}
    requests, limits = gateway_resources(plan.llm(llm).replicas)
    container = {
        "name": "gateway",
        "image": image,
        "command": list(GATEWAY_COMMAND),
        "args": gateway_args(plan, llm, namespace, engine_port),
        "ports": [
            {"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": GATEWAY_METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": {"requests": requests, "limits": limits},
        # ready once at least one worker is healthy (the gateway's /readiness); alive while it answers
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}, "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/liveness", "port": "http"}, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
    }
    pod_spec = {
        "enableServiceLinks": False,
        "priorityClassName": priority_class,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "containers": [container],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def _service(name: str, namespace: str, labels: dict[str, str], selector: dict[str, str], port: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def replica_service(llm: str, replica: int, namespace: str, engine: str, engine_port: int) -> dict:
    """One replica's pod behind a stable name: the gateway's worker URL."""
    name = names.replica_service(llm, replica)
    labels = names.labels(engine, name, "engine", llm=llm, replica=replica)
    selector = {names.LLM_LABEL: labels[names.LLM_LABEL], names.REPLICA_LABEL: labels[names.REPLICA_LABEL], "app.kubernetes.io/component": "engine"}
    return _service(name, namespace, labels, selector, engine_port)


def entry_service(plan: PlacedPlan, llm: str, namespace: str, engine: str) -> dict:
    """The Service clients call (`<llm>:30000`): the LLM's gateway, or its engines where it has none."""
    component = "gateway" if has_gateway(engine, plan.llm(llm).model) else "engine"
    labels = names.labels(engine if component == "engine" else "sgl-model-gateway", names.llm_service(llm), component, llm=llm)
    for workflow in plan.workflows_of(llm):
        labels[names.workflow_member_label(workflow)] = "true"
    selector = {names.LLM_LABEL: labels[names.LLM_LABEL], "app.kubernetes.io/component": component}
    return _service(names.llm_service(llm), namespace, labels, selector, GATEWAY_PORT)
