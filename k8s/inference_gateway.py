"""Routing through the Kubernetes Gateway API Inference Extension (`--router inference-gateway`).

For platforms that route LLM traffic with an inference gateway (kgateway/agentgateway, Istio, GKE,
NGINX Gateway Fabric; llm-d builds on it), instead of one SGLang gateway per LLM. Per LLM:
- InferencePool `<llm>` (inference.networking.k8s.io/v1): the LLM's replica pods (the same labels
  the SGLang gateways select, gateway.replica_selector), their engine port, and its endpoint picker;
- the endpoint picker (EPP) of that pool, as the upstream `inferencepool` Helm chart of release
  v1.5.0 renders it (config/charts/inferencepool, config/charts/epplib): ServiceAccount, Role and
  RoleBinding `<llm>-epp` (pods, inferencepools, inferenceobjectives and inferencemodelrewrites:
  get, list, watch), ConfigMap `<llm>-epp` with its EndpointPickerConfig, Deployment and Service
  `<llm>-epp` (gRPC ext-proc 9002, health 9003, metrics 9090), image
  `registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0`;
- HTTPRoute `<llm>` (gateway.networking.k8s.io/v1) attached to the platform's Gateway
  (`gateway_name`, the Gateway and its class stay the platform's), with one rule: the LLM's API
  paths, matched together with the header `X-Gateway-Model-Name: <llm>` that body-based routing
  (BBR) copies from the request body's `model`, sent to the InferencePool.

Which requests the EPP can pick for (its v1.5.0 sources,
pkg/epp/framework/plugins/requesthandling/parsers/openai/openai.go): the OpenAI parser recognises
chat completions, completions, embeddings, responses and conversations by path suffix and parses
any other path as a completions request, which it rejects without a `prompt` (400). So decoders and
embedders use the default parser and the chart's scorers (queue, KV cache, prefix cache); rerank
requests would be refused by it, so a reranker's pool uses the `passthrough-parser` (the body is
not parsed) and only the queue and KV-cache scorers (the prefix-cache scorer needs a parsed body).
SGLang engines get the EPP's SGLang metric names (`core-metrics-extractor` `defaultEngine: sglang`).

A re-plan adds or removes replicas exactly as with the SGLang gateways: the EPP watches the pool's
pods and picks only Ready ones; a deleted pod leaves the pool (its endpoints) while the engine's
preStop hook drains it (gateway.membership).
"""

from __future__ import annotations

import yaml

from scepsy.models.catalog.catalog import serving_task

from . import names
from .engines import ENGINE_PORTS
from .gateway import DRAIN_LIMIT_S, replica_selector
from .plan_input import PlacedPlan
from .workloads import single_pod_deployment

INFERENCE_EXTENSION_VERSION = "v1.5.0"
EPP_IMAGE = f"registry.k8s.io/gateway-api-inference-extension/epp:{INFERENCE_EXTENSION_VERSION}"
POOL_API = "inference.networking.k8s.io/v1"
ROUTE_API = "gateway.networking.k8s.io/v1"
EXT_PROC_PORT = 9002
HEALTH_PORT = 9003
METRICS_PORT = 9090
EPP_CONFIG_FILE = "default-plugins.yaml"
MODEL_HEADER = "X-Gateway-Model-Name"  # set by BBR's body-field-to-header plugin from the body's `model`
DEFAULT_GATEWAY = "inference-gateway"

# the OpenAI-compatible paths each kind of LLM serves (vLLM serves rerank under three paths, SGLang one)
API_PATHS = {
    "generate": ("/v1/chat/completions", "/v1/completions"),
    "embed": ("/v1/embeddings",),
}
RERANK_PATHS = {"vllm": ("/v1/rerank", "/rerank", "/v2/rerank"), "sglang": ("/v1/rerank",)}


def epp_name(llm: str) -> str:
    return f"{names.dns_label(llm)}-epp"


def api_paths(engine: str, model: str) -> tuple[str, ...]:
    task = serving_task(model)
    return RERANK_PATHS[engine] if task == "score" else API_PATHS[task]


