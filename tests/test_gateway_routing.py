"""Every LLM's requests reach only that LLM's replicas, through the real SGLang model gateway, and
replicas that start late, restart, are added or are removed keep it that way without restarting it.

Each emitted gateway Deployment runs as the real gateway binary of the PyPI package `sglang-router`
(the same release as the gateway image the manifests use), started with exactly the command and
arguments the Deployment renders except where a cluster is needed: `--host 0.0.0.0` -> 127.0.0.1,
`--port` and `--prometheus-port` -> free loopback ports (one network namespace here, one per pod
there), `--service-discovery-port` -> the port every emulated pod listens on here (a free port
instead of the engine's 8000/30000), and the Kubernetes API it discovers pods through is a loopback
double of the pod LIST/WATCH API (tests/support/kube_pods.py) named by KUBECONFIG (in a cluster:
its ServiceAccount). Each replica pod runs as a `scepsy emulate` process with the engine's
personality on its own loopback address (its pod IP), and carries the labels of the rendered
Deployment's pod template; the test plays the kubelet: a pod turns Ready only once its engine
answers /health, as the rendered readiness probe does.

No wall-clock bound: readiness is polled with generous limits, requests wait for answers, and the
drain test's only time assertion is a lower bound (the drain hook must outlast its settle time
because the draining replica is still busy, which the emulator's modelled time guarantees).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass

import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam
import pytest

from k8s_support import CASES, engine_deployments, objects_of, of_kind, regenerate
from support.kube_pods import PodApi
from support.ports import free_port

from scepsy.k8s.gateway import GATEWAY_COMMAND, GATEWAY_VERSION, SETTLE_S
from scepsy.models.catalog import catalog
from scepsy.models.catalog.catalog import serving_task
from scepsy.models.performance.engine import engine_for

pytestmark = pytest.mark.slow

READY_LIMIT_S = 300.0  # generous: a loaded CI machine starts a dozen processes
REQUESTS_PER_KIND = 3
# The drain test runs the rendered preStop command with this settle time instead of SETTLE_S: the
# gateway's drop of the deleted pod is polled for, so the settle time only has to be outlasted by B's
# streams (each lasts three times it), and a short one keeps the test short
HOOK_SETTLE_S = 3
_ADDRESSES = itertools.count(1)


def _poll(condition, limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} not ready after {limit_s:g} s")


def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=5.0)
    except httpx.HTTPError:
        return None


def _pod_ip() -> str:
    """A loopback address of its own for each emulated pod (Linux routes all of 127.0.0.0/8 to lo)."""
    n = next(_ADDRESSES)
    return f"127.86.{n // 250}.{n % 250 + 1}"


def _shared_port() -> int:
    """A port free on every address: each emulated pod listens on it at its own pod IP."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


