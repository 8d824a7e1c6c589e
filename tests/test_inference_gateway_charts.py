"""`--router inference-gateway` against the upstream charts it follows, for every gateway provider
and endpoint-picker release.

The charts' templates are vendored unchanged in tests/fixtures/inference_gateway_charts (SOURCES
there: repository, tag, commit, sha256). A template is Go text, not YAML: `_template_document`
reads one document of it as the chart renders it with its default values (the first branch of each
`if`, optional `with`/`range` blocks left out, every `{{ expression }}` a placeholder), which is
enough to compare field names and literal values. GKE's HealthCheckPolicy and GCPBackendPolicy,
for which GKE publishes no CRD, are checked field for field against `templates/gke.yaml`: every
field the chart sets and no other.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import yaml

from k8s_support import CASES, objects_of, of_kind, regenerate

from scepsy.k8s import inference_gateway
from scepsy.k8s.manifests import ManifestSettings, emit
from scepsy.k8s.plan_input import load_placed_plan
from scepsy.k8s.validate import newest_version, validate_objects

CHARTS = Path(__file__).resolve().parent / "fixtures" / "inference_gateway_charts"
# endpoint picker -> (vendored chart folder, its gateway chart, its library chart)
CHART_OF = {
    "llm-d-router": ("llm-d-router-v0.10.0", "llm-d-router-gateway", "routerlib"),
    "inference-extension-v1.5.0": ("gateway-api-inference-extension-v1.5.0", "inferencepool", "epplib"),
}
_EXPRESSION = re.compile(r"\{\{-?.*?-?\}\}")
_CONTROL = re.compile(r"^\s*\{\{-?\s*(if|else|end|with|range|define|include|\$)")
_COMMENT = re.compile(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", re.DOTALL)


def _template(picker: str, chart: str, name: str) -> str:
    folder, gateway, library = CHART_OF[picker]
    return (CHARTS / folder / {"gateway": gateway, "library": library}[chart] / "templates" / name).read_text()


def _render_defaults(text: str) -> str:
    """The template's text with its control lines resolved: the first branch of an if/else chain
    kept, `with` and `range` blocks (optional values) dropped, comments dropped, expressions as
    placeholders."""
    out: list[str] = []
    stack: list[bool] = []  # per open block: whether its lines are kept
    for line in _COMMENT.sub("", text).splitlines():
        match = _CONTROL.match(line)
        if not match:
            if all(stack):
                out.append(_EXPRESSION.sub("PLACEHOLDER", line))
            continue
        word = match.group(1)
        if word == "if":
            stack.append(True)
        elif word in ("with", "range"):
            stack.append(False)
        elif word == "else" and stack:
            stack[-1] = False
        elif word == "end" and stack:
            stack.pop()
    return "\n".join(out)


def _template_document(text: str, kind: str, contains: str = "") -> dict:
    """The first document of `kind` (whose text contains `contains`) of a template."""
    for chunk in re.split(r"^---\s*$", text, flags=re.MULTILINE):
        if re.search(rf"^kind: {kind}\s*$", chunk, flags=re.MULTILINE) and contains in chunk:
            document = yaml.safe_load(_render_defaults(chunk))
            assert isinstance(document, dict), chunk
            return document
    raise AssertionError(f"no {kind} in the template")


def _paths(value: object, prefix: str = "") -> set[str]:
    if isinstance(value, dict):
        return {p for key, sub in value.items() for p in {f"{prefix}{key}"} | _paths(sub, f"{prefix}{key}.")}
    return set()


def _emit(picker: str, provider: str, engine: str = "vllm", replicas: int = 2) -> list[dict]:
    case = next(c for c in CASES if c.router == "inference-gateway" and c.engine == engine)
    plan = load_placed_plan(regenerate.plan_path(case))
    settings = ManifestSettings(engine=engine, router="inference-gateway", prometheus=True, gateway_provider=provider,
                                endpoint_picker=picker, picker_replicas=replicas)
    return objects_of(emit(plan, settings))


def test_the_vendored_templates_are_the_ones_sources_names():
    """Every vendored file is listed in SOURCES with its sha256, and nothing else is."""
    listed = dict(re.findall(r"^  ([0-9a-f]{64})  \./(\S+)$", (CHARTS / "SOURCES").read_text(), flags=re.MULTILINE))
    files = {p.relative_to(CHARTS).as_posix() for p in CHARTS.rglob("*.yaml")}
    assert set(listed.values()) == files
    for digest, name in listed.items():
        assert hashlib.sha256((CHARTS / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("picker", sorted(inference_gateway.PICKERS))
@pytest.mark.parametrize("provider", inference_gateway.PROVIDERS)
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_provider_and_picker_validates_strictly(engine, provider, picker):
    """Built-in objects against Kubernetes' schemas, InferencePools, HTTPRoutes and DestinationRules
    against the vendored CRDs (k8s/crds/SOURCES), strictly; each provider gets exactly its objects."""
    objects = _emit(picker, provider, engine)
    assert validate_objects(objects, newest_version()) == []
    kinds = {o["kind"] for o in objects}
    assert ("DestinationRule" in kinds) == (provider == "istio")
    assert {"HealthCheckPolicy", "GCPBackendPolicy"} <= kinds if provider == "gke" else not {"HealthCheckPolicy", "GCPBackendPolicy"} & kinds
    routes = of_kind(objects, "HTTPRoute")
    assert routes and all(("timeouts" in r["spec"]["rules"][0]) == (provider != "gke") for r in routes)


@pytest.mark.parametrize("picker", sorted(inference_gateway.PICKERS))
def test_gke_policies_set_the_fields_the_chart_sets(picker):
    """HealthCheckPolicy and GCPBackendPolicy: the chart's field names exactly (templates/gke.yaml,
    the InferencePool-targeted documents), its literal values, the engine's port and /health."""
    text = _template(picker, "gateway", "gke.yaml")
    objects = _emit(picker, "gke")
    pools = {p["metadata"]["name"] for p in of_kind(objects, "InferencePool")}
    for kind in ("HealthCheckPolicy", "GCPBackendPolicy"):
        template = _template_document(text, kind, "group: inference.networking.k8s.io")
        emitted = of_kind(objects, kind)
        assert {o["metadata"]["name"] for o in emitted} == pools
        for obj in emitted:
            assert obj["apiVersion"] == template["apiVersion"]
            assert _paths(obj["spec"]) == _paths(template["spec"]), kind
            assert obj["spec"]["targetRef"] == {**template["spec"]["targetRef"], "name": obj["metadata"]["name"]}
    health = _template_document(text, "HealthCheckPolicy", "group: inference.networking.k8s.io")["spec"]["default"]
    for obj in of_kind(objects, "HealthCheckPolicy"):
        default = obj["spec"]["default"]
        assert (default["timeoutSec"], default["checkIntervalSec"]) == (health["timeoutSec"], health["checkIntervalSec"])
        assert default["config"]["type"] == health["config"]["type"] == "HTTP"
        assert default["config"]["httpHealthCheck"]["requestPath"] == health["config"]["httpHealthCheck"]["requestPath"] == "/health"
        assert default["config"]["httpHealthCheck"]["port"] == 8000
    backend = _template_document(text, "GCPBackendPolicy", "group: inference.networking.k8s.io")["spec"]["default"]
    assert all(o["spec"]["default"]["logging"] == backend["logging"] for o in of_kind(objects, "GCPBackendPolicy"))


