"""A loopback stand-in for the part of the Kubernetes API that the SGLang gateway's service
discovery reads: LIST and WATCH of the pods of one namespace. The gateway is the real binary; this
is a test double of the API server (no kube-apiserver can run here: docs/deploy.md, "Testing
without a cluster"), and the test plays the kubelet by setting pod phases and readiness.

What the gateway's kube client sends (sglang-router 0.3.2 = kube-runtime 1.1.0 `watcher` with the
default config, observed): `GET /api/v1/namespaces/<ns>/pods?&limit=500` and then
`GET /api/v1/namespaces/<ns>/pods?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=<rv>`;
the watch answer is a chunked stream of JSON lines `{"type": "ADDED|MODIFIED|DELETED", "object": pod}`,
as the API server sends (Kubernetes API concepts, "Efficient detection of changes").

Pods go through what the kubelet and the API server would do: created Pending without an IP, then
Running with `podIP` and a `Ready` condition the test sets; `delete` sets `deletionTimestamp`
(the graceful deletion a `kubectl delete` or a Deployment scale-down starts: the pod keeps running
through its preStop hook and grace period) and `remove` ends it (the DELETED event).
"""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import yaml


def send_json(handler: BaseHTTPRequestHandler, code: int, body: dict) -> None:
    """One JSON answer of a loopback API double (Kubernetes, Prometheus), with its length: HTTP/1.1 keep-alive."""
    data = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class PodApi:
    def __init__(self, namespace: str):
        self.namespace = namespace
        self.pods: dict[str, dict] = {}
        self.events: list[tuple[int, str, dict]] = []  # (resourceVersion, type, pod)
        self.version = 1
        self.changed = threading.Condition()
        self.requests: list[str] = []
        self.closing = False
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> PodApi:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with self.changed:
            self.closing = True
            self.changed.notify_all()
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self, directory: Path) -> Path:
        """A kubeconfig whose current context is this API (what the gateway's client reads from
        KUBECONFIG; in a cluster it uses its ServiceAccount's in-cluster configuration)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "loopback", "cluster": {"server": self.url}}],
            "users": [{"name": "gateway", "user": {"token": "test"}}],
            "contexts": [{"name": "loopback", "context": {"cluster": "loopback", "user": "gateway", "namespace": self.namespace}}],
            "current-context": "loopback",
        }
        path = directory / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path

    # -- what the kubelet and the API server do ------------------------------------------------
    def _record(self, kind: str, pod: dict) -> None:
        with self.changed:
            self.version += 1
            pod["metadata"]["resourceVersion"] = str(self.version)
            self.events.append((self.version, kind, copy.deepcopy(pod)))
            self.changed.notify_all()

    def create(self, name: str, labels: dict[str, str]) -> None:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace, "labels": dict(labels), "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "engine", "image": "engine"}]},
            "status": {"phase": "Pending"},
        }
        self.pods[name] = pod
        self._record("ADDED", pod)

    def run(self, name: str, ip: str, ready: bool) -> None:
        """The pod's containers run at `ip`; `ready` is its readiness probe's verdict."""
        pod = self.pods[name]
        pod["status"] = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
        self._record("MODIFIED", pod)

    def delete(self, name: str) -> None:
        """Graceful deletion: the pod gets a deletionTimestamp and keeps running (preStop, grace)."""
        pod = self.pods[name]
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        pod["metadata"]["deletionGracePeriodSeconds"] = 640
        self._record("MODIFIED", pod)

    def remove(self, name: str) -> None:
        """The pod is gone (its containers ended)."""
        self._record("DELETED", self.pods.pop(name))

    # -- the HTTP side ---------------------------------------------------------------------------
    def _list(self) -> dict:
        with self.changed:
            items = [copy.deepcopy(p) for p in self.pods.values()]
            return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.version)}, "items": items}

    def _watch(self, handler: BaseHTTPRequestHandler, since: int, timeout_s: float) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        sent = since
        deadline_left = timeout_s
        while True:
            with self.changed:
                pending = [e for e in self.events if e[0] > sent]
                if not pending and not self.closing:
                    # the API server ends a watch after its timeoutSeconds; the client re-watches
                    if not self.changed.wait(timeout=min(deadline_left, 1.0)):
                        deadline_left -= 1.0
                        if deadline_left <= 0:
                            break
                        continue
                    pending = [e for e in self.events if e[0] > sent]
                if self.closing:
                    break
            for version, kind, pod in pending:
                line = json.dumps({"type": kind, "object": pod}).encode() + b"\n"
                try:
                    handler.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    handler.wfile.flush()
                except OSError:
                    return
                sent = version
        try:
            handler.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass

    def _handler(self):
        api = self
        prefix = f"/api/v1/namespaces/{self.namespace}/pods"

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):  # keep pytest output clean
                pass

            def _json(self, code: int, body: dict) -> None:
                send_json(self, code, body)

            def do_GET(self):
                url = urlparse(self.path)
                query = parse_qs(url.query)
                api.requests.append(self.path)
                if url.path != prefix:
                    return self._json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})
                if query.get("watch") in (["true"], ["1"]):
                    since = int(query.get("resourceVersion", ["0"])[0] or 0)
                    return api._watch(self, since, float(query.get("timeoutSeconds", ["290"])[0]))
                return self._json(200, api._list())

        return Handler