class Processes:
    """Processes started by the test; stopped (and waited for) at the end, logs kept for failures."""

    def __init__(self, stack: ExitStack, tmp_path):
        self.stack, self.tmp_path, self.count = stack, tmp_path, 0

    def start(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        self.count += 1
        log = open(self.tmp_path / f"process-{self.count}.log", "wb")
        self.stack.callback(log.close)
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.stack.callback(_stop, process)
        return process


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass
class Pod:
    name: str
    llm: str
    ip: str
    url: str
    process: subprocess.Popen


class Cluster:
    """The rendered objects of one case run on loopback: the pod API, engine pods, gateways."""

    def __init__(self, stack: ExitStack, tmp_path, case, speedup: dict[str, float] | None = None):
        self.objects = objects_of(regenerate.emit(case))
        self.plan = json.loads(regenerate.plan_path(case).read_text())
        self.llms = {m["name"]: m for m in self.plan["llms"]}
        self.engine = case.engine
        self.namespace = next(o for o in self.objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "scepsy-plan")["metadata"]["namespace"]
        self.templates = {d["metadata"]["name"]: d["spec"]["template"] for d in engine_deployments(self.objects)}
        self.gateways = {d["metadata"]["labels"]["scepsy.io/llm"]: d for d in of_kind(self.objects, "Deployment")
                         if d["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"}
        self.api = stack.enter_context(PodApi(self.namespace))
        self.kubeconfig = self.api.kubeconfig(tmp_path)
        self.processes = Processes(stack, tmp_path)
        self.port = _shared_port()
        self.speedup = speedup or {}
        self.pods: dict[str, Pod] = {}
        self.created = itertools.count()

    def _engine(self, llm: str, ip: str) -> tuple[subprocess.Popen, str]:
        m = self.llms[llm]
        argv = [sys.executable, "-m", "scepsy", "emulate", "--model", m["model"], "--gpu", m["gpu_type"], "--tp", str(m["tp"]),
                "--fraction", str(m["fraction"]), "--served-model-name", llm, "--personality", self.engine,
                "--speedup", str(self.speedup.get(llm, 1000.0)), "--host", ip, "--port", str(self.port)]
        process = self.processes.start(argv)
        url = f"http://{ip}:{self.port}"
        _poll(lambda: (r := _get(url + "/health")) is not None and r.status_code == 200, READY_LIMIT_S, f"engine of {llm} at {ip}")
        return process, url

    def start_replica(self, deployment: str) -> Pod:
        """A pod of the rendered Deployment: scheduled, its engine started, Ready once /health answers."""
        labels = self.templates[deployment]["metadata"]["labels"]
        name = f"{deployment}-{next(self.created)}"
        self.api.create(name, labels)
        ip = _pod_ip()
        process, url = self._engine(labels["scepsy.io/llm"], ip)
        self.api.run(name, ip, ready=True)
        pod = self.pods[name] = Pod(name, labels["scepsy.io/llm"], ip, url, process)
        return pod

    def restart_container(self, pod: Pod) -> None:
        """The engine container restarts in the same pod (same IP): not ready, down, up, ready."""
        self.api.run(pod.name, pod.ip, ready=False)
        _stop(pod.process)
        pod.process, pod.url = self._engine(pod.llm, pod.ip)
        self.api.run(pod.name, pod.ip, ready=True)

    def start_gateway(self, llm: str, extra: list[str] | None = None) -> Gateway:
        container = self.gateways[llm]["spec"]["template"]["spec"]["containers"][0]
        assert tuple(container["command"]) == GATEWAY_COMMAND
        args, url, metrics_url = _local_args(container["args"], self.port)
        process = self.processes.start([sys.executable, *container["command"][1:], *args, *(extra or [])],
                                       env=dict(os.environ, KUBECONFIG=str(self.kubeconfig)))
        _poll(lambda: (r := _get(url + "/liveness")) is not None and r.status_code == 200, READY_LIMIT_S, f"gateway of {llm}")
        return Gateway(process, url, metrics_url)


@dataclass
class Gateway:
    process: subprocess.Popen
    url: str
    metrics_url: str  # the --prometheus-port listener


def _local_args(args: list[str], engine_port: int) -> tuple[list[str], str, str]:
    """The rendered arguments with the cluster-only values replaced (module docstring)."""
    port, metrics_port = free_port(), free_port()
    replace = {"--host": "127.0.0.1", "--port": str(port), "--prometheus-port": str(metrics_port), "--service-discovery-port": str(engine_port)}
    out = list(args)
    for flag, value in replace.items():
        out[out.index(flag) + 1] = value
    return out, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}"


def _workers(gateway_url: str) -> set[str]:
    response = _get(gateway_url + "/workers")
    return {w["url"] for w in response.json()["workers"]} if response is not None and response.status_code == 200 else set()


def _healthy_workers(gateway_url: str) -> set[str]:
    response = _get(gateway_url + "/workers")
    if response is None or response.status_code != 200:
        return set()
    return {w["url"] for w in response.json()["workers"] if w["is_healthy"]}


def _served(url: str) -> int:
    """Requests the engine answered in full (vLLM's counter has one series per finish reason)."""
    text = httpx.get(url + "/metrics", timeout=10.0).text
    return int(sum(float(row.rsplit(" ", 1)[1]) for row in text.splitlines() if row.partition("{")[0] == "vllm:request_success_total"))


def _send(gateway_url: str, llm: str, task: str, engine: str) -> int:
    """Requests of the LLM's kinds through its gateway; returns how many were sent."""
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key="none", max_retries=0, timeout=120.0)
    sent = 0
    for i in range(REQUESTS_PER_KIND):
        if task == "generate":
            messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": f"question {i} for {llm}"}]
            answer = client.chat.completions.create(model=llm, messages=messages, max_tokens=4)
            assert answer.choices[0].message.content
            stream = client.chat.completions.create(model=llm, messages=messages, max_tokens=4, stream=True)
            pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
            assert "".join(pieces)
            sent += 2
        elif task == "embed":
            vectors = client.embeddings.create(model=llm, input=[f"passage {i}", "another passage"])
            assert len(vectors.data) == 2 and vectors.data[0].embedding
            sent += 1
        else:
            body = {"model": llm, "query": f"query {i}", "documents": ["first document", "second document"]}
            response = httpx.post(gateway_url + "/v1/rerank", json=body, timeout=120.0)
            assert response.status_code == 200, response.text
            results = response.json()
            ranked = results["results"] if isinstance(results, dict) else results
            assert len(ranked) == 2
            sent += 1
    return sent



