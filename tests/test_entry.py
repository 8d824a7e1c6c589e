"""The workflow entry the manifests emit (k8s/entry.py), run as its Deployment says: the emitted
command line, started with the real `scepsy` CLI on loopback in front of a scripted engine, tags
each call with its workflow request's start and holds each LLM's calls at the plan's entry limit."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from k8s_support import CASES, objects_of, regenerate
from support.ports import free_port
from support.scripted import ScriptedEngine

from scepsy.k8s.entry import NAME, entry_limits
from scepsy.k8s.plan_input import load_placed_plan
from scepsy.tracing.capture.proxy import ServerThread

READY_LIMIT_S = 120.0  # generous: a loaded machine imports scepsy slowly


def _entry(case_name: str) -> tuple[dict, list[str]]:
    case = next(c for c in CASES if c.name == case_name)
    objects = objects_of(regenerate.emit(case))
    (deployment,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == NAME]
    (service,) = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == NAME]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["scepsy"] and deployment["spec"]["replicas"] == 1
    # Prometheus scrapes the entry's /metrics on its pod's serving port
    (monitor,) = [o for o in objects if o["kind"] == "PodMonitor" and o["metadata"]["name"] == NAME]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert [(e["port"], e["path"]) for e in monitor["spec"]["podMetricsEndpoints"]] == [("http", "/metrics")]
    assert "http" in {p["name"] for p in container["ports"]}
    return deployment, list(container["args"])


def test_the_entry_holds_each_llm_at_the_plans_entry_limit():
    case = next(c for c in CASES if c.name == "beam-4xa6000-vllm-hami-controller")
    _, args = _entry(case.name)
    limits = entry_limits(load_placed_plan(regenerate.plan_path(case)))
    assert set(limits) == {"gen", "ver"} and all(n >= 1 for n in limits.values())
    assert [args[i + 1] for i, a in enumerate(args) if a == "--max-in-flight"] == [f"{k}={v}" for k, v in sorted(limits.items())]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--upstream"] == [
        "gen=http://gen.scepsy.svc:30000", "ver=http://ver.scepsy.svc:30000"]


@pytest.mark.slow
def test_the_emitted_entry_command_tags_calls_with_their_workflows_start_and_counts_it():
    _, args = _entry("beam-4xa6000-vllm-hami-controller")
    engine = ScriptedEngine(token_delay_s=0.001)
    with ServerThread(engine.app()) as worker:
        engine.url = worker.url
        port = free_port()
        # what differs from the cluster: loopback addresses for the pod's and the Services'
        local = [f"{a.split('=')[0]}={worker.url}" if i and args[i - 1] == "--upstream" else a for i, a in enumerate(args)]
        local[local.index("--host") + 1] = "127.0.0.1"
        local[local.index("--port") + 1] = str(port)
        entry = subprocess.Popen([sys.executable, "-m", "scepsy", *local], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            url = f"http://127.0.0.1:{port}/ver/v1/chat/completions"
            body = {"model": "ver", "messages": [{"role": "user", "content": "score"}], "max_tokens": 1}
            workflow = {"X-Workflow-Id": "req-1", "X-Workflow-Name": "beam"}
            deadline = time.monotonic() + READY_LIMIT_S
            answer = None
            while time.monotonic() < deadline and entry.poll() is None:
                try:
                    answer = httpx.post(url, json=body, headers=workflow, timeout=30)
                    break
                except httpx.TransportError:
                    time.sleep(0.2)
            assert answer is not None and answer.status_code == 200, answer
            again = httpx.post(url, json=body, headers=workflow, timeout=30)
            assert again.status_code == 200
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
            assert 'scepsy_entry_requests_total{workflow="beam"} 1.0' in metrics  # one workflow request, two calls
        finally:
            entry.terminate()
            entry.wait(timeout=60)
    first, second = (json.loads(r["body"]) for r in engine.received[-2:])
    assert isinstance(first["priority"], int) and first["priority"] == second["priority"]
