"""Strict schema validation of emitted objects against their upstream schemas.

Built-in kinds: kubernetes-validate (the Kubernetes OpenAPI schemas), strict. An object whose
apiVersion does not exist in a target version (resource.k8s.io/v1 before 1.34) is reported as a
problem, so callers validate dra-mps output only against the versions it targets.

Custom resources with a vendored CustomResourceDefinition (k8s/crds, sources in k8s/crds/SOURCES:
InferencePool, HTTPRoute, Istio's DestinationRule): the `openAPIV3Schema` of every served version
of every vendored CRD of that kind (InferencePool: the extension's v1.5.0 and v1.6.0; HTTPRoute:
Gateway API v1.3.0 and v1.5.1), made as strict as kubernetes-validate's strict
mode (an object with declared properties and no `additionalProperties` or
`x-kubernetes-preserve-unknown-fields` admits no other field; `metadata` is checked for name,
namespace, labels and annotations), validated with jsonschema. CEL rules
(`x-kubernetes-validations`) are not evaluated here; the API server checks them.

kustomization.yaml (a kustomize file, not an API object) is skipped, as are PodMonitors
(prometheus-operator's CRD; tests/test_k8s_validate.py checks their fields against it) and GKE's
HealthCheckPolicy and GCPBackendPolicy (no public CRD; tests/test_k8s_validate.py checks them
against the upstream charts' templates).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError, latest_version

# kustomize files, prometheus-operator's custom resources (PodMonitor: its CRD schema, not the
# Kubernetes OpenAPI, defines it) and GKE's Gateway policies are not built-in kinds
NOT_BUILT_IN = ("kustomize.config.k8s.io", "monitoring.coreos.com", "networking.gke.io")


@dataclass(frozen=True)
class Problem:
    version: str
    kind: str
    name: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name} against {self.version}: {self.message}"


def newest_version() -> str:
    return latest_version()


def is_built_in(obj: dict) -> bool:
    group = obj.get("apiVersion", "").rpartition("/")[0]
    return group not in NOT_BUILT_IN


CRD_DIR = Path(__file__).resolve().parent / "crds"
_LABEL_KEY = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
_OBJECT_META = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
        "namespace": {"type": "string", "maxLength": 63, "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "labels": {"type": "object", "propertyNames": {"pattern": _LABEL_KEY},
                   "additionalProperties": {"type": "string", "maxLength": 63, "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"}},
        "annotations": {"type": "object", "propertyNames": {"pattern": _LABEL_KEY}, "additionalProperties": {"type": "string"}},
    },
}


def _strict(schema: object) -> object:
    """The schema with unknown fields refused wherever it declares its fields."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: (_strict(value) if key not in ("enum", "default", "example", "required") else value) for key, value in schema.items()}
    if "properties" in out:
        out["properties"] = {name: _strict(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    return out


# libyaml's safe loader where PyYAML has it (its wheels do): the vendored CRDs (1.2 MB) load in a tenth
# of the pure-Python loader's time
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def crd_schemas() -> dict[tuple[str, str], tuple[tuple[str, dict], ...]]:
    """(apiVersion, kind) -> ((source, strict schema), ...) for every served version of every vendored CRD."""
    found: dict[tuple[str, str], list[tuple[str, dict]]] = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=SAFE_LOADER)
        spec = crd["spec"]
        for version in spec["versions"]:
            if not version.get("served"):
                continue
            schema = _strict(version["schema"]["openAPIV3Schema"])
            assert isinstance(schema, dict)
            # every object's root has apiVersion, kind and metadata, whether the CRD declares them
            # (controller-gen's do; Istio's declare only spec and status) or not
            schema["properties"].setdefault("apiVersion", {"type": "string"})
            schema["properties"].setdefault("kind", {"type": "string"})
            schema["properties"]["metadata"] = _OBJECT_META
            schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata", "spec"})
            key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
            found.setdefault(key, []).append((path.name, schema))
    return {key: tuple(value) for key, value in found.items()}


def validate_custom_resource(obj: dict) -> list[Problem]:
    """Problems of a custom resource against every vendored CRD schema of its apiVersion and kind."""
    name = obj.get("metadata", {}).get("name", "?")
    schemas = crd_schemas().get((obj.get("apiVersion", ""), obj.get("kind", "")))
    if not schemas:
        return [Problem("crds", obj.get("kind", "?"), name, f"no vendored CustomResourceDefinition serves {obj.get('apiVersion')} {obj.get('kind')}")]
    problems = []
    for source, schema in schemas:
        for error in sorted(jsonschema.Draft7Validator(schema).iter_errors(obj), key=lambda e: list(e.absolute_path)):
            path = "/".join(str(p) for p in error.absolute_path)
            problems.append(Problem(source, obj["kind"], name, f"{path}: {error.message}"))
    return problems


def validate_objects(objects: list[dict], version: str) -> list[Problem]:
    problems = []
    for obj in objects:
        if (obj.get("apiVersion", ""), obj.get("kind", "")) in crd_schemas():
            problems += validate_custom_resource(obj)
            continue
        if not is_built_in(obj):
            continue
        name = obj.get("metadata", {}).get("name", "?")
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except ValidationError as exc:
            path = "/".join(str(p) for p in exc.path)
            problems.append(Problem(version, obj["kind"], name, f"{path}: {exc.message}"))
        except SchemaNotFoundError as exc:
            problems.append(Problem(version, obj["kind"], name, exc.message))
    return problems