def _gauge(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10.0).text
    return sum(float(row.rsplit(" ", 1)[1]) for row in text.splitlines() if row.partition("{")[0] == name)


def _accepted(url: str) -> int:
    """Requests an engine ever took: finished + running + waiting."""
    return _served(url) + int(_gauge(url, "vllm:num_requests_running") + _gauge(url, "vllm:num_requests_waiting"))


def _chat(gateway_url: str, llm: str, tag: str, max_tokens: int = 2) -> None:
    response = httpx.post(gateway_url + "/v1/chat/completions", timeout=120.0,
                          json={"model": llm, "messages": [{"role": "user", "content": f"{tag} for {llm}"}], "max_tokens": max_tokens})
    assert response.status_code == 200, response.text
    assert response.json()["model"] == llm


# every kind of LLM (both workflows of the combined instance), and several replicas per LLM (the
# equal-halves plan of beam-4xa6000: gen x3, ver x5), for both engines' personalities
ROUTING_CASES = [c for c in CASES if c.router == "sglang" and not c.controller and (c.instance, c.plan_kind, c.sharing) in
                 {("combined-8xh100", "optimal", "hami"), ("beam-4xa6000", "halves", "device-plugin-mps")}]
HALVES = {c.engine: c for c in CASES if c.plan_kind == "halves" and not c.controller}


@pytest.mark.parametrize("case", ROUTING_CASES, ids=lambda c: c.name)
def test_gateways_route_each_llm_to_its_own_replicas(tmp_path, case):
    """All replica pods of all LLMs in one namespace, one gateway per LLM discovering its own: every
    LLM's requests (chat, streamed chat, embeddings, rerank) are answered by its replicas only, and
    every gateway exposes its Prometheus metrics."""
    assert importlib.metadata.version("sglang-router") == GATEWAY_VERSION, "pin sglang-router to the gateway image's release"
    with ExitStack() as stack:
        cluster = Cluster(stack, tmp_path, case)
        pods = [cluster.start_replica(name) for name in sorted(cluster.templates)]
        gateways = {llm: cluster.start_gateway(llm) for llm in sorted(cluster.gateways)}
        gateway_urls = {llm: g.url for llm, g in gateways.items()}
        for llm, url in gateway_urls.items():
            own = {p.url for p in pods if p.llm == llm}
            _poll(lambda: _healthy_workers(url) == own, READY_LIMIT_S, f"gateway of {llm} with its {len(own)} replicas")
        sent: Counter = Counter()
        for llm, url in gateway_urls.items():
            sent[llm] += _send(url, llm, serving_task(cluster.llms[llm]["model"]), case.engine)
        served: Counter = Counter()
        for pod in pods:
            served[pod.llm] += _served(pod.url)
        for llm, gateway in gateways.items():
            # --prometheus-port: the gateway's own metrics, which its PodMonitor scrapes at /metrics
            metrics = httpx.get(gateway.metrics_url + "/metrics", timeout=10.0)
            assert metrics.status_code == 200 and "smg_http_requests_total" in metrics.text, llm
            assert gateway.process.poll() is None
    # every LLM with a gateway got exactly its requests; the others (vLLM's reranker) none
    assert served == sent, (served, sent)
    assert set(cluster.gateways) == {m for m in cluster.llms if case.engine == "sglang" or serving_task(cluster.llms[m]["model"]) != "score"}
    assert all(sent[m] > 0 for m in cluster.gateways)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_late_restarted_and_added_replicas_get_traffic_without_a_gateway_restart(tmp_path, engine):
    """The gateway of `gen` (equal-halves beam plan: gen x3, ver x5) starts before any engine, with
    its registration window shortened to 1 s (`--worker-startup-timeout-secs`, which bounds how
    long the gateway tries a worker it was told about) and waited out; then, each time with every
    request answered by gen and by the replicas the pods say:
    - a late replica (ready long after the window) gets all requests;
    - its engine container restarts in the same pod (same IP): requests reach the new process;
    - its pod is replaced (deleted, a new pod with a new IP): the new pod gets the requests;
    - two replicas are added (scale up): each gets requests;
    and a `ver` replica in the same namespace never gets one. The gateway process runs throughout."""
    with ExitStack() as stack:
        # gen's engines in (modelled) real time / 20, so that concurrent requests overlap
        cluster = Cluster(stack, tmp_path, HALVES[engine], speedup={"gen": 20.0})
        gateway = cluster.start_gateway("gen", ["--worker-startup-timeout-secs", "1"])
        waiting = _get(gateway.url + "/readiness")
        assert waiting is not None and waiting.status_code == 503  # no replica yet: alive, not ready
        time.sleep(3)  # past the shortened window (a lower bound: waiting longer changes nothing)
        ver = cluster.start_replica("ver-r0")

        first = cluster.start_replica("gen-r0")
        _poll(lambda: _healthy_workers(gateway.url) == {first.url}, READY_LIMIT_S, "late replica")
        for i in range(4):
            _chat(gateway.url, "gen", f"late {i}")
        assert _served(first.url) == 4

        cluster.restart_container(first)
        assert _served(first.url) == 0  # a new engine process

        def answered_by_restarted() -> bool:
            try:
                _chat(gateway.url, "gen", "after restart")
            except AssertionError:
                return False  # the gateway has not seen the engine back yet (health checks every 10 s)
            return True

        _poll(answered_by_restarted, READY_LIMIT_S, "restarted engine")
        assert _served(first.url) >= 1

        cluster.api.delete(first.name)
        _poll(lambda: first.url not in _workers(gateway.url), READY_LIMIT_S, "deleted pod dropped")
        _stop(first.process)
        cluster.api.remove(first.name)
        replaced = cluster.start_replica("gen-r0")
        _poll(lambda: _healthy_workers(gateway.url) == {replaced.url}, READY_LIMIT_S, "replacement pod")
        for i in range(3):
            _chat(gateway.url, "gen", f"replaced {i}")
        assert _served(replaced.url) == 3

        added = [cluster.start_replica("gen-r1"), cluster.start_replica("gen-r2")]
        every = {replaced.url, *(p.url for p in added)}
        _poll(lambda: _healthy_workers(gateway.url) == every, READY_LIMIT_S, "scaled-up replicas")
        # cache_aware sends a prompt without a cached prefix to the replica with the fewest requests in
        # flight (the first one when all are idle): concurrent requests spread over the replicas
        with ThreadPoolExecutor(max_workers=12) as pool:
            for round_ in range(50):  # bounded: until each added replica answered at least once
                tags = [hashlib.sha256(f"{round_}-{i}".encode()).hexdigest() for i in range(12)]
                list(pool.map(lambda tag: _chat(gateway.url, "gen", tag, max_tokens=48), tags))
                if all(_served(p.url) > 0 for p in added):
                    break
        assert all(_served(p.url) > 0 for p in added)
        assert _served(ver.url) == 0
        assert gateway.process.poll() is None  # never restarted


