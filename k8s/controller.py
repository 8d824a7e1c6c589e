"""The controller's own objects (`scepsy manifests --controller`): `scepsy control` running in the
cluster, in act mode `apply`, beside the plan it keeps right.

- ConfigMap `scepsy-controller`: the instance file, the profiles it names (under the same relative
  paths), the plan JSON that was deployed (the SLOs where the instance has none) and, if given,
  the policy's settings file; mounted read-only at /etc/scepsy/controller;
- ServiceAccount, Role and RoleBinding `scepsy-controller` in the namespace, and, for what is not
  in the namespace, a ClusterRole and ClusterRoleBinding `scepsy-controller-<namespace>` (Nodes,
  the plan's cluster-scoped objects) and a Role and RoleBinding in each other namespace the plan
  writes to (the device plugin's config with device-plugin-mps): least privilege, exactly the
  calls of the live apply (`controller_rules`);
- Lease `scepsy-controller` (coordination.k8s.io/v1): the replicas elect one leader on it
  (control/leader.py), so one controller acts at a time;
- Deployment `scepsy-controller`: two replicas (one leads, one stands by), `scepsy control` with
  the manifests' own engine, GPU sharing, router and image, `--leader-identity` the pod's name,
  /metrics and /healthz on port 9464 (the liveness probe reads /healthz).

What the live apply calls (control/act.py, k8s/apply.py, control/leader.py, control/fleet.py):
GET of every object of the plan (`changes` reads each before it decides to apply); server-side
apply (PATCH, and create where the object does not exist yet: the API server authorizes an apply
that creates as `create`, apiserver handlers/patch.go) of the kinds a change of placement rewrites
(engine Deployments, their PodDisruptionBudgets, the plan ConfigMap, the sharing ConfigMap or
resource claims); LIST of Deployments and Pods (labelled scepsy's), HorizontalPodAutoscalers and
KEDA ScaledObjects (autoscaler conflicts) and Nodes (lost nodes and GPUs); DELETE of Deployments;
GET and UPDATE of its Lease.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from scepsy.models.errors import InputError
from scepsy.models.inputs import read_text

from scepsy.k8s import names
from scepsy.k8s.plan_input import PlacedPlan

NAME = names.CONTROLLER
MOUNT = "/etc/scepsy/controller"
METRICS_PORT = 9464
LEASE_DURATION_S = 15  # client-go's default; control/leader.py uses the same
MAX_CONFIGMAP_BYTES = 1024 * 1024  # the API server's limit on a ConfigMap's data
# kinds a change of placement rewrites (applied, created), beside the GET of every object
REWRITTEN = ("Deployment", "PodDisruptionBudget", "ConfigMap", "ResourceClaim", "ResourceClaimTemplate")
PLURALS = {"PriorityClass": "priorityclasses"}


@dataclass(frozen=True)
class ControllerSettings:
    """What the controller's Deployment needs beyond the manifests' settings."""

    image: str  # an image with scepsy and its `k8s` and `control` extras
    prometheus_url: str
    prometheus_selector: str = ""
    settings_file: str | None = None  # the policy's knobs (checked by the caller)
    replicas: int = 2  # one leads, one stands by


def _plural(kind: str) -> str:
    return PLURALS.get(kind, kind.lower() + "s")


def _group(obj: dict) -> str:
    return obj["apiVersion"].rpartition("/")[0]


def _rule(group: str, resources: list[str], verbs: Iterable[str], names_: list[str] | None = None) -> dict:
    rule: dict = {"apiGroups": [group], "resources": sorted(resources), "verbs": sorted(set(verbs))}
    if names_:
        rule["resourceNames"] = sorted(names_)
    return rule


def controller_rules(objects: list[dict], namespace: str) -> dict[str | None, list[dict]]:
    """Namespace (None: cluster-scoped) -> the rules the live apply needs there (module docstring)."""
    verbs: dict[tuple[str | None, str, str], set[str]] = {}
    named: dict[tuple[str | None, str, str], set[str]] = {}
    for obj in objects:
        where = obj["metadata"].get("namespace")
        key = (where, _group(obj), _plural(obj["kind"]))
        wanted = verbs.setdefault(key, set())
        wanted.add("get")
        if obj["kind"] in REWRITTEN:
            wanted.update(("create", "patch"))
        named.setdefault(key, set()).add(obj["metadata"]["name"])
    own = {
        (namespace, "apps", "deployments"): {"get", "list", "create", "patch", "delete"},
        (namespace, "", "pods"): {"list"},
        (namespace, "", "configmaps"): {"get", "create", "patch"},
        (namespace, "autoscaling", "horizontalpodautoscalers"): {"list"},
        (namespace, "keda.sh", "scaledobjects"): {"list"},
        (None, "", "nodes"): {"list"},
    }
    for key, extra in own.items():
        verbs.setdefault(key, set()).update(extra)
    rules: dict[str | None, list[dict]] = {}
    for (where, group, plural), allowed in sorted(verbs.items(), key=lambda item: (item[0][0] or "", item[0][1], item[0][2])):
        # outside the controller's namespace only the plan's own objects, by name (nodes: all of them)
        restrict = sorted(named[(where, group, plural)]) if where != namespace and plural != "nodes" else None
        rules.setdefault(where, []).append(_rule(group, [plural], allowed, restrict))
    rules.setdefault(namespace, []).append(_rule("coordination.k8s.io", ["leases"], ("get", "update"), [NAME]))
    return rules


def _rbac(rules: dict[str | None, list[dict]], namespace: str) -> list[dict]:
    labels = names.labels(NAME, namespace, "controller")
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}]
    out: list[dict] = [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": namespace, "labels": labels}}]
    for where in sorted(rules, key=lambda w: (w is not None, w != namespace, w or "")):
        rbac = "rbac.authorization.k8s.io/v1"
        if where is None:
            meta = {"name": f"{NAME}-{namespace}", "labels": labels}
            out.append({"apiVersion": rbac, "kind": "ClusterRole", "metadata": meta, "rules": rules[where]})
            out.append({"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": meta, "subjects": subject,
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": meta["name"]}})
        else:
            meta = {"name": NAME if where == namespace else f"{NAME}-{namespace}", "namespace": where, "labels": labels}
            out.append({"apiVersion": rbac, "kind": "Role", "metadata": meta, "rules": rules[where]})
            out.append({"apiVersion": rbac, "kind": "RoleBinding", "metadata": meta, "subjects": subject,
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": meta["name"]}})
    return out


def _inputs(plan: PlacedPlan, settings: ControllerSettings) -> tuple[dict[str, str], list[dict]]:
    """The ConfigMap's data and the volume's items (key -> path under MOUNT)."""
    if plan.instance.source is None:
        raise InputError(plan.source, "instance", "the plan's instance was not read from a file",
                         "give the instance file (the controller mounts it and its profiles)")
    instance = Path(plan.instance.source)
    fix = "keep the instance file and its profiles readable"
    data = {"instance.yaml": read_text(instance, fix), "plan.json": json.dumps(plan.raw, sort_keys=True, separators=(",", ":"))}
    items = [{"key": "instance.yaml", "path": "instance.yaml"}, {"key": "plan.json", "path": "plan.json"}]
    profiles = sorted({llm.profile_path for llm in plan.instance.llms})
    for index, profile in enumerate(profiles):
        relative = os.path.relpath(profile, instance.parent)
        if relative.startswith(".."):
            raise InputError(str(instance), "llms.profile", f"profile {profile} is outside the instance's folder",
                             "keep the profiles in the instance file's folder or below it (the controller mounts them the same way)")
        key = f"profile-{index}.csv"
        data[key] = read_text(profile, fix)
        items.append({"key": key, "path": Path(relative).as_posix()})
    if settings.settings_file is not None:
        data["settings.yaml"] = read_text(settings.settings_file, "pass a readable `settings_file` of the policy's knobs")
        items.append({"key": "settings.yaml", "path": "settings.yaml"})
    size = sum(len(k.encode()) + len(v.encode()) for k, v in data.items())
    if size > MAX_CONFIGMAP_BYTES:
        raise InputError(str(instance), None, f"the instance, its profiles and the plan take {size} bytes, over a ConfigMap's {MAX_CONFIGMAP_BYTES}",
                         "trim the profiles to the GPU types and TP degrees of this cluster")
    return data, items


def _args(plan: PlacedPlan, engine: str, gpu_sharing: str, router: str, image: str | None, namespace: str,
          settings: ControllerSettings) -> list[str]:
    args = ["control", f"{MOUNT}/instance.yaml", "--plan", f"{MOUNT}/plan.json", "--prometheus-url", settings.prometheus_url,
            "--namespace", namespace, "--act", "apply", "--engine", engine, "--gpu-sharing", gpu_sharing, "--router", router,
            "--metrics-host", "0.0.0.0", "--metrics-port", str(METRICS_PORT), "--leader-identity", "$(POD_NAME)",
            "--log", "/var/log/scepsy/control.jsonl"]
    if image is not None:
        args += ["--image", image]
    if settings.prometheus_selector:
        args += ["--prometheus-selector", settings.prometheus_selector]
    if settings.settings_file is not None:
        args += ["--settings", f"{MOUNT}/settings.yaml"]
    return args


def _deployment(namespace: str, image: str, args: list[str], digest: str, replicas: int) -> dict:
    labels = names.labels(NAME, namespace, "controller")
    selector = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": "controller"}
    probe = {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 30, "timeoutSeconds": 5, "failureThreshold": 3}
    container = {
        "name": "controller",
        "image": image,
        "command": ["scepsy"],
        "args": args,
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "livenessProbe": probe,
        "readinessProbe": {**probe, "failureThreshold": 1},
        # CP-SAT re-plans on one core; the plan cache and the instance's profiles stay well under a GiB
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
        # the root filesystem is read-only: the decision log and /tmp (the kubernetes dynamic client's
        # discovery cache, tempfile.gettempdir()) are emptyDirs
        "volumeMounts": [{"name": "inputs", "mountPath": MOUNT, "readOnly": True},
                         {"name": "log", "mountPath": "/var/log/scepsy"}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {
                # a changed instance, profile, plan or setting rolls the pods (a ConfigMap's update alone does not)
                "metadata": {"labels": labels, "annotations": {"scepsy.io/inputs-sha256": digest}},
                "spec": {
                    "serviceAccountName": NAME,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [{"name": "inputs", "configMap": {"name": NAME, "items": []}},
                                {"name": "log", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def controller_objects(plan: PlacedPlan, objects: list[dict], namespace: str, engine: str, gpu_sharing: str, router: str,
                       image: str | None, settings: ControllerSettings) -> list[dict]:
    """The controller's objects for the plan whose manifests are `objects` (module docstring)."""
    labels = names.labels(NAME, namespace, "controller")
    data, items = _inputs(plan, settings)
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME, "namespace": namespace, "labels": labels}, "data": data}
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": NAME, "namespace": namespace, "labels": labels},
             "spec": {"leaseDurationSeconds": LEASE_DURATION_S}}
    deployment = _deployment(namespace, settings.image, _args(plan, engine, gpu_sharing, router, image, namespace, settings), digest,
                             settings.replicas)
    deployment["spec"]["template"]["spec"]["volumes"][0]["configMap"]["items"] = items
    return [*_rbac(controller_rules(objects, namespace), namespace), configmap, lease, deployment]
