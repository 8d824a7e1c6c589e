"""Routing through an inference gateway (`--router inference-gateway`).

For platforms that route LLM traffic with a Gateway API inference gateway (Istio, GKE Gateway,
kgateway/agentgateway, NGINX Gateway Fabric; llm-d builds on it), instead of one SGLang gateway per
LLM. Per LLM, as the upstream chart of the chosen endpoint-picker release renders it for one pool
(`PICKERS`; the templates followed are vendored in tests/fixtures/inference_gateway_charts):
- InferencePool `<llm>` (inference.networking.k8s.io/v1): the LLM's replica pods (the same labels
  the SGLang gateways select, gateway.replica_selector), their engine port, and its endpoint picker;
- the endpoint picker (EPP): ServiceAccount, Role and RoleBinding `<llm>-epp` (pods, inferencepools,
  inferenceobjectives and inferencemodelrewrites: get, list, watch; with more than one picker,
  leases and events for leader election), ConfigMap `<llm>-epp` with its EndpointPickerConfig,
  Deployment and Service `<llm>-epp` (gRPC ext-proc 9002, health 9003, metrics 9090);
- HTTPRoute `<llm>` (gateway.networking.k8s.io/v1) attached to the platform's Gateway, with the
  chart's one rule: every path (`PathPrefix /`) of requests whose header `X-Gateway-Model-Name`
  (set by body-based routing from the body's `model`) names the LLM, sent to the InferencePool;
- what the chart adds for the gateway provider (`PROVIDERS`): Istio a DestinationRule that speaks
  TLS to the picker (it serves its gRPC over TLS with a self-signed certificate by default); GKE a
  HealthCheckPolicy (`/health` on the engine port; GKE's default checks `/`) and a GCPBackendPolicy
  (the request timeout, since GKE refuses `timeouts` on the HTTPRoute).

Pickers: `replicas` pods with leader election (`--ha-enable-leader-election`: only the leader passes
readiness, so the Service sends to it; a stopped leader releases its lease and a standby takes
over), as the chart does for more than one replica. The chart's `Recreate` strategy still replaces
them all together when the picker's Deployment changes. The pool asks for `FailOpen`, the chart's
default; gateways need not honour it (Envoy's ext_proc with the picker's full-duplex streaming), so
without a ready picker, requests for its LLM may fail there.

Which requests the picker parses: see `epp_config`.

A re-plan adds or removes replicas exactly as with the SGLang gateways: the picker watches the
pool's pods and picks only Ready ones; a deleted pod leaves the pool while the engine's preStop hook
drains it (gateway.membership). Nothing here depends on the plan's replica counts, so a re-plan
rewrites no routing object.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from scepsy.models.catalog.catalog import serving_task

from scepsy.k8s import names
from scepsy.k8s.engines import ENGINE_PORTS
from scepsy.k8s.gateway import DRAIN_LIMIT_S, ENGINE_TERMINATION_GRACE_S, replica_selector
from scepsy.k8s.plan_input import PlacedPlan
from scepsy.k8s.sizing import most_replicas, picker_resources
from scepsy.k8s.workloads import single_pod_deployment

POOL_API = "inference.networking.k8s.io/v1"
ROUTE_API = "gateway.networking.k8s.io/v1"
EXT_PROC_PORT = 9002
HEALTH_PORT = 9003
METRICS_PORT = 9090
EPP_CONFIG_FILE = "default-plugins.yaml"
MODEL_HEADER = "X-Gateway-Model-Name"  # set by body-based routing's body-field-to-header plugin from the body's `model`
DEFAULT_GATEWAY = "inference-gateway"
DEFAULT_PICKER_REPLICAS = 2


@dataclass(frozen=True)
class PickerRelease:
    """An upstream endpoint-picker release: where its chart puts things that differ between them."""

    name: str
    image: str
    config_api: str  # the EndpointPickerConfig's apiVersion
    objective_groups: tuple[str, ...]  # API groups of InferenceObjective / InferenceModelRewrite it watches
    chart_cpu_cores: int  # the chart's CPU request (sizing.picker_resources caps at it)
    h2c_service_port: bool  # the chart's Service marks the ext-proc port appProtocol kubernetes.io/h2c
    health_port_flag: bool  # the chart passes --grpc-health-port
    fallback_parser: bool  # parsers are chosen per path; an unclaimed path goes to the passthrough parser


# llm-d/llm-d-router, tag v0.10.0: the picker, its config API and the InferenceObjective /
# InferenceModelRewrite APIs moved here from the extension in its v1.6.0 (README.md there); chart
# config/charts/llm-d-router-gateway with routerlib. kubernetes-sigs/gateway-api-inference-extension,
# tag v1.5.0: the last release with the picker; chart config/charts/inferencepool with epplib.
# (Commits and hashes: tests/fixtures/inference_gateway_charts/SOURCES.)
PICKERS = {
    "llm-d-router": PickerRelease(
        "llm-d-router", "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0", "llm-d.ai/v1alpha1",
        ("inference.networking.x-k8s.io", "llm-d.ai"), 8, True, True, True,
    ),
    "inference-extension-v1.5.0": PickerRelease(
        "inference-extension-v1.5.0", "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0",
        "inference.networking.x-k8s.io/v1alpha1", ("inference.networking.x-k8s.io",), 4, False, False, False,
    ),
}
DEFAULT_PICKER = "llm-d-router"

# the gateway providers the charts tell apart (`provider.name`); every other implementation
# (kgateway, agentgateway, Envoy AI Gateway, NGINX Gateway Fabric) is `none`: the chart adds nothing
PROVIDERS = ("istio", "gke", "none")
DEFAULT_PROVIDER = "istio"


@dataclass(frozen=True)
class InferenceGatewaySettings:
    namespace: str
    engine: str
    gateway_name: str = DEFAULT_GATEWAY
    gateway_namespace: str | None = None
    provider: str = DEFAULT_PROVIDER
    picker: str = DEFAULT_PICKER
    picker_replicas: int = DEFAULT_PICKER_REPLICAS

    @property
    def release(self) -> PickerRelease:
        return PICKERS[self.picker]


def epp_name(llm: str) -> str:
    return f"{names.dns_label(llm)}-epp"


def epp_config(release: PickerRelease, engine: str, model: str) -> str:
    """The EndpointPickerConfig: the chart's default-plugins.yaml for the engine, with parsers that
    let every OpenAI path the engines serve reach the pool.

    llm-d-router v0.10.0 chooses a parser per request path (pkg/epp/handlers/parsers.go): the
    `openai-parser` claims chat completions, completions, embeddings, responses, conversations and
    image generations (parsers/openai/openai.go); a parser that claims no path, `passthrough-parser`,
    takes every other path (model listing, rerank, score, tokenize), whose body it does not parse,
    so the prefix-cache scorer skips those requests (prefixhash/hashing.go) and the queue and
    KV-cache scorers pick.

    The extension's v1.5.0 has one parser for all paths: its OpenAI parser parses any path it does
    not recognise as a completions request and refuses it without a `prompt` (400). Decoders and
    embedders keep it (only their generation and embedding paths then pass the picker); a
    reranker's pool uses the passthrough parser and no prefix-cache scorer.
    """
    extractor: dict = {"type": "core-metrics-extractor"}
    if engine != "vllm":
        extractor["parameters"] = {"defaultEngine": engine}
    source = {"type": "metrics-data-source", "parameters": {"scheme": "http", "path": "/metrics", "insecureSkipVerify": True}}
    config: dict = {"apiVersion": release.config_api, "kind": "EndpointPickerConfig"}
    scorers: list[dict] = [{"pluginRef": "queue-scorer", "weight": 2}, {"pluginRef": "kv-cache-utilization-scorer", "weight": 2}]
    plugins: list[dict] = [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"}]
    if release.fallback_parser:
        config["plugins"] = [*plugins, {"type": "prefix-cache-scorer"}, source, extractor, {"type": "openai-parser"}, {"type": "passthrough-parser"}]
        config["schedulingProfiles"] = [{"name": "default", "plugins": [*scorers, {"pluginRef": "prefix-cache-scorer", "weight": 3}]}]
        config["requestHandler"] = {"parsers": [{"pluginRef": "openai-parser"}, {"pluginRef": "passthrough-parser"}]}
    elif serving_task(model) == "score":
        config["plugins"] = [*plugins, source, extractor, {"type": "passthrough-parser"}]
        config["schedulingProfiles"] = [{"name": "default", "plugins": scorers}]
        config["parser"] = {"pluginRef": "passthrough-parser"}
    else:
        config["plugins"] = [*plugins, {"type": "prefix-cache-scorer"}, source, extractor]
        config["schedulingProfiles"] = [{"name": "default", "plugins": [*scorers, {"pluginRef": "prefix-cache-scorer", "weight": 3}]}]
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False)


def _labels(plan: PlacedPlan, llm: str, name: str, component: str, release: PickerRelease) -> dict[str, str]:
    out = names.labels(release.name, name, component, llm=llm)
    for workflow in plan.workflows_of(llm):
        out[names.workflow_member_label(workflow)] = "true"
    return out


def _metadata(plan: PlacedPlan, llm: str, name: str, component: str, s: InferenceGatewaySettings) -> dict:
    return {"name": name, "namespace": s.namespace, "labels": _labels(plan, llm, name, component, s.release)}


def inference_pool(plan: PlacedPlan, llm: str, s: InferenceGatewaySettings) -> dict:
    return {
        "apiVersion": POOL_API,
        "kind": "InferencePool",
        "metadata": _metadata(plan, llm, names.llm_service(llm), "inference-pool", s),
        "spec": {
            "selector": {"matchLabels": replica_selector(llm)},
            "targetPorts": [{"number": ENGINE_PORTS[s.engine]}],
            "appProtocol": "http",
            # the chart's default; gateways need not honour it (module docstring): not counted on
            "endpointPickerRef": {"name": epp_name(llm), "port": {"number": EXT_PROC_PORT}, "failureMode": "FailOpen"},
        },
    }


def http_route(plan: PlacedPlan, llm: str, s: InferenceGatewaySettings) -> dict:
    parent: dict = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": s.gateway_name}
    if s.gateway_namespace:
        parent["namespace"] = s.gateway_namespace
    rule: dict = {
        "backendRefs": [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": names.llm_service(llm)}],
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}, "headers": [{"type": "Exact", "name": MODEL_HEADER, "value": llm}]}],
    }
    if s.provider != "gke":
        # long generations: the same bound as a replica's drain (GKE refuses `timeouts`; its
        # GCPBackendPolicy carries the timeout there)
        rule["timeouts"] = {"request": f"{DRAIN_LIMIT_S}s"}
    return {
        "apiVersion": ROUTE_API,
        "kind": "HTTPRoute",
        "metadata": _metadata(plan, llm, names.llm_service(llm), "route", s),
        "spec": {"parentRefs": [parent], "rules": [rule]},
    }


def _epp_rbac(plan: PlacedPlan, llm: str, s: InferenceGatewaySettings) -> list[dict]:
    name = epp_name(llm)
    metadata = _metadata(plan, llm, name, "endpoint-picker", s)
    read = ["get", "list", "watch"]
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": read},
        {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"], "verbs": read},
        *({"apiGroups": [group], "resources": ["inferenceobjectives", "inferencemodelrewrites"], "verbs": read}
          for group in s.release.objective_groups),
    ]
    if s.picker_replicas > 1:
        # the chart's leader-election Role
        rules.append({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]})
        rules.append({"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]})
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": metadata, "rules": rules},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata,
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": s.namespace}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        },
    ]


def _picker_selector(llm: str) -> dict[str, str]:
    return {names.LLM_LABEL: names.label_value(llm), "app.kubernetes.io/component": "endpoint-picker"}


def _epp_args(llm: str, s: InferenceGatewaySettings) -> list[str]:
    args = ["--pool-name", names.llm_service(llm), "--pool-namespace", s.namespace, "--pool-group", "inference.networking.k8s.io"]
    args += ["--zap-encoder", "json", "--config-file", f"/config/{EPP_CONFIG_FILE}"]
    if s.picker_replicas > 1:
        args.append("--ha-enable-leader-election")
    if s.release.health_port_flag:
        args += ["--grpc-health-port", str(HEALTH_PORT)]
    args += ["--v=1", "--tracing=false"]
    # Prometheus scrapes /metrics without a ServiceAccount token (the chart's default needs token reviews)
    args.append("--metrics-endpoint-auth=false")
    return args


def _epp_deployment(plan: PlacedPlan, llm: str, s: InferenceGatewaySettings, priority_class: str) -> dict:
    name = epp_name(llm)
    labels = _labels(plan, llm, name, "endpoint-picker", s.release)
    # one picker answers its health service; with leader election, liveness and readiness separately
    # (readiness passes only on the leader)
    led = s.picker_replicas > 1
    requests, limits = picker_resources(most_replicas(plan.instance, llm), s.release.chart_cpu_cores)
    field = {"NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}
    container = {
        "name": "epp",
        "image": s.release.image,
        "imagePullPolicy": "IfNotPresent",
        "args": _epp_args(llm, s),
        "ports": [
            {"name": "grpc", "containerPort": EXT_PROC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": {"requests": requests, "limits": limits},
        "livenessProbe": {"grpc": {"port": HEALTH_PORT, "service": "liveness" if led else "inference-extension"},
                          "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {"grpc": {"port": HEALTH_PORT, "service": "readiness" if led else "inference-extension"}, "periodSeconds": 2},
        "env": [{"name": key, "valueFrom": {"fieldRef": {"fieldPath": path}}} for key, path in field.items()],
        "volumeMounts": [{"name": "plugins-config", "mountPath": "/config"}],
    }
    pod_spec = {
        "serviceAccountName": name,
        "enableServiceLinks": False,
        "priorityClassName": priority_class,
        # the chart: "this timeout should mirror the longest grace period of the pods within the pool"
        "terminationGracePeriodSeconds": ENGINE_TERMINATION_GRACE_S,
        "containers": [container],
        "volumes": [{"name": "plugins-config", "configMap": {"name": name}}],
    }
    return single_pod_deployment(name, s.namespace, labels, _picker_selector(llm), pod_spec, replicas=s.picker_replicas)


def _epp_service(plan: PlacedPlan, llm: str, s: InferenceGatewaySettings) -> dict:
    ext_proc: dict = {"name": "grpc-ext-proc", "port": EXT_PROC_PORT, "targetPort": "grpc", "protocol": "TCP"}
    if s.release.h2c_service_port:
        ext_proc["appProtocol"] = "kubernetes.io/h2c"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(plan, llm, epp_name(llm), "endpoint-picker", s),
        "spec": {
            "type": "ClusterIP",
            "selector": _picker_selector(llm),
            "ports": [ext_proc, {"name": "http-metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}],
        },
    }


def provider_objects(plan: PlacedPlan, llm: str, s: InferenceGatewaySettings) -> list[dict]:
    """What the chart adds for the gateway provider (templates/istio.yaml, templates/gke.yaml)."""
    if s.provider == "istio":
        name = epp_name(llm)
        return [{
            "apiVersion": "networking.istio.io/v1beta1",
            "kind": "DestinationRule",
            "metadata": _metadata(plan, llm, name, "endpoint-picker", s),
            "spec": {
                "host": f"{name}.{s.namespace}.svc.cluster.local",
                # the picker's self-signed certificate: TLS without verification, as the chart does
                "trafficPolicy": {"tls": {"mode": "SIMPLE", "insecureSkipVerify": True}},
            },
        }]
    if s.provider == "gke":
        pool = names.llm_service(llm)
        target = {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool}
        health = {"timeoutSec": 2, "checkIntervalSec": 2,
                  "config": {"type": "HTTP", "httpHealthCheck": {"requestPath": "/health", "port": ENGINE_PORTS[s.engine]}}}
        return [
            {"apiVersion": "networking.gke.io/v1", "kind": "HealthCheckPolicy", "metadata": _metadata(plan, llm, pool, "inference-pool", s),
             "spec": {"targetRef": target, "default": health}},
            # the chart's 300 s ("adjust as needed"): here the same bound as the other providers' route timeout
            {"apiVersion": "networking.gke.io/v1", "kind": "GCPBackendPolicy", "metadata": _metadata(plan, llm, pool, "inference-pool", s),
             "spec": {"targetRef": target, "default": {"timeoutSec": DRAIN_LIMIT_S, "logging": {"enabled": True}}}},
        ]
    return []


def llm_objects(plan: PlacedPlan, llm: str, s: InferenceGatewaySettings, priority_class: str) -> list[dict]:
    """The InferencePool, its endpoint picker, the HTTPRoute and the provider's objects of one LLM."""
    name = epp_name(llm)
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(plan, llm, name, "endpoint-picker", s),
        "data": {EPP_CONFIG_FILE: epp_config(s.release, s.engine, plan.llm(llm).model)},
    }
    return [
        *_epp_rbac(plan, llm, s),
        config,
        _epp_service(plan, llm, s),
        _epp_deployment(plan, llm, s, priority_class),
        inference_pool(plan, llm, s),
        http_route(plan, llm, s),
        *provider_objects(plan, llm, s),
    ]
