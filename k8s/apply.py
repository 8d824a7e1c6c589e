"""Apply a manifests directory with server-side apply, and report the replicas' pod status.

`deploy` reads the files that kustomization.yaml lists, orders the objects by dependency
(Namespace, RBAC, ConfigMaps, the controller's Lease, resource claims, Services, Deployments; file
order within a kind), and applies each with server-side apply (field manager `scepsy`, conflicts forced: scepsy owns
what it generated), optionally as a server-side dry run. Each object is classified:
    created     the object did not exist before;
    configured  it existed and the applied result differs from it;
    unchanged   it existed and the result equals it (ignoring server-managed metadata and status).
The API calls go through an `Applier` (get, apply); `KubeApplier` is the official kubernetes client
(dynamic client); without a reachable cluster `connect` raises an `InputError` (exit code 2).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from scepsy.models.errors import InputError
from scepsy.models.inputs import kind_of, load_yaml, load_yaml_documents

FIELD_MANAGER = "scepsy"
APPLY_ORDER = (
    "Namespace",
    "PriorityClass",
    "ServiceAccount",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Lease",  # before the controller's Deployment: its RBAC lets it update the Lease, not create it
    "ResourceClaimTemplate",
    "ResourceClaim",
    "Service",
    "Deployment",
    "PodDisruptionBudget",
    "PodMonitor",
    "InferencePool",
    "HTTPRoute",
    "DestinationRule",
    "HealthCheckPolicy",
    "GCPBackendPolicy",
)
DRY_RUN_MODES = ("none", "server")
# metadata the API server writes; never part of "did the object change"
_SERVER_METADATA = ("resourceVersion", "managedFields", "generation", "creationTimestamp", "uid", "selfLink")


@dataclass(frozen=True)
class ApplyResult:
    kind: str
    namespace: str | None
    name: str
    action: str  # created | configured | unchanged

    @property
    def ref(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind.lower()}/{where}{self.name}"


class Applier(Protocol):
    def get(self, obj: dict) -> dict | None: ...

    def apply(self, obj: dict, dry_run: bool) -> dict: ...


def load_manifests(directory: Path) -> list[dict]:
    """The objects of the files kustomization.yaml lists, in listed order."""
    fix = "pass a directory written by `scepsy manifests --out`"
    if kind_of(directory) != "dir":
        raise InputError(str(directory), None, "directory not found" if kind_of(directory) == "missing" else "not a directory", fix)
    kustomization = directory / "kustomization.yaml"
    listing = load_yaml(kustomization, fix)
    resources = listing.get("resources") if isinstance(listing, dict) else None
    if not isinstance(resources, list) or not resources:
        raise InputError(str(kustomization), "resources", "missing or empty list", "regenerate the directory with `scepsy manifests`")
    objects = []
    for name in resources:
        path = directory / str(name)
        if kind_of(path) == "missing":
            raise InputError(str(kustomization), "resources", f"listed file {name} is missing", "regenerate the directory with `scepsy manifests`")
        docs = load_yaml_documents(path, "regenerate the directory with `scepsy manifests`")
        for doc in docs:
            if doc is None:
                continue
            if not isinstance(doc, dict) or not {"apiVersion", "kind", "metadata"} <= set(doc):
                raise InputError(str(path), None, "not a Kubernetes object", "regenerate the directory with `scepsy manifests`")
            objects.append(doc)
    return objects


def apply_order(objects: list[dict]) -> list[dict]:
    """Dependency order; a stable sort keeps the file order within a kind."""
    rank = {kind: i for i, kind in enumerate(APPLY_ORDER)}
    return sorted(objects, key=lambda o: rank.get(o["kind"], len(APPLY_ORDER)))


def comparable(obj: dict) -> dict:
    """The object without server-managed metadata and status."""
    out = {k: v for k, v in obj.items() if k != "status"}
    metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in _SERVER_METADATA}
    out["metadata"] = metadata
    return out


def classify(before: dict | None, after: dict, dry_run: bool = False) -> str:
    if before is None:
        return "created"
    # a real write bumps resourceVersion, a no-op apply does not; a dry run never writes
    version = before.get("metadata", {}).get("resourceVersion")
    if not dry_run and version is not None and version == after.get("metadata", {}).get("resourceVersion"):
        return "unchanged"
    return "unchanged" if comparable(before) == comparable(after) else "configured"


def deploy(objects: list[dict], applier: Applier, dry_run: bool = False) -> list[ApplyResult]:
    results = []
    for obj in apply_order(objects):
        before = applier.get(obj)
        after = applier.apply(obj, dry_run)
        meta = obj["metadata"]
        results.append(ApplyResult(obj["kind"], meta.get("namespace"), meta["name"], classify(before, after, dry_run)))
    return results


class KubeApplier:
    """Server-side apply through the official client's dynamic client."""

    def __init__(self, api_client, timeout_s: float | None = None):
        from kubernetes.dynamic import DynamicClient

        self.client = DynamicClient(api_client)
        self.timeout_s = timeout_s  # per request; None: the client's (no) timeout

    def _timeout(self) -> dict:
        return {"_request_timeout": self.timeout_s} if self.timeout_s is not None else {}

    def _resource(self, obj: dict):
        from kubernetes.dynamic.exceptions import ResourceNotFoundError

        try:
            return self.client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        except ResourceNotFoundError:
            raise InputError(
                None,
                None,
                f"the cluster does not serve {obj['kind']} in {obj['apiVersion']}",
                "install the GPU sharing stack the manifests were made for (docs/deploy.md), or regenerate them with `kubernetes_version` of this cluster",
            ) from None

    def get(self, obj: dict) -> dict | None:
        from kubernetes.dynamic.exceptions import NotFoundError

        meta = obj["metadata"]
        try:
            return self._resource(obj).get(name=meta["name"], namespace=meta.get("namespace"), **self._timeout()).to_dict()
        except NotFoundError:
            return None

    def apply(self, obj: dict, dry_run: bool) -> dict:
        meta = obj["metadata"]
        kwargs = {"field_manager": FIELD_MANAGER, "force_conflicts": True, **self._timeout()}
        if dry_run:
            kwargs["dry_run"] = "All"
        from kubernetes.dynamic.exceptions import DynamicApiError

        try:
            result = self.client.server_side_apply(self._resource(obj), body=obj, name=meta["name"], namespace=meta.get("namespace"), **kwargs)
        except DynamicApiError as exc:
            raise InputError(None, None, f"the API server refused {obj['kind']}/{meta['name']}: {_status_message(exc)}", _refusal_fix(obj, dry_run)) from None
        return result.to_dict()


