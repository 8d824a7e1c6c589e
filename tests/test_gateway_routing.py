"""Every LLM's requests reach only that LLM's replicas, through the real SGLang model gateway.

For the combined instance's plan (workflows beam and rag: a decoder generator and verifier, a RAG
generator, an embedder and a reranker) and a plan with several replicas per LLM (beam-4xa6000 in
equal halves: gen x3, ver x5), with both engines, each replica of the emitted manifests runs
as a `scepsy emulate` process with the engine's personality (vLLM: no /server_info, 404 for a model
it does not serve; SGLang: /server_info, /model_info, SGLang's rerank shape, any model name), and
each emitted gateway Deployment runs as the real gateway binary of the PyPI package `sglang-router`
(the same release as the gateway image the manifests use), started with exactly the command and
arguments the Deployment renders except where a cluster is needed:
  --host 0.0.0.0 -> 127.0.0.1, --port and --prometheus-port -> free loopback ports (one network
  namespace here, one per pod there), and each --worker-urls entry http://<svc>.<ns>.svc:<port> ->
  the emulator of the pod that the rendered Service <svc> selects.
Then chat completions (plain and streamed, through the openai client), embeddings and rerank go to
each LLM's gateway, and every replica's request counter (`vllm:request_success_total` of its
/metrics) shows that each LLM's replicas, and only they, answered that LLM's requests.

No wall-clock bound: readiness is polled with generous limits, and requests wait for answers.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack

import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam
import pytest

from k8s_support import CASES, objects_of, of_kind, regenerate
from support.llamacpp import free_port

from scepsy.k8s.gateway import GATEWAY_COMMAND, GATEWAY_VERSION
from scepsy.models.catalog.catalog import serving_task

pytestmark = pytest.mark.slow

READY_LIMIT_S = 300.0  # generous: a loaded CI machine starts a dozen processes
REQUESTS_PER_KIND = 3


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


class Processes:
    """Processes started by the test; stopped (and waited for) at the end, logs kept for failures."""

    def __init__(self, stack: ExitStack, tmp_path):
        self.stack, self.tmp_path, self.count = stack, tmp_path, 0

    def start(self, argv: list[str]) -> subprocess.Popen:
        self.count += 1
        log = open(self.tmp_path / f"process-{self.count}.log", "wb")
        self.stack.callback(log.close)
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.stack.callback(_stop, process)
        return process


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _start_emulator(processes: Processes, llm: dict, engine: str) -> str:
    port = free_port()
    argv = [sys.executable, "-m", "scepsy", "emulate", "--model", llm["model"], "--gpu", llm["gpu_type"],
            "--tp", str(llm["tp"]), "--fraction", str(llm["fraction"]), "--served-model-name", llm["name"],
            "--personality", engine, "--speedup", "1000", "--port", str(port)]
    processes.start(argv)
    url = f"http://127.0.0.1:{port}"
    _poll(lambda: (r := _get(url + "/health")) is not None and r.status_code == 200, READY_LIMIT_S, f"emulator of {llm['name']}")
    return url


def _replica_urls(objects: list[dict], emulators: dict[tuple[str, int], str], namespace: str) -> dict[str, str]:
    """Cluster worker URL (through a rendered replica Service) -> the emulator its selector picks."""
    out = {}
    for service in of_kind(objects, "Service"):
        selector = service["spec"]["selector"]
        if "scepsy.io/replica" not in selector:
            continue
        key = (selector["scepsy.io/llm"], int(selector["scepsy.io/replica"]))
        port = service["spec"]["ports"][0]["port"]
        out[f"http://{service['metadata']['name']}.{namespace}.svc:{port}"] = emulators[key]
    return out


def _local_args(args: list[str], worker_urls: dict[str, str]) -> tuple[list[str], str]:
    """The rendered arguments with the cluster-only values replaced (module docstring)."""
    port, metrics_port = free_port(), free_port()
    replace = {"--host": "127.0.0.1", "--port": str(port), "--prometheus-port": str(metrics_port)}
    out, i = [], 0
    while i < len(args):
        flag = args[i]
        out.append(flag)
        if flag == "--worker-urls":
            i += 1
            while i < len(args) and not args[i].startswith("--"):
                out.append(worker_urls[args[i]])
                i += 1
            continue
        if flag in replace:
            out.append(replace[flag])
            i += 2
            continue
        i += 1
    return out, f"http://127.0.0.1:{port}"


def _start_gateway(processes: Processes, deployment: dict, worker_urls: dict[str, str]) -> str:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert tuple(container["command"]) == GATEWAY_COMMAND
    args, url = _local_args(container["args"], worker_urls)
    processes.start([sys.executable, *container["command"][1:], *args])

    def all_workers_healthy() -> bool:
        response = _get(url + "/readiness")
        if response is None or response.status_code != 200:
            return False
        body = response.json()
        return body.get("healthy_workers") == body.get("total_workers") and body.get("total_workers", 0) > 0

    _poll(all_workers_healthy, READY_LIMIT_S, f"gateway {deployment['metadata']['name']}")
    return url


def _served(url: str) -> int:
    text = httpx.get(url + "/metrics", timeout=10.0).text
    line = next(row for row in text.splitlines() if row.startswith("vllm:request_success_total"))
    return int(float(line.rsplit(" ", 1)[1]))


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


# every kind of LLM (both workflows of the combined instance), and several replicas per LLM (the
# equal-halves plan of beam-4xa6000: gen x3, ver x5), for both engines' personalities
ROUTING_CASES = [c for c in CASES if (c.instance, c.plan_kind, c.sharing) in
                 {("combined-8xh100", "optimal", "hami"), ("beam-4xa6000", "halves", "device-plugin-mps")}]


@pytest.mark.parametrize("case", ROUTING_CASES, ids=lambda c: c.name)
def test_gateways_route_each_llm_to_its_own_replicas(tmp_path, case):
    assert importlib.metadata.version("sglang-router") == GATEWAY_VERSION, "pin sglang-router to the gateway image's release"
    engine = case.engine
    objects = objects_of(regenerate.emit(case))
    plan = json.loads(regenerate.plan_path(case).read_text())
    llms = {m["name"]: m for m in plan["llms"]}
    namespace = objects[0]["metadata"]["name"]
    gateways = {d["metadata"]["labels"]["scepsy.io/llm"]: d for d in of_kind(objects, "Deployment")
                if d["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"}
    with ExitStack() as stack:
        processes = Processes(stack, tmp_path)
        emulators = {(p["llm"], p["replica"]): _start_emulator(processes, llms[p["llm"]], engine) for p in plan["placement"]}
        worker_urls = _replica_urls(objects, emulators, namespace)
        gateway_urls = {llm: _start_gateway(processes, deployment, worker_urls) for llm, deployment in sorted(gateways.items())}
        sent: Counter = Counter()
        for llm, url in gateway_urls.items():
            sent[llm] += _send(url, llm, serving_task(llms[llm]["model"]), engine)
        served: Counter = Counter()
        for (llm, _), url in emulators.items():
            served[llm] += _served(url)
    # every LLM with a gateway got exactly its requests; the others (vLLM's reranker) none
    assert served == sent, (served, sent)
    assert set(gateways) == {m for m in llms if engine == "sglang" or serving_task(llms[m]["model"]) != "score"}
    assert all(sent[m] > 0 for m in gateways)


def test_a_gateway_started_before_its_engines_serves_once_they_answer(tmp_path):
    """In a cluster the gateway pod is ready in seconds and the engines after minutes of loading:
    the gateway must keep retrying its workers (--worker-startup-timeout-secs) and report not ready
    meanwhile (its readiness probe keeps the LLM's Service from sending traffic to it), then serve."""
    case = next(c for c in CASES if (c.instance, c.plan_kind, c.engine) == ("beam-4xa6000", "whole", "vllm"))
    objects = objects_of(regenerate.emit(case))
    plan = json.loads(regenerate.plan_path(case).read_text())
    llms = {m["name"]: m for m in plan["llms"]}
    gateway = next(d for d in of_kind(objects, "Deployment") if d["metadata"]["name"] == "gen-gateway")
    namespace = objects[0]["metadata"]["name"]
    ports = {(p["llm"], p["replica"]): free_port() for p in plan["placement"] if p["llm"] == "gen"}
    worker_urls = _replica_urls(objects, {k: f"http://127.0.0.1:{port}" for k, port in ports.items()} | {
        (p["llm"], p["replica"]): "http://127.0.0.1:9" for p in plan["placement"] if p["llm"] != "gen"}, namespace)
    with ExitStack() as stack:
        processes = Processes(stack, tmp_path)
        container = gateway["spec"]["template"]["spec"]["containers"][0]
        args, url = _local_args(container["args"], worker_urls)
        processes.start([sys.executable, *container["command"][1:], *args])
        _poll(lambda: (r := _get(url + "/liveness")) is not None and r.status_code == 200, READY_LIMIT_S, "gateway liveness")
        waiting = _get(url + "/readiness")
        assert waiting is not None and waiting.status_code == 503  # no engine yet: not ready, but alive
        for (llm, _), port in ports.items():
            argv = [sys.executable, "-m", "scepsy", "emulate", "--model", llms[llm]["model"], "--gpu", llms[llm]["gpu_type"],
                    "--tp", str(llms[llm]["tp"]), "--served-model-name", llm, "--speedup", "1000", "--port", str(port)]
            processes.start(argv)

        def ready() -> bool:
            response = _get(url + "/readiness")
            return response is not None and response.status_code == 200 and response.json()["healthy_workers"] == len(ports)

        _poll(ready, READY_LIMIT_S, "gateway after its engines started")
        assert _send(url, "gen", "generate", "vllm") == 2 * REQUESTS_PER_KIND


def test_the_gateway_cannot_front_a_vllm_reranker(tmp_path):
    """Why a vLLM reranker has no gateway (k8s/gateway.py): gateway 0.3.2 forwards rerank requests
    with the model `unknown` (vLLM: 404) and parses the answer as SGLang's bare list (vLLM answers
    {"results": [...]}). If a gateway release fixes this, this test fails and the exception can go."""
    with ExitStack() as stack:
        processes = Processes(stack, tmp_path)
        llm = {"name": "rerank", "model": "BAAI/bge-reranker-base", "gpu_type": "H100", "tp": 1, "fraction": 0.7}
        worker = _start_emulator(processes, llm, "vllm")
        port, metrics_port = free_port(), free_port()
        processes.start([sys.executable, *GATEWAY_COMMAND[1:], "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
                         "--worker-urls", worker, "--prometheus-port", str(metrics_port)])
        url = f"http://127.0.0.1:{port}"
        _poll(lambda: (r := _get(url + "/readiness")) is not None and r.status_code == 200, READY_LIMIT_S, "gateway")
        body = {"model": "rerank", "query": "q", "documents": ["a", "b"]}
        assert httpx.post(url + "/v1/rerank", json=body, timeout=120.0).status_code == 404  # model forwarded as `unknown`
        assert httpx.post(url + "/rerank", json=body, timeout=120.0).status_code == 500  # vLLM's shape not parsed
        assert httpx.post(worker + "/v1/rerank", json=body, timeout=120.0).status_code == 200  # the engine itself answers
