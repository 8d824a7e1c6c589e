"""Every emitted built-in object validates strictly against the upstream Kubernetes schemas.

Targets: 1.30, 1.33 and the newest version kubernetes-validate bundles. kustomization.yaml is not
an API object and is skipped. dra-mps output names resource.k8s.io at the version of its target
cluster (--kubernetes-version; the NVIDIA DRA driver needs >= 1.32), so it is validated against the
versions it targets: 1.32 (v1beta1), 1.33 (v1beta2) and 1.34+ (v1).
"""

from __future__ import annotations

import copy

import pytest

from k8s_support import CASES, objects_of, of_kind, regenerate

from scepsy.k8s.manifests import ManifestSettings, emit
from scepsy.k8s.plan_input import load_placed_plan
from scepsy.k8s.validate import crd_schemas, newest_version, validate_objects

VERSIONS = ("1.30.0", "1.33.0", newest_version())


# every test run: every golden case against the newest version, one case against every version; the
# exhaustive run: every case against every version
EVERY_VERSION = "beam-4xa6000-vllm-hami"
GOLDEN = [pytest.param(c, version, id=f"{c.name}-{version}",
                       marks=[] if version == newest_version() or c.name == EVERY_VERSION else [pytest.mark.exhaustive])
          for c in CASES if c.sharing != "dra-mps" for version in VERSIONS]


@pytest.mark.parametrize("case, version", GOLDEN)
def test_golden_objects_validate_strictly(case, version):
    assert validate_objects(objects_of(regenerate.emit(case)), version) == [], version


@pytest.mark.parametrize("target,versions", [("1.32", ("1.32.0",)), ("1.33", ("1.33.0",)), ("1.34", ("1.34.0", newest_version()))])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_dra_mps_objects_validate_for_their_target_version(target, versions, engine):
    case = next(c for c in CASES if c.sharing == "dra-mps")
    plan = load_placed_plan(regenerate.plan_path(case))
    objects = objects_of(emit(plan, ManifestSettings(engine=engine, gpu_sharing="dra-mps", kubernetes_version=target)))
    claims = of_kind(objects, "ResourceClaim")
    assert claims
    for version in versions:
        assert validate_objects(objects, version) == [], version


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_prometheus_output_validates_and_pod_monitors_follow_the_crd(engine):
    """Built-in objects validate as before; PodMonitors (prometheus-operator's CRD
    monitoring.coreos.com/v1, example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml:
    spec.selector, spec.podMetricsEndpoints[].port/path/interval) select pods that exist and name a
    port those pods declare."""
    case = next(c for c in CASES if c.instance == "combined-8xh100" and c.sharing == "hami" and c.engine == engine)
    plan = load_placed_plan(regenerate.plan_path(case))
    objects = objects_of(emit(plan, ManifestSettings(engine=engine, prometheus=True)))
    for version in VERSIONS:
        assert validate_objects(objects, version) == [], version
    monitors = of_kind(objects, "PodMonitor")
    pods = [d["spec"]["template"] for d in of_kind(objects, "Deployment")]
    gateways = [d for d in of_kind(objects, "Deployment") if d["metadata"]["name"].endswith("-gateway")]
    assert len(monitors) == len(plan.llms) + len(gateways) + 1  # and the workflow entry's
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and set(monitor["spec"]) == {"selector", "podMetricsEndpoints"}
        selected = [p for p in pods if monitor["spec"]["selector"]["matchLabels"].items() <= p["metadata"]["labels"].items()]
        assert selected
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert set(endpoint) == {"port", "path", "interval"} and endpoint["path"] == "/metrics"
        for pod in selected:
            assert endpoint["port"] in {p["name"] for p in pod["spec"]["containers"][0]["ports"]}


def test_validation_is_strict():
    case = CASES[0]
    objects = objects_of(regenerate.emit(case))
    broken = copy.deepcopy(objects)
    deployment = of_kind(broken, "Deployment")[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    problems = validate_objects(broken, newest_version())
    assert len(problems) == 1 and "livenessProbes" in problems[0].message


def test_kustomization_is_not_validated_as_a_built_in():
    objects = objects_of(regenerate.emit(CASES[0]))
    assert any(o["kind"] == "Kustomization" for o in objects)
    assert validate_objects(objects, newest_version()) == []


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_inference_gateway_objects_validate_against_the_vendored_crds(engine):
    """InferencePools (inference extension v1.5.0 and v1.6.0), HTTPRoutes (Gateway API v1.3.0 and
    v1.5.1, standard channel) and Istio DestinationRules validate strictly against their CRDs'
    schemas (k8s/crds/SOURCES; every provider and picker: test_inference_gateway_charts.py), the
    built-in objects against Kubernetes' as before, and with --prometheus the endpoint pickers'
    PodMonitors select the pickers' pods on a port they declare."""
    case = next(c for c in CASES if c.router == "inference-gateway" and c.engine == engine)
    plan = load_placed_plan(regenerate.plan_path(case))
    objects = objects_of(emit(plan, ManifestSettings(engine=engine, router="inference-gateway", prometheus=True)))
    kinds = {o["kind"] for o in objects}
    assert {"InferencePool", "HTTPRoute", "DestinationRule"} <= kinds
    assert {source for key, schemas in crd_schemas().items() for source, _ in schemas if key[1] == "HTTPRoute"} == {
        "gateway.networking.k8s.io_httproutes.v1.3.0.yaml", "gateway.networking.k8s.io_httproutes.v1.5.1.yaml"}
    for version in VERSIONS:
        assert validate_objects(objects, version) == [], version
    pickers = [d["spec"]["template"] for d in of_kind(objects, "Deployment") if d["metadata"]["name"].endswith("-epp")]
    for monitor in [m for m in of_kind(objects, "PodMonitor") if m["metadata"]["name"].endswith("-epp")]:
        selected = [p for p in pickers if monitor["spec"]["selector"]["matchLabels"].items() <= p["metadata"]["labels"].items()]
        assert len(selected) == 1
        assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in {p["name"] for p in selected[0]["spec"]["containers"][0]["ports"]}
    assert len([m for m in of_kind(objects, "PodMonitor") if m["metadata"]["name"].endswith("-epp")]) == len(plan.llms)


def test_custom_resource_validation_is_strict():
    """An unknown field, a missing required field and a value out of range are each reported."""
    case = next(c for c in CASES if c.router == "inference-gateway")
    objects = objects_of(regenerate.emit(case))
    pool = copy.deepcopy(of_kind(objects, "InferencePool")[0])
    pool["spec"]["endpointPickerRef"]["portNumber"] = 9002
    route = copy.deepcopy(of_kind(objects, "HTTPRoute")[0])
    del route["spec"]["rules"][0]["matches"][0]["path"]["value"]
    route["spec"]["rules"][0]["matches"][0]["headers"][0]["type"] = "Prefix"
    bad_name = copy.deepcopy(of_kind(objects, "InferencePool")[1])
    bad_name["metadata"]["name"] = "Not_A_Name"
    problems = [str(p) for p in validate_objects([pool, route, bad_name], newest_version())]
    assert any("portNumber" in p for p in problems)
    assert any("'Prefix' is not one of" in p for p in problems)
    assert any("Not_A_Name" in p and "metadata/name" in p for p in problems)
    assert all("inferencepools.v1.5.0" in p or "inferencepools.v1.6.0" in p or "httproutes" in p for p in problems)
    assert any("inferencepools.v1.6.0" in p for p in problems)
