"""`scepsy control` as an operator runs it: the policy's knobs from a settings file and flags, the
/metrics and /healthz every act mode serves, Prometheus behind a token, headers and TLS, the lost
nodes and GPUs read from the cluster's Nodes, and leader election on a Lease.

Real parts: the kubernetes client against the loopback API double (tests/support/kube_api.py), a
real Prometheus (Debian's `prometheus`) with its web configuration requiring TLS and basic auth,
a real HTTP server on loopback for the bearer token, CP-SAT for the plans. Node objects are the
kubernetes client's own models (V1Node), serialized by the client as the API server sends them.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from support import prometheus_server
from support.kube_api import KubeApi, node_object as _node
from support.prometheus_server import PrometheusServer

from scepsy.cli import app
from scepsy.control.act import KubeCluster
from scepsy.control.fleet import Fleet, read_fleet, shrink
from scepsy.control.gauges import DesiredGauges
from scepsy.control.knobs import control_settings, describe_defaults
from scepsy.control.policy import ControlSettings
from scepsy.control.prometheus import Answer, PrometheusClient, PrometheusSettings
from scepsy.k8s.apply import connect
from scepsy.models.errors import InputError
from scepsy.models.instance.instance import load_instance

from conftest import INSTANCES

INSTANCE_FILE = INSTANCES / "beam-4xa6000.yaml"
runner = CliRunner()


# ---------------------------------------------------------------------------------------------
# The policy's knobs


def test_knobs_come_from_the_file_then_the_flags_validated_by_control_settings(tmp_path):
    path = tmp_path / "knobs.yaml"
    path.write_text("headroom: 0.2\nconfirm_periods: 3\nhorizon_s: null\npredictor: kalman\n")
    settings = control_settings({"period_s": 30.0}, path, ["headroom=0.3", "max_moves_per_period=4"])
    assert settings == dataclasses.replace(ControlSettings(), period_s=30.0, headroom=0.3, confirm_periods=3, predictor="kalman",
                                           max_moves_per_period=4)
    assert isinstance(settings.headroom, float) and isinstance(settings.confirm_periods, int)


@pytest.mark.parametrize("text, items, field, file", [
    ("headroom: lots\n", [], "headroom", True),
    ("no_such_knob: 1\n", [], "no_such_knob", True),
    ("", ["confirm_periods=1.5"], "confirm_periods", False),
    ("", ["headroom"], "setting", False),
    ("slo_margin: 0.9\n", ["scale_up_at=0.5"], "scale_up_at", False),  # ControlSettings' own check
    ("predictor: psychic\n", [], "predictor", True),
])
def test_a_bad_knob_is_named(tmp_path, text, items, field, file):
    path = tmp_path / "knobs.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        control_settings({}, path, items)
    assert caught.value.field == field
    assert (caught.value.file == str(path)) is file


def test_the_command_line_refuses_a_bad_knob_in_one_line_with_exit_code_2(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    result = runner.invoke(app, ["control", str(INSTANCE_FILE), "--plan", str(plan), "--simulate", "--arrivals", "azure:conv",
                                 "--setting", "hysteresis=-1"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: hysteresis: "), lines


def test_the_help_lists_every_knob_with_its_default():
    result = runner.invoke(app, ["control", "--help"], terminal_width=400)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for field in dataclasses.fields(ControlSettings):
        assert field.name in text
    assert describe_defaults().split(", ")[3] in text  # e.g. sustain_s=300, from the dataclass itself


# ---------------------------------------------------------------------------------------------
# /metrics and /healthz


def test_metrics_and_healthz_are_served_and_health_follows_the_loop():
    now = [1000.0]
    gauges = DesiredGauges(lambda: now[0], stale_after_s=180.0)
    host, port = gauges.serve(0)
    try:
        base = f"http://{host}:{port}"
        assert httpx.get(base + "/healthz").text == "ok\n"
        gauges.decided("keep")
        gauges.period_done()
        metrics = httpx.get(base + "/metrics")
        assert metrics.status_code == 200 and 'scepsy_decisions_total{action="keep"} 1.0' in metrics.text
        assert "scepsy_last_period_timestamp_seconds 1000.0" in metrics.text and "scepsy_leader 1.0" in metrics.text
        now[0] += 180.0  # three periods without one ending: the loop is stuck
        stale = httpx.get(base + "/healthz")
        assert (stale.status_code, stale.text) == (503, "stale\n")
        gauges.leading(False)  # a standby waiting for the Lease is alive
        assert httpx.get(base + "/healthz").text == "standby\n" and "scepsy_leader 0.0" in httpx.get(base + "/metrics").text
        assert httpx.get(base + "/other").status_code == 404
    finally:
        gauges.shutdown()


# ---------------------------------------------------------------------------------------------
# Prometheus behind a token, headers and TLS


class _Recorder(BaseHTTPRequestHandler):
    """A Prometheus-shaped HTTP API on loopback that records each request's headers."""

    seen: list[dict[str, str]] = []

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"model_name": "gen"}, "value": [1700000000.0, "2.5"]}]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_the_bearer_token_file_is_read_before_every_query_and_headers_are_sent(tmp_path):
    token = tmp_path / "token"
    token.write_text("first-token\n")
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = PrometheusSettings(f"http://127.0.0.1:{server.server_address[1]}", bearer_token_file=str(token),
                                      headers=(("X-Scope-OrgID", "tenant-1"),))
        client = PrometheusClient(settings)
        assert client.query("up").samples[0].value == 2.5
        token.write_text("rotated-token\n")  # the kubelet rotates a projected token in place
        client.query("up")
        token.unlink()
        gone = client.query("up")
        client.close()
    finally:
        server.shutdown()
        server.server_close()
    assert [h["authorization"] for h in _Recorder.seen] == ["Bearer first-token", "Bearer rotated-token"]
    assert all(h["x-scope-orgid"] == "tenant-1" for h in _Recorder.seen)
    assert gone.missing is not None and gone.missing.reason == "error" and "bearer token file" in gone.missing.detail