def _status_message(exc) -> str:
    """The message of the API server's Status answer, else the HTTP reason."""
    import json

    try:
        return str(json.loads(exc.body)["message"])
    except (TypeError, ValueError, KeyError):
        return f"{exc.status} {exc.reason}"


def _refusal_fix(obj: dict, dry_run: bool) -> str:
    namespace = obj["metadata"].get("namespace")
    if dry_run and namespace:
        # a server-side dry run stores nothing, so the Namespace it "created" does not exist for the next object
        return f"a server dry run cannot create namespaces: create {namespace} first (kubectl create namespace {namespace}) and run again"
    return "check the object against the cluster's admission policies and API versions (`scepsy deploy --dry-run server` shows each refusal)"


def _load_config(kubeconfig: Path | None, context: str | None):
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    if kubeconfig is not None:
        parsed = load_yaml(kubeconfig, "pass `kubeconfig`, a kubeconfig file (kubectl config view --raw)")
        if not isinstance(parsed, dict):
            raise InputError(str(kubeconfig), None, "not a kubeconfig (no YAML mapping)", "pass `kubeconfig`, a kubeconfig file")
    try:
        return config.new_client_from_config(config_file=str(kubeconfig) if kubeconfig else None, context=context)
    except ConfigException as exc:
        problem = str(exc)
    except Exception as exc:  # noqa: BLE001 - the client's loader fails in many ways on a garbled file
        problem = f"cannot read it ({type(exc).__name__}: {exc})"
    if kubeconfig is None and context is None:
        try:  # running inside a pod: its service account
            config.load_incluster_config()
            return client.ApiClient()
        except ConfigException:
            pass
    raise InputError(
        str(kubeconfig) if kubeconfig else "kubeconfig",
        f"context {context}" if context else None,
        f"no usable cluster configuration: {problem}",
        "pass `kubeconfig` (and `context`) of a reachable cluster",
    )


def connect(kubeconfig: Path | None = None, context: str | None = None, timeout_s: float = 5.0):
    """An ApiClient for the kubeconfig/context, checked to reach its API server (exit 2 if not)."""
    with warnings.catch_warnings():  # the client's deprecation notes would break the one-line answer
        warnings.simplefilter("ignore")
        return _connect(kubeconfig, context, timeout_s)