def _stream(gateway_url: str, llm: str, tag: str, max_tokens: int, outcome: dict) -> None:
    try:
        # the tag first: prompts that share no prefix go to the replica with the fewest requests in
        # flight (cache_aware); a shared prefix would send every stream after the first where it went
        body = {"model": llm, "messages": [{"role": "user", "content": f"{tag}: a long answer"}], "max_tokens": max_tokens, "stream": True,
                "ignore_eos": True}
        with httpx.stream("POST", gateway_url + "/v1/chat/completions", json=body, timeout=600.0) as response:
            chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices") and c["choices"][0].get("finish_reason")]
        outcome[tag] = (response.status_code, finish)
    except httpx.HTTPError as exc:
        outcome[tag] = (None, repr(exc))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_removed_replica_gets_no_new_requests_and_finishes_its_own(tmp_path, engine):
    """Scale down with requests in flight: `gen` has two replicas, A and B, whose modelled time makes
    each stream last at least three times the drain hook's settle time (HOOK_SETTLE_S). While B streams answers,
    its pod is deleted and, as the kubelet does, its rendered preStop command starts at once
    (against B's metrics address). The gateway drops B; new requests all go to A while B
    finishes; the hook returns only when B is idle (so it outlasts its settle time), after which B's
    engine is stopped and its pod removed; every stream B had completes in full."""
    case = HALVES[engine]
    llm = next(m for m in json.loads(regenerate.plan_path(case).read_text())["llms"] if m["name"] == "gen")
    max_tokens = 64
    modelled_s = engine_for(catalog.model(llm["model"]), catalog.gpu(llm["gpu_type"]), llm["tp"], llm["fraction"]).request_time_s(8, max_tokens)
    slow = modelled_s / (3 * HOOK_SETTLE_S)  # a stream on B lasts at least 3 x the hook's settle time
    with ExitStack() as stack:
        cluster = Cluster(stack, tmp_path, case, speedup={"gen": slow})
        a = cluster.start_replica("gen-r0")
        b = cluster.start_replica("gen-r1")
        gateway = cluster.start_gateway("gen")
        _poll(lambda: _healthy_workers(gateway.url) == {a.url, b.url}, READY_LIMIT_S, "both replicas")

        outcome: dict = {}
        streams = []
        for i in range(16):  # bounded: until B runs at least one stream
            tag = hashlib.sha256(f"stream {i}".encode()).hexdigest()
            thread = threading.Thread(target=_stream, args=(gateway.url, "gen", tag, max_tokens, outcome))
            thread.start()
            streams.append(thread)
            _poll(lambda: _accepted(a.url) + _accepted(b.url) >= i + 1, READY_LIMIT_S, "stream accepted")
            if _gauge(b.url, "vllm:num_requests_running") >= 1:
                break
        assert _gauge(b.url, "vllm:num_requests_running") >= 1

        cluster.api.delete(b.name)  # graceful deletion: the kubelet runs preStop now
        command = cluster.templates["gen-r1"]["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
        assert command[3].startswith("http://127.0.0.1:") and command[3].endswith("/metrics")
        hook_started = time.monotonic()
        assert command[5] == str(SETTLE_S)  # the rendered settle time; the hook here settles for HOOK_SETTLE_S
        hook = subprocess.Popen([sys.executable, *command[1:3], b.url + "/metrics", command[4], str(HOOK_SETTLE_S), *command[6:]])
        stack.callback(_stop, hook)
        _poll(lambda: b.url not in _workers(gateway.url), READY_LIMIT_S, "deleted pod dropped")
        took = _accepted(b.url)
        served_a = _served(a.url)
        for i in range(6):
            _chat(gateway.url, "gen", f"after removal {i}")
        assert _accepted(b.url) == took  # B got no new request
        assert _served(a.url) >= served_a + 6

        assert hook.wait(timeout=900) == 0
        hook_s = time.monotonic() - hook_started
        assert _gauge(b.url, "vllm:num_requests_running") + _gauge(b.url, "vllm:num_requests_waiting") == 0
        assert hook_s > HOOK_SETTLE_S + 1, "the hook returned before B finished its requests"
        _stop(b.process)  # the pod ends only now
        cluster.api.remove(b.name)
        for thread in streams:
            thread.join(timeout=900)
        assert gateway.process.poll() is None
    assert len(outcome) == len(streams)
    assert all(status == 200 and finish == ["length"] for status, finish in outcome.values()), outcome


def test_the_gateway_cannot_front_a_vllm_reranker(tmp_path):
    """Why a vLLM reranker has no gateway (k8s/gateway.py): gateway 0.3.2 forwards rerank requests
    with the model `unknown` (vLLM: 404) and parses the answer as SGLang's bare list (vLLM answers
    {"results": [...]}). If a gateway release fixes this, this test fails and the exception can go."""
    with ExitStack() as stack:
        processes = Processes(stack, tmp_path)
        port = free_port()
        argv = [sys.executable, "-m", "scepsy", "emulate", "--model", "BAAI/bge-reranker-base", "--gpu", "H100", "--fraction", "0.7",
                "--served-model-name", "rerank", "--personality", "vllm", "--speedup", "1000", "--port", str(port)]
        processes.start(argv)
        worker = f"http://127.0.0.1:{port}"
        _poll(lambda: (r := _get(worker + "/health")) is not None and r.status_code == 200, READY_LIMIT_S, "reranker")
        port, metrics_port = free_port(), free_port()
        processes.start([sys.executable, *GATEWAY_COMMAND[1:], "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
                         "--worker-urls", worker, "--prometheus-port", str(metrics_port)])
        url = f"http://127.0.0.1:{port}"
        _poll(lambda: (r := _get(url + "/readiness")) is not None and r.status_code == 200, READY_LIMIT_S, "gateway")
        body = {"model": "rerank", "query": "q", "documents": ["a", "b"]}
        assert httpx.post(url + "/v1/rerank", json=body, timeout=120.0).status_code == 404  # model forwarded as `unknown`
        assert httpx.post(url + "/rerank", json=body, timeout=120.0).status_code == 500  # vLLM's shape not parsed
        assert httpx.post(worker + "/v1/rerank", json=body, timeout=120.0).status_code == 200  # the engine itself answers
