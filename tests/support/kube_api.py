"""A loopback stand-in for the part of the Kubernetes API the controller uses, for the real
kubernetes client: discovery, GET, LIST (with label selectors), server-side apply PATCH and DELETE
of namespaced objects, and the Deployment controller's and kubelet's part the test plays.

No kube-apiserver can run here (docs/deploy.md, "Testing without a cluster"). This double is not a
Kubernetes implementation: it stores what is applied, answers 200/201/404 with `Status` bodies as
the API server does, and:
- creates one Pending, not-Ready pod for each applied Deployment (the Deployment and ReplicaSet
  controllers; the manifests' engine Deployments have one replica), which the test makes Ready with
  `ready(deployment)` (the kubelet's readiness probe);
- on DELETE of a Deployment removes it at once and gives its pod a deletionTimestamp (background
  propagation: the pod drains through its preStop hook); `drained(deployment)` removes the pod;
- refuses the applies the test names (`refuse`: 422 Invalid, as admission would) and leaves the
  applies unanswered while `hang` is set (the client times out);
- records every write and readiness change in `events`, in order, for the tests to check, and
  every request to a resource as (verb, API group, resource, namespace) in `requests` (RBAC's view
  of it: GET of a collection is `list`, PATCH `patch`, POST `create`, PUT `update`);
- creates (POST) and replaces (PUT, with the resourceVersion check: 409 Conflict on a stale one)
  objects, which the leader election's Lease needs.
"""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import yaml

from support.kube_pods import send_json

# group/version -> (plural, kind, namespaced)
RESOURCES: dict[str, list[tuple[str, str, bool]]] = {
    "v1": [("namespaces", "Namespace", False), ("configmaps", "ConfigMap", True), ("services", "Service", True),
           ("serviceaccounts", "ServiceAccount", True), ("pods", "Pod", True), ("secrets", "Secret", True),
           ("nodes", "Node", False)],
    "apps/v1": [("deployments", "Deployment", True)],
    "rbac.authorization.k8s.io/v1": [("roles", "Role", True), ("rolebindings", "RoleBinding", True)],
    "resource.k8s.io/v1": [("resourceclaims", "ResourceClaim", True), ("resourceclaimtemplates", "ResourceClaimTemplate", True)],
    "scheduling.k8s.io/v1": [("priorityclasses", "PriorityClass", False)],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    "autoscaling/v2": [("horizontalpodautoscalers", "HorizontalPodAutoscaler", True)],
    "keda.sh/v1alpha1": [("scaledobjects", "ScaledObject", True)],
    "coordination.k8s.io/v1": [("leases", "Lease", True)],
}
PLURALS = {kind: (gv, plural, namespaced) for gv, rows in RESOURCES.items() for plural, kind, namespaced in rows}


def _prefix(group_version: str) -> str:
    return "/api/v1" if group_version == "v1" else f"/apis/{group_version}"


def path_of(kind: str, name: str, namespace: str | None) -> str:
    gv, plural, namespaced = PLURALS[kind]
    where = f"/namespaces/{namespace}" if namespaced else ""
    return f"{_prefix(gv)}{where}/{plural}/{name}"


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}