def _connect(kubeconfig: Path | None, context: str | None, timeout_s: float):
    from kubernetes import client

    api_client = _load_config(kubeconfig, context)
    try:
        client.VersionApi(api_client).get_code(_request_timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - any transport or API failure means: no usable cluster
        host = api_client.configuration.host
        reason = getattr(exc, "reason", None) or type(exc).__name__
        raise InputError(
            str(kubeconfig) if kubeconfig else "kubeconfig",
            f"context {context}" if context else None,
            f"cannot reach the Kubernetes API server at {host} ({reason})",
            "check that the cluster is up and that `kubeconfig` and `context` point at it",
        ) from None
    return api_client


@dataclass(frozen=True)
class ReplicaStatus:
    deployment: str
    llm: str | None
    replica: str | None
    workflow: str | None
    node: str | None
    phase: str  # pod phase, or "NoPod"
    ready: bool
    restarts: int
    unschedulable: bool = False  # Pending, and the scheduler says no node can take it (PodScheduled False: Unschedulable)


def pod_statuses(api_client, namespace: str) -> list[ReplicaStatus]:
    from kubernetes import client

    pods = client.CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector="app.kubernetes.io/managed-by=scepsy")
    deployments = client.AppsV1Api(api_client).list_namespaced_deployment(namespace, label_selector="app.kubernetes.io/managed-by=scepsy")
    return summarize([d.to_dict() for d in deployments.items], [p.to_dict() for p in pods.items])


def _workflows(labels: dict[str, str]) -> str | None:
    """The workflows a Deployment serves: its membership labels `workflow.scepsy.io/<name>`."""
    members = sorted(key.split("/", 1)[1] for key in labels if key.startswith("workflow.scepsy.io/"))
    return ",".join(members) or labels.get("scepsy.io/workflow")


def summarize(deployments: list[dict], pods: list[dict]) -> list[ReplicaStatus]:
    """One row per scepsy Deployment: its pod's phase and readiness (the newest pod if several)."""
    rows = []
    for deployment in sorted(deployments, key=lambda d: d["metadata"]["name"]):
        labels = deployment["metadata"].get("labels") or {}
        selector = deployment["spec"]["selector"].get("match_labels") or deployment["spec"]["selector"].get("matchLabels") or {}
        matching = [p for p in pods if selector.items() <= (p["metadata"].get("labels") or {}).items()]
        matching.sort(key=lambda p: str(p["metadata"].get("creation_timestamp") or p["metadata"].get("creationTimestamp") or ""))
        name = deployment["metadata"]["name"]
        llm, replica, workflow = labels.get("scepsy.io/llm"), labels.get("scepsy.io/replica"), _workflows(labels)
        if not matching:
            rows.append(ReplicaStatus(name, llm, replica, workflow, None, "NoPod", False, 0))
            continue
        pod = matching[-1]
        status = pod.get("status") or {}
        containers = status.get("container_statuses") or status.get("containerStatuses") or []
        ready = bool(containers) and all(c.get("ready") for c in containers)
        restarts = sum(c.get("restart_count") or c.get("restartCount") or 0 for c in containers)
        node = (pod.get("spec") or {}).get("node_name") or (pod.get("spec") or {}).get("nodeName")
        rows.append(ReplicaStatus(name, llm, replica, workflow, node, status.get("phase") or "Unknown", ready, restarts,
                                  _unschedulable(status)))
    return rows


def _unschedulable(status: dict) -> bool:
    """The pod waits for a node the scheduler cannot find (its PodScheduled condition is False with
    reason Unschedulable: no node has the resources, e.g. Insufficient nvidia.com/gpu)."""
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in status.get("conditions") or [])


def status_table(rows: list[ReplicaStatus], namespace: str):
    """The replicas' pod phase and readiness as a readable table (rich)."""
    from rich.table import Table

    table = Table(title=f"scepsy deployments in {namespace}")
    for column in ("deployment", "llm", "replica", "workflow", "node", "phase", "ready", "restarts"):
        table.add_column(column)
    for r in rows:
        table.add_row(r.deployment, r.llm or "-", r.replica or "-", r.workflow or "-", r.node or "-", r.phase,
                      "yes" if r.ready else "no", str(r.restarts))
    return table
