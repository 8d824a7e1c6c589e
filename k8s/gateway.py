"""The SGLang model gateway in front of each LLM, and how a replica joins and leaves it.

Design (why, in docs/deploy.md, "Routing" and "Scaling and draining"): every LLM gets its own
gateway Deployment `<llm>-gateway` in the gateway's regular (single-model) mode, which finds the
LLM's replicas itself through Kubernetes service discovery instead of a fixed worker list:

    python3 -m sglang_router.launch_router --host 0.0.0.0 --port 30000 --policy P [--max-tree-size N]
        --service-discovery --selector scepsy.io/llm=<llm> app.kubernetes.io/component=engine
        --service-discovery-namespace <ns> --service-discovery-port <engine port>
        --health-check-interval-secs 10 --shutdown-grace-period-secs 180
        --prometheus-host 0.0.0.0 --prometheus-port 29000

The gateway (sglang-router 0.3.2, `src/service_discovery.rs` of its PyPI sdist) lists and watches
the pods of its namespace and registers a pod whose labels match the selector once it is Running
and Ready, at `http://<pod IP>:<port>`, whenever that happens: a replica that becomes ready hours
after the gateway started (Pending for GPUs, a slow pull, a crash loop fixed later) joins like
one that was there first. It deregisters a pod as soon as the pod carries a deletionTimestamp
(`kubectl delete`, a Deployment deleted or scaled down, a node drain), before the pod's
containers are stopped, and requests it already sent finish. The engine's preStop hook
(`DRAIN_SCRIPT`) then waits until the engine has no request running or queued, so a removed
replica ends only after its last request. A gateway started with `--worker-urls` instead gives up
on a worker that is not healthy within `--worker-startup-timeout-secs`, and its list can only
change by restarting it with new arguments.

The gateway needs to read pods: one ServiceAccount `scepsy-gateway` per namespace with a Role
(get, list, watch on pods) and a RoleBinding, shared by the namespace's gateways (each watches the
whole namespace and filters by its selector). The policy is cache_aware for decoders, whose
prompts share prefixes, and round_robin for encoders, which keep no KV cache. No request can reach
another LLM's replica: a gateway registers only pods with its LLM's label. Clients call the LLM's
Service `<llm>:30000`, which selects the gateway's pod.

One exception, found by running the gateway: its rerank endpoints parse the worker's answer as
SGLang's rerank list, which vLLM's `/v1/rerank` (`{"results": [...]}`) is not, and they forward the
model as "unknown", which vLLM rejects. So a vLLM reranker gets no gateway: its Service `<llm>`
selects its engine pods directly (kube-proxy spreads requests over the ready ones; rerankers keep
no cache to route for), and the same preStop hook drains its pods.

Nothing in a gateway's objects depends on the plan's replicas: its arguments, labels, Service and
RBAC do not, and its pod is sized, and its cache-aware tree bounded (`--max-tree-size`), from the
most replicas the cluster could hold (sizing.py). So applying a re-plan never rewrites a gateway
Deployment, and never restarts a gateway.

The image is the gateway release whose PyPI wheel (`sglang-router`) the tests run: the image's
Dockerfile (sgl-project/sglang docker/gateway.Dockerfile) installs that wheel and has the same
entry point.
"""

from __future__ import annotations

from dataclasses import dataclass

from scepsy.models.catalog.catalog import serving_task

from scepsy.k8s import names
from scepsy.k8s.engines import ENGINE_PORTS, METRICS
from scepsy.k8s.plan_input import PlacedPlan
from scepsy.k8s.sizing import gateway_resources, most_replicas, tree_chars_per_worker
from scepsy.k8s.workloads import single_pod_deployment

