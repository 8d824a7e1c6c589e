"""What the SGLang model gateway (the real binary of PyPI `sglang-router`, the release the manifests
pin) passes on of the `priority` the workflow entry sets (`scepsy proxy --workflow-priority`): the
request body's `priority` of a completions call reaches the engine, whole seconds since the epoch
included; the gateway's chat completions route rebuilds the body without it, so behind this
gateway only completions calls carry their workflow's start (docs/deploy.md says so). A release
that forwards it on chat too fails the second assertion: the docs then need changing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import contextmanager

import httpx
import pytest

from support.ports import free_port
from support.scripted import ScriptedEngine

from scepsy.tracing.capture.proxy import ServerThread

pytestmark = pytest.mark.slow

READY_LIMIT_S = 300.0  # generous: a loaded machine starts the gateway slowly
PRIORITY = 1_764_790_000  # a workflow request's start, whole seconds since the epoch


def _bodies(engine: ScriptedEngine, path: str) -> list[dict]:
    return [json.loads(r["body"]) for r in engine.received if r["path"] == path]


@contextmanager
def _gateway(worker_url: str):
    """The real gateway binary routing to `worker_url`, ready once it routes a call; yields its URL."""
    port = free_port()
    gateway = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", worker_url, "--host", "127.0.0.1",
         "--port", str(port), "--prometheus-port", str(free_port())],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_LIMIT_S
        answer = None
        while time.monotonic() < deadline:
            try:
                answer = httpx.post(f"{url}/v1/completions", json={"model": "gen", "prompt": "x", "max_tokens": 1}, timeout=10)
                if answer.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert answer is not None and answer.status_code == 200, answer
        yield url
    finally:
        gateway.terminate()
        gateway.wait(timeout=60)


def test_the_sglang_gateway_forwards_priority_on_completions_and_drops_it_on_chat():
    engine = ScriptedEngine(token_delay_s=0.001)
    with ServerThread(engine.app()) as worker:
        engine.url = worker.url
        with _gateway(worker.url) as url:
            completion = {"model": "gen", "prompt": "x", "max_tokens": 2, "priority": PRIORITY}
            assert httpx.post(f"{url}/v1/completions", json=completion, timeout=60).status_code == 200
            chat = {"model": "gen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "priority": PRIORITY}
            assert httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60).status_code == 200
    assert _bodies(engine, "/v1/completions")[-1]["priority"] == PRIORITY
    assert "priority" not in _bodies(engine, "/v1/chat/completions")[-1]


def test_behind_the_entry_the_engine_sees_each_completions_calls_workflow_start_and_no_chat_priority():
    """What reaches the engine through the deployed path: the entry (`scepsy proxy
    --workflow-priority`, in process), then the real gateway binary. A completions call arrives
    with its workflow request's start, also when the client set another `priority`; a chat call
    arrives without one, so the entry's hold alone orders those (docs/deploy.md)."""
    from scepsy.tracing.capture.proxy import ProxyConfig, create_app

    engine = ScriptedEngine(token_delay_s=0.001)
    with ServerThread(engine.app()) as worker:
        engine.url = worker.url
        with _gateway(worker.url) as gateway_url, ServerThread(create_app(ProxyConfig({"gen": gateway_url}, workflow_priority=True))) as entry:
            headers = {"X-Workflow-Id": "wf-1"}
            completion = {"model": "gen", "prompt": "x", "max_tokens": 2, "priority": -5}
            assert httpx.post(f"{entry.url}/gen/v1/completions", json=completion, headers=headers, timeout=60).status_code == 200
            tagged = _bodies(engine, "/v1/completions")[-1]
            chat = {"model": "gen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            assert httpx.post(f"{entry.url}/gen/v1/chat/completions", json=chat, headers=headers, timeout=60).status_code == 200
    assert isinstance(tagged["priority"], int) and abs(tagged["priority"] - time.time()) < 3600  # the start, not the client's -5
    assert "priority" not in _bodies(engine, "/v1/chat/completions")[-1]