@pytest.mark.parametrize("picker", sorted(inference_gateway.PICKERS))
def test_istio_destination_rule_is_the_charts(picker):
    """templates/istio.yaml: apiVersion, the picker Service's in-cluster host, TLS SIMPLE without
    verification, and no other field."""
    template = _template_document(_template(picker, "gateway", "istio.yaml"), "DestinationRule")
    for rule in of_kind(_emit(picker, "istio"), "DestinationRule"):
        name, namespace = rule["metadata"]["name"], rule["metadata"]["namespace"]
        assert rule["apiVersion"] == template["apiVersion"]
        assert _paths(rule["spec"]) == _paths(template["spec"])
        assert rule["spec"]["trafficPolicy"] == template["spec"]["trafficPolicy"]
        assert rule["spec"]["host"] == f"{name}.{namespace}.svc.cluster.local"


@pytest.mark.parametrize("picker", sorted(inference_gateway.PICKERS))
def test_http_route_rule_is_the_charts_with_the_model_header(picker):
    """templates/httproute.yaml: one rule, `PathPrefix /` to the InferencePool, the request timeout
    except on GKE (the template's condition); the header match names the LLM (the chart matches a
    base-model header scepsy's LLMs do not need)."""
    text = _template(picker, "gateway", "httproute.yaml")
    template = _template_document(text, "HTTPRoute")["spec"]["rules"][0]
    assert 'if ne (lower .Values.provider.name) "gke"' in text
    for route in of_kind(_emit(picker, "istio"), "HTTPRoute"):
        (rule,) = route["spec"]["rules"]
        assert [m["path"] for m in rule["matches"]] == [m["path"] for m in template["matches"]] == [{"type": "PathPrefix", "value": "/"}]
        assert {k for k in rule["backendRefs"][0]} == {k for k in template["backendRefs"][0]}
        assert set(rule) == set(template)


