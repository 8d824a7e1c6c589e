"""The requests `scepsy deploy` sends, recorded by a loopback HTTP endpoint that answers like an
API server would for discovery, GET and server-side-apply PATCH.

No kube-apiserver can run here (docs/deploy.md, "Testing without a cluster"). This endpoint is not
a Kubernetes implementation: it stores what is applied and answers 404/200/201, so that the real
kubernetes client's wire behaviour can be checked: the apply content type, `fieldManager=scepsy`,
`force=true`, `dryRun=All`, the paths per kind, and the order. Like a real API server it refuses a
namespaced object whose Namespace does not exist: the NamespaceLifecycle admission plugin
(kubernetes `plugin/pkg/admission/namespace/lifecycle/admission.go`, on by default) answers 404
NotFound `namespaces "<ns>" not found`, so applying out of dependency order fails here too.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from typer.testing import CliRunner

from k8s_support import CASES, GOLDEN
from support.kube_pods import send_json

from scepsy.cli import app

DRA = GOLDEN / next(c for c in CASES if c.sharing == "dra-mps").name
DEVICE_PLUGIN = GOLDEN / next(c for c in CASES if c.sharing == "device-plugin-mps").name
INFERENCE_GATEWAY = GOLDEN / next(c for c in CASES if c.router == "inference-gateway").name

RESOURCES = {
    "v1": [("namespaces", "Namespace", False), ("configmaps", "ConfigMap", True), ("services", "Service", True), ("serviceaccounts", "ServiceAccount", True)],
    "apps/v1": [("deployments", "Deployment", True)],
    "rbac.authorization.k8s.io/v1": [("roles", "Role", True), ("rolebindings", "RoleBinding", True)],
    "resource.k8s.io/v1": [("resourceclaims", "ResourceClaim", True)],
    "scheduling.k8s.io/v1": [("priorityclasses", "PriorityClass", False)],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    "inference.networking.k8s.io/v1": [("inferencepools", "InferencePool", True)],
    "gateway.networking.k8s.io/v1": [("httproutes", "HTTPRoute", True)],
    "networking.istio.io/v1beta1": [("destinationrules", "DestinationRule", True)],
    "networking.gke.io/v1": [("healthcheckpolicies", "HealthCheckPolicy", True), ("gcpbackendpolicies", "GCPBackendPolicy", True)],
}


def _resource_list(group_version: str) -> dict:
    resources = [
        {"name": plural, "singularName": "", "namespaced": namespaced, "kind": kind, "verbs": ["get", "list", "patch", "create", "update", "delete"]}
        for plural, kind, namespaced in RESOURCES[group_version]
    ]
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}


class _Server(BaseHTTPRequestHandler):
    store: dict = {}
    patches: list = []

    def log_message(self, format, *args):  # keep pytest output clean
        pass

    def _send(self, code: int, body: dict) -> None:
        send_json(self, code, body)

    def do_GET(self):
        path = urlparse(self.path).path.rstrip("/")
        if path == "/version":
            version = {"major": "1", "minor": "34", "gitVersion": "v1.34.0", "gitCommit": "0", "gitTreeState": "clean"}
            version.update(buildDate="2026-01-01T00:00:00Z", goVersion="go1.24", compiler="gc", platform="linux/amd64")
            return self._send(200, version)
        if path == "/api":
            return self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        if path == "/apis":
            groups = []
            for gv in RESOURCES:
                if "/" in gv:
                    group, version = gv.split("/")
                    entry = {"groupVersion": gv, "version": version}
                    groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
            return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        for gv in RESOURCES:
            prefix = "/api/v1" if gv == "v1" else f"/apis/{gv}"
            if path == prefix:
                return self._send(200, _resource_list(gv))
        if path in self.store:
            return self._send(200, self.store[path])
        return self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})

    def do_PATCH(self):
        url = urlparse(self.path)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        obj = yaml.safe_load(body)
        query = parse_qs(url.query)
        self.patches.append((url.path, self.headers["Content-Type"], query, obj["kind"]))
        namespace = obj["metadata"].get("namespace")
        if namespace and f"/api/v1/namespaces/{namespace}" not in self.store:
            message = f'namespaces "{namespace}" not found'
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": "NotFound",
                      "details": {"name": namespace, "kind": "namespaces"}, "code": 404}
            return self._send(404, status)
        existed = url.path in self.store
        if "dryRun" not in query:
            stored = dict(obj, metadata=dict(obj["metadata"], resourceVersion=str(len(self.patches))))
            self.store[url.path] = stored
        return self._send(200 if existed else 201, self.store.get(url.path, obj))


@pytest.fixture()
def api_server(tmp_path):
    _Server.store, _Server.patches = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    kubeconfig.write_text(yaml.safe_dump(config))
    yield kubeconfig
    server.shutdown()


def test_deploy_sends_server_side_apply_in_dependency_order(api_server, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # the dynamic client caches discovery under ~/.kube
    runner = CliRunner()
    result = runner.invoke(app, ["deploy", str(DRA), "--kubeconfig", str(api_server), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    files = yaml.safe_load((DRA / "kustomization.yaml").read_text())["resources"]
    assert len(report["objects"]) == len(files)
    assert {o["action"] for o in report["objects"]} == {"created"}
    kinds = [p[3] for p in _Server.patches]
    assert kinds[0] == "Namespace" and kinds.index("ResourceClaim") < kinds.index("Deployment")
    for path, content_type, query, kind in _Server.patches:
        assert content_type == "application/apply-patch+yaml"
        assert query["fieldManager"] == ["scepsy"] and query["force"] == ["true"]
        assert "dryRun" not in query
    assert ("/apis/resource.k8s.io/v1/namespaces/scepsy/resourceclaims/gpus-h100-0") in [p[0] for p in _Server.patches]

    # again: nothing changed
    again = json.loads(runner.invoke(app, ["deploy", str(DRA), "--kubeconfig", str(api_server), "--json"]).output)
    assert {o["action"] for o in again["objects"]} == {"unchanged"}


def test_dry_run_sends_dry_run_all_and_stores_nothing(api_server, monkeypatch, tmp_path):
    """A server dry run stores nothing, not even the Namespace: on a cluster without the namespace
    it is refused with one line saying to create it first; with the namespace it validates all."""
    monkeypatch.setenv("HOME", str(tmp_path))
    refused = CliRunner().invoke(app, ["deploy", str(DRA), "--kubeconfig", str(api_server), "--dry-run", "server"])
    assert refused.exit_code == 2 and 'namespaces "scepsy" not found' in refused.output and "kubectl create namespace scepsy" in refused.output
    assert _Server.store == {}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "scepsy"}}
    _Server.store["/api/v1/namespaces/scepsy"] = namespace  # kubectl create namespace scepsy
    _Server.patches.clear()
    result = CliRunner().invoke(app, ["deploy", str(DRA), "--kubeconfig", str(api_server), "--dry-run", "server"])
    assert result.exit_code == 0, result.output
    assert "created (server dry run)" in result.output
    assert all(q["dryRun"] == ["All"] for _, _, q, _ in _Server.patches)
    assert _Server.store == {"/api/v1/namespaces/scepsy": namespace}


@pytest.mark.parametrize("directory", [DRA, DEVICE_PLUGIN, INFERENCE_GATEWAY], ids=lambda d: d.name)
def test_a_rendered_directory_applies_to_an_empty_cluster(api_server, monkeypatch, tmp_path, directory):
    """From empty, in dependency order: every namespace an object lives in is created first (the
    scepsy namespace and, for device-plugin-mps, the device plugin's), so nothing is refused."""
    monkeypatch.setenv("HOME", str(tmp_path))
    result = CliRunner().invoke(app, ["deploy", str(directory), "--kubeconfig", str(api_server), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert {o["action"] for o in report["objects"]} == {"created"}
    objects = [yaml.safe_load((directory / name).read_text()) for name in yaml.safe_load((directory / "kustomization.yaml").read_text())["resources"]]
    namespaces = {o["metadata"]["namespace"] for o in objects if "namespace" in o["metadata"]}
    assert namespaces <= {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    kinds = [p[3] for p in _Server.patches]
    assert kinds.index("RoleBinding") < kinds.index("Deployment") and kinds.index("ServiceAccount") < kinds.index("Deployment")


def test_the_endpoint_refuses_an_object_whose_namespace_does_not_exist(api_server, monkeypatch, tmp_path):
    """The check above can fail: without its Namespace, a namespaced object is refused (404)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    from scepsy.k8s.apply import KubeApplier, connect
    from scepsy.models.errors import InputError

    applier = KubeApplier(connect(api_server))
    configmap = yaml.safe_load((DEVICE_PLUGIN / "40-configmap-scepsy-device-plugin-config.yaml").read_text())
    with pytest.raises(InputError, match='refused ConfigMap/scepsy-device-plugin-config: namespaces "nvidia-device-plugin" not found'):
        applier.apply(configmap, dry_run=False)