def epp_config(engine: str, model: str) -> str:
    """The EndpointPickerConfig (the chart's default-plugins.yaml for the engine; passthrough for rerankers)."""
    extractor: dict = {"type": "core-metrics-extractor"}
    if engine != "vllm":
        extractor["parameters"] = {"defaultEngine": engine}
    source = {"type": "metrics-data-source", "parameters": {"scheme": "http", "path": "/metrics", "insecureSkipVerify": True}}
    config: dict = {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig"}
    scorers = [{"pluginRef": "queue-scorer", "weight": 2}, {"pluginRef": "kv-cache-utilization-scorer", "weight": 2}]
    if serving_task(model) == "score":
        config["plugins"] = [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"}, source, extractor, {"type": "passthrough-parser"}]
        config["schedulingProfiles"] = [{"name": "default", "plugins": scorers}]
        config["parser"] = {"pluginRef": "passthrough-parser"}
    else:
        config["plugins"] = [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"}, {"type": "prefix-cache-scorer"}, source, extractor]
        config["schedulingProfiles"] = [{"name": "default", "plugins": [*scorers, {"pluginRef": "prefix-cache-scorer", "weight": 3}]}]
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False)


def _labels(plan: PlacedPlan, llm: str, name: str, component: str) -> dict[str, str]:
    out = names.labels("gateway-api-inference-extension", name, component, llm=llm)
    for workflow in plan.workflows_of(llm):
        out[names.workflow_member_label(workflow)] = "true"
    return out


def inference_pool(plan: PlacedPlan, llm: str, namespace: str, engine: str) -> dict:
    return {
        "apiVersion": POOL_API,
        "kind": "InferencePool",
        "metadata": {"name": names.llm_service(llm), "namespace": namespace, "labels": _labels(plan, llm, names.llm_service(llm), "inference-pool")},
        "spec": {
            "selector": {"matchLabels": replica_selector(llm)},
            "targetPorts": [{"number": ENGINE_PORTS[engine]}],
            "appProtocol": "http",
            # FailOpen: without its picker the gateway still sends to this pool, i.e. to this LLM
            "endpointPickerRef": {"name": epp_name(llm), "port": {"number": EXT_PROC_PORT}, "failureMode": "FailOpen"},
        },
    }


def http_route(plan: PlacedPlan, llm: str, namespace: str, engine: str, gateway_name: str, gateway_namespace: str | None) -> dict:
    parent: dict = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gateway_name}
    if gateway_namespace:
        parent["namespace"] = gateway_namespace
    header = [{"type": "Exact", "name": MODEL_HEADER, "value": llm}]
    matches = [{"path": {"type": "Exact", "value": path}, "headers": header} for path in api_paths(engine, plan.llm(llm).model)]
    rule = {
        "matches": matches,
        "backendRefs": [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": names.llm_service(llm)}],
        # long generations: the same bound as a replica's drain
        "timeouts": {"request": f"{DRAIN_LIMIT_S}s"},
    }
    return {
        "apiVersion": ROUTE_API,
        "kind": "HTTPRoute",
        "metadata": {"name": names.llm_service(llm), "namespace": namespace, "labels": _labels(plan, llm, names.llm_service(llm), "route")},
        "spec": {"parentRefs": [parent], "rules": [rule]},
    }


def _epp_rbac(plan: PlacedPlan, llm: str, namespace: str) -> list[dict]:
    name = epp_name(llm)
    metadata = {"name": name, "namespace": namespace, "labels": _labels(plan, llm, name, "endpoint-picker")}
    read = ["get", "list", "watch"]
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": read},
        {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"], "verbs": read},
        {"apiGroups": ["inference.networking.x-k8s.io"], "resources": ["inferenceobjectives", "inferencemodelrewrites"], "verbs": read},
    ]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": metadata, "rules": rules},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata,
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        },
    ]


def _epp_deployment(plan: PlacedPlan, llm: str, namespace: str, priority_class: str) -> dict:
    name = epp_name(llm)
    labels = _labels(plan, llm, name, "endpoint-picker")
    selector = {names.LLM_LABEL: labels[names.LLM_LABEL], "app.kubernetes.io/component": "endpoint-picker"}
    args = ["--pool-name", names.llm_service(llm), "--pool-namespace", namespace, "--pool-group", "inference.networking.k8s.io"]
    args += ["--zap-encoder", "json", "--config-file", f"/config/{EPP_CONFIG_FILE}", "--v", "1", "--tracing=false"]
    # Prometheus scrapes /metrics without a ServiceAccount token (the chart's default needs token reviews)
    args.append("--metrics-endpoint-auth=false")
    grpc_probe = {"grpc": {"port": HEALTH_PORT, "service": "inference-extension"}}
    field = {"NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}
    container = {
        "name": "epp",
        "image": EPP_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "ports": [
            {"name": "grpc", "containerPort": EXT_PROC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        # the chart's sizing, validated upstream at high request rates
        "resources": {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"memory": "16Gi"}},
        "livenessProbe": {**grpc_probe, "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {**grpc_probe, "periodSeconds": 2},
        "env": [{"name": key, "valueFrom": {"fieldRef": {"fieldPath": path}}} for key, path in field.items()],
        "volumeMounts": [{"name": "plugins-config", "mountPath": "/config"}],
    }
    pod_spec = {
        "serviceAccountName": name,
        "enableServiceLinks": False,
        "priorityClassName": priority_class,
        "terminationGracePeriodSeconds": 130,
        "containers": [container],
        "volumes": [{"name": "plugins-config", "configMap": {"name": name}}],
    }
    # one active picker (its prefix-cache state), replaced on change: the chart's strategy
    return single_pod_deployment(name, namespace, labels, selector, pod_spec)


def llm_objects(plan: PlacedPlan, llm: str, namespace: str, engine: str, gateway_name: str, gateway_namespace: str | None,
                priority_class: str) -> list[dict]:
    """The InferencePool, its endpoint picker and the HTTPRoute of one LLM."""
    name = epp_name(llm)
    labels = _labels(plan, llm, name, "endpoint-picker")
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": {EPP_CONFIG_FILE: epp_config(engine, plan.llm(llm).model)},
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "type": "ClusterIP",
            "selector": {names.LLM_LABEL: labels[names.LLM_LABEL], "app.kubernetes.io/component": "endpoint-picker"},
            "ports": [
                {"name": "grpc-ext-proc", "port": EXT_PROC_PORT, "targetPort": "grpc", "protocol": "TCP"},
                {"name": "http-metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }
    return [
        *_epp_rbac(plan, llm, namespace),
        config,
        service,
        _epp_deployment(plan, llm, namespace, priority_class),
        inference_pool(plan, llm, namespace, engine),
        http_route(plan, llm, namespace, engine, gateway_name, gateway_namespace),
    ]