GATEWAY_VERSION = "0.3.2"  # sglang-router on PyPI == lmsysorg/sgl-model-gateway tag (pyproject test extra)
GATEWAY_IMAGE = f"lmsysorg/sgl-model-gateway:v{GATEWAY_VERSION}"
GATEWAY_COMMAND = ("python3", "-m", "sglang_router.launch_router")  # the image's ENTRYPOINT
GATEWAY_PORT = 30000
GATEWAY_METRICS_PORT = 29000
GATEWAY_DRAIN_S = 180  # --shutdown-grace-period-secs: the gateway's own in-flight requests finish before it exits
# gateway pods: longer than the gateway's own drain
GATEWAY_TERMINATION_GRACE_S = GATEWAY_DRAIN_S + 30
# the gateway probes each registered worker's /health this often (default 60 s): a replica that died
# without being deleted is marked unhealthy (3 failures) and a restarted one healthy again (2 successes)
# within half a minute
HEALTH_CHECK_INTERVAL_S = 10
GATEWAY_ACCOUNT = "scepsy-gateway"  # ServiceAccount, Role and RoleBinding of the namespace's gateways

# Draining a replica (the engine pod's preStop hook): wait SETTLE_S for every gateway's watch (and
# kube-proxy, for a vLLM reranker's Service) to drop the terminating pod, then until the engine has
# no request running or waiting, at most DRAIN_LIMIT_S; the kubelet stops the engine only after the
# hook returns. The grace period bounds it all (the kubelet kills the pod when it runs out).
SETTLE_S = 10
DRAIN_LIMIT_S = 600
ENGINE_TERMINATION_GRACE_S = SETTLE_S + DRAIN_LIMIT_S + 30
DRAIN_SCRIPT = """\
import sys, time, urllib.request
url, names, settle, limit = sys.argv[1], set(sys.argv[2].split(",")), float(sys.argv[3]), float(sys.argv[4])
time.sleep(settle)
deadline = time.monotonic() + limit
while time.monotonic() < deadline:
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except Exception:
        break
    busy = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.partition("{")[0].partition(" ")[0] in names)
    if busy == 0:
        break
    time.sleep(1)
"""


def policy(model: str) -> str:
    """cache_aware for decoders (shared prompt prefixes hit one replica's KV cache), round_robin
    for encoders (no cache to route for)."""
    return "cache_aware" if serving_task(model) == "generate" else "round_robin"


def has_gateway(engine: str, model: str) -> bool:
    """Every LLM gets a gateway except a vLLM reranker (see the module docstring)."""
    return not (engine == "vllm" and serving_task(model) == "score")


def replica_selector(llm: str) -> dict[str, str]:
    """The pod labels an LLM's gateway (and its PodDisruptionBudget) selects its replicas by."""
    return {names.LLM_LABEL: names.label_value(llm), "app.kubernetes.io/component": "engine"}


def pre_stop_command(engine: str) -> list[str]:
    """The engine container's preStop exec command: returns once the engine is idle (DRAIN_SCRIPT)."""
    metrics = METRICS[engine]
    url = f"http://127.0.0.1:{ENGINE_PORTS[engine]}/metrics"
    return ["python3", "-c", DRAIN_SCRIPT, url, f"{metrics.running},{metrics.waiting}", str(SETTLE_S), str(DRAIN_LIMIT_S)]


@dataclass(frozen=True)
class Membership:
    """How a replica of an LLM joins and leaves that LLM's gateway (docs/deploy.md, "Scaling and
    draining"). A pod joins when it runs in `namespace` with `labels` and is Ready (its readiness
    probe, `GET /health`, passes); it is sent requests at `http://<pod IP>:<port>`. It leaves when it
    is deleted: the gateway drops it at once, and `pre_stop` (the engine container's preStop exec
    command) returns only once the engine has finished its requests, within
    `termination_grace_s`."""

    namespace: str
    labels: dict[str, str]
    port: int
    pre_stop: tuple[str, ...]
    termination_grace_s: int