@pytest.mark.parametrize("extra, start", [
    (["--prometheus-header", "no colon"], "error: --prometheus-header: "),
    (["--prometheus-ca-file", "{tmp}/missing.pem"], "error: {tmp}/missing.pem: --prometheus-ca-file: file not found"),
    (["--prometheus-ca-file", "{tmp}/plan.json"], "error: {tmp}/plan.json: --prometheus-ca-file: not a CA bundle"),
    (["--prometheus-bearer-token-file", "{tmp}/missing"], "error: {tmp}/missing: --prometheus-bearer-token-file: file not found"),
])
def test_the_prometheus_options_refuse_bad_input_in_one_line(tmp_path, extra, start):
    (tmp_path / "plan.json").write_text("{}")
    arguments = [a.format(tmp=tmp_path) for a in extra]
    result = runner.invoke(app, ["control", str(INSTANCE_FILE), "--plan", str(tmp_path / "plan.json"), "--prometheus-url",
                                 "http://127.0.0.1:9", *arguments])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(start.format(tmp=tmp_path)), lines


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A CA-less self-signed certificate for 127.0.0.1 (openssl)."""
    cert, key = folder / "tls.crt", folder / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def _bcrypt(password: str) -> str:
    """A bcrypt hash (what Prometheus' basic_auth_users holds), from the C library's crypt(3):
    Debian's libxcrypt implements $2b$."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the crypt module leaves the standard library in 3.13
        crypt = pytest.importorskip("crypt")
    hashed = crypt.crypt(password, "$2b$04$" + "abcdefghijklmnopqrstuv")
    if not hashed or not hashed.startswith("$2b$"):
        pytest.skip("this C library's crypt(3) has no bcrypt")
    return hashed


@pytest.mark.skipif(not prometheus_server.available(), reason="the Debian package prometheus is not installed")
def test_a_real_prometheus_behind_tls_and_basic_auth(tmp_path):
    """Prometheus' web configuration (`--web.config.file`: tls_server_config, basic_auth_users)
    refuses a query without the credentials and serves it with them, over TLS that verifies
    against the CA bundle given, or without verification when told."""
    cert, key = _self_signed(tmp_path)
    web = {"tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
           "basic_auth_users": {"scepsy": _bcrypt("secret")}}
    authorization = "Basic " + base64.b64encode(b"scepsy:secret").decode()
    with PrometheusServer(tmp_path / "prom", {}, web_config=web, ready_headers={"Authorization": authorization},
                          ca_file=cert) as prometheus:
        def ask(**options) -> Answer:
            client = PrometheusClient(PrometheusSettings(prometheus.url, attempts=1, **options))
            try:
                return client.query("vector(1)")
            finally:
                client.close()

        good = ask(ca_file=str(cert), headers=(("Authorization", authorization),))
        assert good.missing is None and good.samples[0].value == 1.0
        unverified = ask(verify_tls=False, headers=(("Authorization", authorization),))
        assert unverified.missing is None
        refused = ask(ca_file=str(cert))
        assert refused.missing is not None and "401" in refused.missing.detail
        untrusted = ask(headers=(("Authorization", authorization),))
        assert untrusted.missing is not None and "does not verify" in untrusted.missing.detail


# ---------------------------------------------------------------------------------------------
# Lost nodes and GPUs


@pytest.fixture(scope="module")
def instance():
    return load_instance(INSTANCE_FILE)


def test_lost_gpus_and_nodes_are_read_from_the_nodes(instance):
    assert read_fleet(instance, [_node("a6000-0")]) == Fleet()
    # the device plugin marked one of 4 GPUs unhealthy: capacity 4, allocatable 3; GPU 0 runs a replica
    fleet = read_fleet(instance, [_node("a6000-0", allocatable=3)], busy={("a6000-0", 3)})
    assert fleet == Fleet({}, {"a6000-0": (2,)})
    # time-slicing or MPS replicas: 40 devices of 4 GPUs, 10 gone is one GPU
    assert read_fleet(instance, [_node("a6000-0", capacity=40, allocatable=30)]).lost_gpus == {"a6000-0": (3,)}
    assert read_fleet(instance, [_node("a6000-0", ready="Unknown")]).lost_nodes == {"a6000-0": "Ready is Unknown: NodeStatusUnknown"}
    assert read_fleet(instance, [_node("a6000-0", unschedulable=True)]).lost_nodes == {"a6000-0": "cordoned"}
    assert read_fleet(instance, [_node("other")]).unmatched


def test_the_planner_plans_on_what_is_left(instance):
    """Two of the node's four GPUs lost: every plan is placed on the two left, and a load that
    needs more than two GPUs gets no plan on them."""
    from scepsy.control.replan import Replanner

    shrunk = shrink(instance, Fleet({}, {"a6000-0": (2, 3)}))
    assert shrunk.cluster.free_units("a6000-0", 3) == 0 and shrunk.cluster.free_units("a6000-0", 0) == 10
    assert shrink(instance, Fleet()) is instance
    light = {w.name: 1.0 for w in instance.workflows}
    whole, left = Replanner(instance), Replanner(shrunk)
    allocation = left.allocation(light)
    assert allocation is not None
    placement = left.place(allocation, None)
    assert placement is not None and {s.gpu for r in placement.replicas for s in r.shards} <= {0, 1}
    heavy = next(rate for rate in (2.0, 4.0, 6.0, 8.0, 12.0)
                 if (found := whole.allocation({w.name: rate for w in instance.workflows})) is not None and found.gpus() > 2)
    shrunk_plan = left.allocation({w.name: heavy for w in instance.workflows})
    assert shrunk_plan is None or shrunk_plan.gpus() <= 2


def test_the_cluster_reads_nodes_through_the_api(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with KubeApi("scepsy") as api:
        api.put(_node("a6000-0", allocatable=3))
        nodes = KubeCluster(connect(api.kubeconfig(tmp_path)), "scepsy").nodes()
        assert [n["metadata"]["name"] for n in nodes] == ["a6000-0"]
        assert nodes[0]["status"]["allocatable"]["nvidia.com/gpu"] == "3"
        assert ("list", "", "nodes", None) in api.requests


# ---------------------------------------------------------------------------------------------
# One active controller: the Lease


def _lease_requests(api: KubeApi, identity_calls: int = 0) -> list[str]:
    return [verb for verb, group, resource, _ in api.requests if group == "coordination.k8s.io" and resource == "leases"]


def test_a_candidate_waits_while_the_lease_is_held_then_leads_and_stops_when_it_cannot_renew(tmp_path, monkeypatch):
    """The Lease written by `scepsy manifests --controller` is held by another controller: this one
    reads it (standby) until the holder's lease duration passed without a renewal, takes it over
    (an update, never a create: the RBAC grants get and update only), and, once another controller
    holds the Lease again (its renewals refused as stale), cannot renew and stops."""
    from scepsy.control.leader import Election, LeaderSettings, LeadershipLost

    monkeypatch.setenv("HOME", str(tmp_path))
    api = KubeApi("scepsy")
    api.__enter__()
    try:
        api.put({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "scepsy-controller", "namespace": "scepsy"},
                 "spec": {"holderIdentity": "pod-other", "leaseDurationSeconds": 6, "acquireTime": "2026-01-01T00:00:00.000000Z",
                          "renewTime": "2026-01-01T00:00:00.000000Z"}})
        # short for a test, with a renew deadline of four retries: a loaded machine does not lose the Lease on its own
        settings = LeaderSettings("pod-a", "scepsy", lease_duration_s=6.0, renew_deadline_s=4.0, retry_period_s=1.0)
        election = Election(connect(api.kubeconfig(tmp_path)), settings)
        election.start()
        election.wait_to_lead(lambda: None)
        election.check()  # leads: no LeadershipLost
        lease = api.objects("Lease")["scepsy-controller"]
        assert lease["spec"]["holderIdentity"] == "pod-a"
        calls = _lease_requests(api)
        first_update = calls.index("update")
        assert calls[:first_update].count("get") >= 2 and "create" not in calls  # it saw the other's Lease before taking it
        taken = dict(lease, spec=dict(lease["spec"], holderIdentity="pod-other", renewTime="2026-01-01T00:10:00.000000Z"))
        api.put(taken)  # a new resourceVersion: pod-a's next renewal is a stale update (409)
        assert election.lost.wait(timeout=120.0)  # a guard against a hang, not a bound on the test's time
        with pytest.raises(LeadershipLost, match="lost Lease scepsy/scepsy-controller"):
            election.check()
        assert api.objects("Lease")["scepsy-controller"]["spec"]["holderIdentity"] == "pod-other"
    finally:
        api.__exit__(None, None, None)


# ---------------------------------------------------------------------------------------------
# scepsy manifests --controller


GOLDEN_PLAN = Path(__file__).parent / "golden" / "plans" / "beam-4xa6000-optimal.json"


@pytest.mark.parametrize("extra, option", [
    ([], "--controller-image"),
    (["--controller-image", "registry.example.com/scepsy:0.1.0"], "--prometheus-url"),
    (["--controller-image", "Not An Image!", "--prometheus-url", "http://p:9090"], "--controller-image"),
])
def test_manifests_controller_refuses_missing_inputs_in_one_line(tmp_path, extra, option):
    result = runner.invoke(app, ["manifests", str(GOLDEN_PLAN), "--out", str(tmp_path / "out"), "--controller", *extra])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {option}: "), lines


def test_manifests_controller_checks_the_settings_file_and_mounts_it(tmp_path):
    knobs = tmp_path / "knobs.yaml"
    knobs.write_text("headroom: -1\n")
    base = ["manifests", str(GOLDEN_PLAN), "--controller", "--controller-image", "registry.example.com/scepsy:0.1.0",
            "--prometheus-url", "http://prometheus.monitoring:9090", "--settings", str(knobs)]
    bad = runner.invoke(app, [*base, "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and f"error: {knobs}: headroom: " in bad.output
    knobs.write_text("headroom: 0.2\n")
    good = runner.invoke(app, [*base, "--out", str(tmp_path / "good")])
    assert good.exit_code == 0, good.output
    deployment = yaml.safe_load((tmp_path / "good" / "70-deployment-scepsy-controller.yaml").read_text())
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--settings") + 1] == "/etc/scepsy/controller/settings.yaml"
    configmap = yaml.safe_load((tmp_path / "good" / "40-configmap-scepsy-controller.yaml").read_text())
    assert configmap["data"]["settings.yaml"] == "headroom: 0.2\n"