def _matches(labels: dict, selector: str | None) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class KubeApi:
    def __init__(self, namespace: str, keda: bool = True):
        self.namespace = namespace
        self.keda = keda
        self.store: dict[str, dict] = {}
        self.events: list[tuple] = []
        self.requests: list[tuple[str, str, str, str | None]] = []
        self.refuse: set[tuple[str, str]] = set()  # (kind, name) whose apply admission refuses
        self.hang = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.version = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> KubeApi:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self, directory: Path) -> Path:
        config = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "loopback", "cluster": {"server": self.url}}],
            "users": [{"name": "controller", "user": {"token": "test"}}],
            "contexts": [{"name": "loopback", "context": {"cluster": "loopback", "user": "controller"}}],
            "current-context": "loopback",
        }
        path = directory / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path

    # -- what the test and the cluster's controllers do ----------------------------------------

    def _stamp(self, obj: dict) -> dict:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        obj["metadata"].setdefault("uid", f"uid-{obj['kind']}-{obj['metadata']['name']}")
        obj["metadata"].setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        return obj

    def put(self, obj: dict) -> None:
        """Store an object as if created by someone else (kubectl): a Deployment gets its pod."""
        with self.lock:
            self._put(copy.deepcopy(obj))

    def _put(self, obj: dict) -> None:
        meta = obj["metadata"]
        self.store[path_of(obj["kind"], meta["name"], meta.get("namespace"))] = self._stamp(obj)
        if obj["kind"] == "Deployment":
            self._pod_for(obj)

    def _pod_for(self, deployment: dict) -> None:
        name = deployment["metadata"]["name"]
        template = deployment["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{name}-pod", "namespace": deployment["metadata"]["namespace"],
                            "labels": dict(template["metadata"]["labels"])},
               "spec": copy.deepcopy(template["spec"]),
               "status": {"phase": "Pending"}}
        path = path_of("Pod", pod["metadata"]["name"], self.namespace)
        old = self.store.get(path)
        if old is None or old["spec"] != pod["spec"]:  # a changed template replaces the pod (Recreate)
            self.store[path] = self._stamp(pod)

    def ready(self, deployment: str, ready: bool = True) -> None:
        """The pod of the Deployment runs and its readiness probe passes (or fails)."""
        with self.lock:
            pod = self.store[path_of("Pod", f"{deployment}-pod", self.namespace)]
            pod["status"] = {"phase": "Running", "podIP": "10.0.0.1",
                             "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                             "containerStatuses": [{"name": "engine", "ready": ready, "restartCount": 0, "image": "engine",
                                                    "imageID": "", "started": True}]}
            self.events.append(("ready" if ready else "not ready", deployment))

    def drained(self, deployment: str) -> None:
        """The deleted pod's preStop hook returned and its containers ended."""
        with self.lock:
            self.store.pop(path_of("Pod", f"{deployment}-pod", self.namespace), None)
            self.events.append(("gone", deployment))

    def objects(self, kind: str) -> dict[str, dict]:
        with self.lock:
            return {o["metadata"]["name"]: copy.deepcopy(o) for o in self.store.values() if o["kind"] == kind}

    def pod(self, deployment: str) -> dict | None:
        with self.lock:
            found = self.store.get(path_of("Pod", f"{deployment}-pod", self.namespace))
            return copy.deepcopy(found) if found else None

    # -- the HTTP side ---------------------------------------------------------------------------

    def _record(self, method: str, path: str) -> None:
        """RBAC's (verb, group, resource, namespace) of a request to a resource path."""
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "v1"]:
            group, rest = "", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, rest = parts[1], parts[3:]
        else:
            return
        namespace = None
        if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
            namespace, rest = rest[1], rest[2:]
        if not rest:
            return
        collection = len(rest) == 1
        verb = {"GET": "list" if collection else "get", "PATCH": "patch", "POST": "create", "PUT": "update", "DELETE": "delete"}[method]
        with self.lock:
            self.requests.append((verb, group, rest[0], namespace))

    def _list(self, prefix: str, query: dict) -> dict | None:
        for gv, rows in RESOURCES.items():
            for plural, kind, namespaced in rows:
                if prefix in (f"{_prefix(gv)}/namespaces/{self.namespace}/{plural}", f"{_prefix(gv)}/{plural}"):
                    if kind == "ScaledObject" and not self.keda:
                        return None
                    selector = query.get("labelSelector", [None])[0]
                    items = [copy.deepcopy(o) for o in self.store.values()
                             if o["kind"] == kind and _matches(o["metadata"].get("labels") or {}, selector)]
                    items.sort(key=lambda o: o["metadata"]["name"])
                    return {"apiVersion": gv, "kind": f"{kind}List", "metadata": {"resourceVersion": str(self.version)}, "items": items}
        return None

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):
                pass

            def _send(self, code: int, body: dict) -> None:
                send_json(self, code, body)

            def do_GET(self):
                url = urlparse(self.path)
                path = url.path.rstrip("/")
                api._record("GET", path)
                if path == "/version":
                    return self._send(200, {"major": "1", "minor": "34", "gitVersion": "v1.34.0", "gitCommit": "0", "gitTreeState": "clean",
                                            "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"})
                if path == "/api":
                    return self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
                if path == "/apis":
                    groups = []
                    for gv in RESOURCES:
                        if "/" in gv and (api.keda or not gv.startswith("keda.sh")):
                            group, version = gv.split("/")
                            entry = {"groupVersion": gv, "version": version}
                            groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
                    return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
                for gv, rows in RESOURCES.items():
                    if path == _prefix(gv) and (api.keda or not gv.startswith("keda.sh")):
                        resources = [{"name": plural, "singularName": "", "namespaced": namespaced, "kind": kind,
                                      "verbs": ["get", "list", "patch", "create", "update", "delete"]} for plural, kind, namespaced in rows]
                        return self._send(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
                with api.lock:
                    listed = api._list(path, parse_qs(url.query))
                    if listed is not None:
                        return self._send(200, listed)
                    if path in api.store:
                        return self._send(200, copy.deepcopy(api.store[path]))
                return self._send(404, _status(404, "NotFound", f"{path} not found"))

            def do_PATCH(self):
                url = urlparse(self.path)
                api._record("PATCH", url.path)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                obj: dict = yaml.safe_load(body)
                kind, name = obj["kind"], obj["metadata"]["name"]
                if api.hang.is_set():
                    api.release.wait()
                    return
                if (kind, name) in api.refuse:
                    with api.lock:
                        api.events.append(("refused", kind, name))
                    return self._send(422, _status(422, "Invalid", f'{kind} "{name}" is invalid: refused by admission'))
                dry = "dryRun" in parse_qs(url.query)
                with api.lock:
                    existed = url.path in api.store
                if not existed:  # the API server authorizes an apply that creates as `create` too
                    api._record("POST", url.path.rsplit("/", 1)[0])
                with api.lock:
                    if not dry:
                        api._put(copy.deepcopy(obj))
                        api.events.append(("apply", kind, name))
                    answer = copy.deepcopy(api.store.get(url.path, obj))
                return self._send(200 if existed else 201, answer)

            def do_POST(self):
                path = urlparse(self.path).path.rstrip("/")
                api._record("POST", path)
                obj: dict = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                meta = obj.setdefault("metadata", {})
                meta.setdefault("namespace", path.split("/namespaces/")[1].split("/")[0] if "/namespaces/" in path else None)
                obj.setdefault("kind", next(k for k, (gv, plural, _) in PLURALS.items() if path.endswith("/" + plural)))
                with api.lock:
                    target = path_of(obj["kind"], meta["name"], meta.get("namespace"))
                    if target in api.store:
                        return self._send(409, _status(409, "AlreadyExists", f"{target} already exists"))
                    api._put(obj)
                    api.events.append(("create", obj["kind"], meta["name"]))
                    return self._send(201, copy.deepcopy(api.store[target]))

            def do_PUT(self):
                path = urlparse(self.path).path.rstrip("/")
                api._record("PUT", path)
                obj: dict = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with api.lock:
                    live = api.store.get(path)
                    if live is None:
                        return self._send(404, _status(404, "NotFound", f"{path} not found"))
                    version = (obj.get("metadata") or {}).get("resourceVersion")
                    if version is not None and version != live["metadata"]["resourceVersion"]:
                        return self._send(409, _status(409, "Conflict", "the object has been modified; please apply your changes to the latest version"))
                    obj.setdefault("kind", live["kind"])
                    obj.setdefault("apiVersion", live["apiVersion"])
                    api._put(obj)
                    api.events.append(("update", obj["kind"], obj["metadata"]["name"]))
                    return self._send(200, copy.deepcopy(api.store[path]))

            def do_DELETE(self):
                path = urlparse(self.path).path
                api._record("DELETE", path)
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                with api.lock:
                    obj = api.store.pop(path, None)
                    if obj is None:
                        return self._send(404, _status(404, "NotFound", f"{path} not found"))
                    name = obj["metadata"]["name"]
                    api.events.append(("delete", obj["kind"], name))
                    if obj["kind"] == "Deployment":
                        pod = api.store.get(path_of("Pod", f"{name}-pod", api.namespace))
                        if pod is not None:
                            pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:10:00Z"
                            pod["metadata"]["deletionGracePeriodSeconds"] = 640
                return self._send(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200})

        return Handler


