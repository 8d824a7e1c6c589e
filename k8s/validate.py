"""Strict schema validation of emitted objects with kubernetes-validate (the upstream OpenAPI schemas).

Only built-in kinds are validated: kustomization.yaml (a kustomize file, not an API object) is
skipped, as is anything whose apiVersion group is not served by Kubernetes itself. An object whose
apiVersion does not exist in a target version (resource.k8s.io/v1 before 1.34) is reported as a
problem, so callers validate dra-mps output only against the versions it targets.
"""

from __future__ import annotations

from dataclasses import dataclass

import kubernetes_validate
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError, latest_version

# kustomize files and prometheus-operator's custom resources (PodMonitor: its CRD schema, not the
# Kubernetes OpenAPI, defines it) are not built-in kinds
NOT_BUILT_IN = ("kustomize.config.k8s.io", "monitoring.coreos.com")


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


def validate_objects(objects: list[dict], version: str) -> list[Problem]:
    problems = []
    for obj in objects:
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