@pytest.mark.parametrize("picker", sorted(inference_gateway.PICKERS))
def test_picker_rbac_and_probes_follow_the_chart(picker):
    """Leader election (more than one picker): the chart's lease and event rules, its flag and its
    separate liveness and readiness services; one picker: no lease rules, the one health service."""
    election = _template_document(_template(picker, "library", "_leader-election-rbac.yaml"), "Role")["rules"]
    deployment_text = _template(picker, "library", "_deployment.yaml")
    assert "--ha-enable-leader-election" in deployment_text and "service: readiness" in deployment_text
    for replicas in (1, 2):
        objects = _emit(picker, "none", replicas=replicas)
        for role in of_kind(objects, "Role"):
            assert all(rule in role["rules"] for rule in election) == (replicas > 1)
        for deployment in [d for d in of_kind(objects, "Deployment") if d["metadata"]["name"].endswith("-epp")]:
            assert deployment["spec"]["replicas"] == replicas
            container = deployment["spec"]["template"]["spec"]["containers"][0]
            assert ("--ha-enable-leader-election" in container["args"]) == (replicas > 1)
            services = {container["livenessProbe"]["grpc"]["service"], container["readinessProbe"]["grpc"]["service"]}
            assert services == ({"liveness", "readiness"} if replicas > 1 else {"inference-extension"})


def test_llm_d_router_picker_reads_the_llm_d_api_group():
    """llm-d-router's chart grants the picker the `llm-d.ai` group's objectives and rewrites and
    names its config `llm-d.ai/v1alpha1`; the extension's v1.5.0 chart neither."""
    rbac = _template("llm-d-router", "gateway", "rbac.yaml")
    config = _template("llm-d-router", "library", "_config.yaml")
    assert 'apiGroups: ["llm-d.ai"]' in rbac and "apiVersion: llm-d.ai/v1alpha1" in config
    for picker, expected in (("llm-d-router", True), ("inference-extension-v1.5.0", False)):
        objects = _emit(picker, "none")
        assert all(any(r["apiGroups"] == ["llm-d.ai"] for r in role["rules"]) == expected for role in of_kind(objects, "Role"))
        configs = [yaml.safe_load(c["data"]["default-plugins.yaml"]) for c in of_kind(objects, "ConfigMap") if c["metadata"]["name"].endswith("-epp")]
        assert configs and all((c["apiVersion"] == "llm-d.ai/v1alpha1") == expected for c in configs)


def test_picker_grace_period_mirrors_the_pool_and_resources_stay_under_the_chart():
    """The chart's comment: the grace period "should mirror the longest grace period of the pods
    within the pool"; its resources are the ceiling of scepsy's sizing."""
    assert "mirror the longest grace period of the pods within the pool" in _template("llm-d-router", "library", "_deployment.yaml")
    objects = _emit("llm-d-router", "istio")
    deployments = of_kind(objects, "Deployment")
    engines = [d for d in deployments if d["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"]
    pickers = [d for d in deployments if d["metadata"]["labels"]["app.kubernetes.io/component"] == "endpoint-picker"]
    longest = max(d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] for d in engines)
    for picker in pickers:
        spec = picker["spec"]["template"]["spec"]
        assert spec["terminationGracePeriodSeconds"] == longest
        requests = spec["containers"][0]["resources"]["requests"]
        assert int(requests["cpu"].removesuffix("m")) <= 8000 and int(requests["memory"].removesuffix("Mi")) <= 8192
    total_cpu = sum(int(p["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"].removesuffix("m")) for p in pickers)
    assert total_cpu < 8000 * len(pickers)