def membership(llm: str, engine: str, namespace: str) -> Membership:
    return Membership(namespace, replica_selector(llm), ENGINE_PORTS[engine], tuple(pre_stop_command(engine)), ENGINE_TERMINATION_GRACE_S)


def gateway_args(plan: PlacedPlan, llm: str, namespace: str, engine: str) -> list[str]:
    """The gateway's arguments: the same for every plan of the instance (nothing here depends on the
    plan's replicas), so a re-plan never changes them."""
    routing = policy(plan.llm(llm).model)
    args = ["--host", "0.0.0.0", "--port", str(GATEWAY_PORT), "--policy", routing]
    if routing == "cache_aware":
        # the tree's characters per worker, from the most replicas the cluster could hold (sizing.py)
        args += ["--max-tree-size", str(tree_chars_per_worker(most_replicas(plan.instance, llm)))]
    selector = [f"{key}={value}" for key, value in replica_selector(llm).items()]
    args += ["--service-discovery", "--selector", *selector]
    args += ["--service-discovery-namespace", namespace, "--service-discovery-port", str(ENGINE_PORTS[engine])]
    args += ["--health-check-interval-secs", str(HEALTH_CHECK_INTERVAL_S), "--shutdown-grace-period-secs", str(GATEWAY_DRAIN_S)]
    args += ["--prometheus-host", "0.0.0.0", "--prometheus-port", str(GATEWAY_METRICS_PORT)]
    return args


def gateway_rbac(namespace: str) -> list[dict]:
    """The ServiceAccount the namespace's gateways run as, allowed to get, list and watch pods."""
    labels = names.labels("sgl-model-gateway", GATEWAY_ACCOUNT, "gateway")
    metadata = {"name": GATEWAY_ACCOUNT, "namespace": namespace, "labels": labels}
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata,
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata,
        "subjects": [{"kind": "ServiceAccount", "name": GATEWAY_ACCOUNT, "namespace": namespace}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": GATEWAY_ACCOUNT},
    }
    return [account, role, binding]


def gateway_labels(plan: PlacedPlan, llm: str) -> dict[str, str]:
    out = names.labels("sgl-model-gateway", names.gateway(llm), "gateway", llm=llm)
    for workflow in plan.workflows_of(llm):
        out[names.workflow_member_label(workflow)] = "true"
    return out


def gateway_deployment(plan: PlacedPlan, llm: str, namespace: str, engine: str, image: str, priority_class: str) -> dict:
    name = names.gateway(llm)
    labels = gateway_labels(plan, llm)
    selector = {names.LLM_LABEL: labels[names.LLM_LABEL], "app.kubernetes.io/component": "gateway"}
    requests, limits = gateway_resources(policy(plan.llm(llm).model) == "cache_aware")
    container = {
        "name": "gateway",
        "image": image,
        "command": list(GATEWAY_COMMAND),
        "args": gateway_args(plan, llm, namespace, engine),
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
        "serviceAccountName": GATEWAY_ACCOUNT,
        "priorityClassName": priority_class,
        "terminationGracePeriodSeconds": GATEWAY_TERMINATION_GRACE_S,
        "containers": [container],
    }
    return single_pod_deployment(name, namespace, labels, selector, pod_spec)


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


def entry_service(plan: PlacedPlan, llm: str, namespace: str, engine: str) -> dict:
    """The Service clients call (`<llm>:30000`): the LLM's gateway, or its engines where it has none."""
    component = "gateway" if has_gateway(engine, plan.llm(llm).model) else "engine"
    labels = names.labels(engine if component == "engine" else "sgl-model-gateway", names.llm_service(llm), component, llm=llm)
    for workflow in plan.workflows_of(llm):
        labels[names.workflow_member_label(workflow)] = "true"
    selector = {names.LLM_LABEL: labels[names.LLM_LABEL], "app.kubernetes.io/component": component}
    return _service(names.llm_service(llm), namespace, labels, selector, GATEWAY_PORT)
