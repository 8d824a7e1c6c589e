"""The controller's own endpoints: `GET /metrics` (prometheus_client) and `GET /healthz`, served in
every act mode, and its decisions as Prometheus gauges, for clusters that actuate through KEDA.

Every mode serves

    scepsy_decisions_total{action}                 decisions by action (keep, replan, hold)
    scepsy_observation_missing{llm}                1 while the LLM's rate could not be read
    scepsy_last_period_timestamp_seconds           when the last period ended (Unix time)
    scepsy_leader                                  1 while this controller holds the Lease (or
                                                   runs without leader election), 0 on standby

and `/healthz` answers 200 `ok` (or `standby`, while another controller holds the Lease) while the
last period ended (or the controller started) less than `stale_after_s` ago, else 503 `stale`:
a loop stuck on an API call that never returns fails its liveness probe and is restarted.

With `act` "gauges" the controller changes nothing itself and also serves

    scepsy_desired_replicas{llm}                   replicas of the LLM in the target plan
    scepsy_desired_replica{llm, deployment, node}  1 for each engine Deployment of the target plan,
                                                   0 for one that runs and should go

Each engine Deployment is one replica (`<llm>-r<k>`, one pod, pinned to its planned GPUs), so a
KEDA ScaledObject per Deployment with `minReplicaCount: 0`, `maxReplicaCount: 1` and a
`prometheus` trigger on `scepsy_desired_replica{deployment="<llm>-r<k>"}` (threshold 1) starts and
stops exactly the replicas of the target plan. The Deployments of a new plan must exist (`scepsy
manifests` of it applied with `replicas: 0`) for KEDA to scale them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from scepsy.k8s import names
from scepsy.models.instance.allocation import Placement


class DesiredGauges:
    """The gauges of one controller (its own registry)."""

    def __init__(self, clock: Callable[[], float] | None = None, stale_after_s: float = 600.0) -> None:
        self.clock = clock or time.time
        self.stale_after_s = stale_after_s  # the deployment sets three periods (a period may wait on retries)
        self.alive_s = self.clock()
        self.standby = False
        self._server: WSGIServer | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        self.replicas = Gauge("scepsy_desired_replicas", "Replicas of the LLM in the target plan.", ["llm"], registry=self.registry)
        self.replica = Gauge("scepsy_desired_replica", "1 for an engine Deployment of the target plan, 0 for one that should go.",
                             ["llm", "deployment", "node"], registry=self.registry)
        self.decisions = Counter("scepsy_decisions", "Controller decisions by action.", ["action"], registry=self.registry)
        self.missing = Gauge("scepsy_observation_missing", "1 while the LLM's request rate could not be read.", ["llm"],
                             registry=self.registry)
        self.last_period = Gauge("scepsy_last_period_timestamp_seconds", "When the controller's last period ended (Unix time).",
                                 registry=self.registry)
        self.leader = Gauge("scepsy_leader", "1 while this controller holds the Lease (or runs without one), 0 on standby.",
                            registry=self.registry)
        self.leader.set(1)

    def publish(self, target: Placement, running: Iterable[tuple[str, str, str]] = ()) -> None:
        """Set the gauges to the target placement; `running` (llm, deployment, node) of replicas
        that run now and are not in the target read 0."""
        counts: dict[str, int] = {}
        wanted = set()
        for r in target.replicas:
            counts[r.llm] = counts.get(r.llm, 0) + 1
            deployment = names.engine_deployment(r.llm, r.replica)
            wanted.add(deployment)
            self.replica.labels(r.llm, deployment, r.node).set(1)
        for llm, deployment, node in running:
            if deployment not in wanted:
                self.replica.labels(llm, deployment, node).set(0)
                counts.setdefault(llm, 0)
        for llm, count in counts.items():
            self.replicas.labels(llm).set(count)

    def observed(self, missing: Mapping[str, bool]) -> None:
        for llm, flag in missing.items():
            self.missing.labels(llm).set(1 if flag else 0)

    def decided(self, action: str) -> None:
        self.decisions.labels(action).inc()

    def period_done(self) -> None:
        """A period ended: the loop is alive."""
        self.alive_s = self.clock()
        self.last_period.set(self.alive_s)

    def leading(self, flag: bool) -> None:
        """Whether this controller holds the Lease (a standby is alive while it waits)."""
        self.standby = not flag
        self.leader.set(1 if flag else 0)
        self.alive_s = self.clock()

    def waiting(self) -> None:
        """A standby tried the Lease: alive, not leading."""
        self.alive_s = self.clock()

    def health(self) -> tuple[int, str]:
        """The /healthz status and text (module docstring)."""
        if self.clock() - self.alive_s >= self.stale_after_s:
            return 503, "stale"
        return 200, "standby" if self.standby else "ok"

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def app(self, environ: dict, start_response: Callable) -> Iterator[bytes]:
        """The WSGI application of /metrics and /healthz."""
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            status, body, kind = 200, self.exposition(), CONTENT_TYPE_LATEST
        elif path == "/healthz":
            code, text = self.health()
            status, body, kind = code, (text + "\n").encode(), "text/plain; charset=utf-8"
        else:
            status, body, kind = 404, b"not found: /metrics or /healthz\n", "text/plain; charset=utf-8"
        reasons = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}
        start_response(f"{status} {reasons[status]}", [("Content-Type", kind), ("Content-Length", str(len(body)))])
        return iter([body])

    def serve(self, port: int, host: str = "127.0.0.1") -> tuple[str, int]:
        """Serve /metrics and /healthz on `host`:`port` (0: a free port) from a daemon thread; the
        address bound."""
        server = make_server(host, port, self.app, server_class=_ThreadingServer, handler_class=_QuietHandler)
        threading.Thread(target=server.serve_forever, name="scepsy-metrics", daemon=True).start()
        self._server = server
        bound_host, bound_port = server.server_address[:2]
        return str(bound_host), int(bound_port)

    def shutdown(self) -> None:
        server = self._server
        if server is not None:
            server.shutdown()
            server.server_close()
            self._server = None


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        """Scrapes every 15 s would fill stderr; the decision log is the controller's record."""