def node_object(name: str, ready: str = "True", capacity: int = 4, allocatable: int = 4, unschedulable: bool | None = None) -> dict:
    """A GPU Node as the API server sends it: the kubernetes client's model (V1Node), serialized by
    the client (camelCase, as on the wire); `capacity` and `allocatable` count `nvidia.com/gpu`."""
    from kubernetes import client

    reason = {"True": "KubeletReady", "False": "KubeletNotReady"}.get(ready, "NodeStatusUnknown")
    node = client.V1Node(
        api_version="v1", kind="Node",
        metadata=client.V1ObjectMeta(name=name, labels={"kubernetes.io/hostname": name, "nvidia.com/gpu.product": "NVIDIA-RTX-A6000"}),
        spec=client.V1NodeSpec(unschedulable=unschedulable),
        status=client.V1NodeStatus(
            capacity={"cpu": "64", "memory": "515884Mi", "nvidia.com/gpu": str(capacity)},
            allocatable={"cpu": "63500m", "memory": "513836Mi", "nvidia.com/gpu": str(allocatable)},
            conditions=[client.V1NodeCondition(type="Ready", status=ready, reason=reason, message="")]))
    wire = client.ApiClient().sanitize_for_serialization(node)
    assert isinstance(wire, dict)
    return wire


def dump_events(events: list[tuple]) -> str:
    return json.dumps(events)
