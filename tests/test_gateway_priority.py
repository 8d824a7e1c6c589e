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


def test_the_sglang_gateway_forwards_priority_on_completions_and_drops_it_on_chat():
    engine = ScriptedEngine(token_delay_s=0.001)
    with ServerThread(engine.app()) as worker:
        engine.url = worker.url
        port = free_port()
        gateway = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", worker.url, "--host", "127.0.0.1",
             "--port", str(port), "--prometheus-port", str(free_port())],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + READY_LIMIT_S
            answer = None
            while time.monotonic() < deadline:  # the gateway is ready once it routes a call
                try:
                    answer = httpx.post(f"{url}/v1/completions", json={"model": "gen", "prompt": "x", "max_tokens": 1}, timeout=10)
                    if answer.status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            assert answer is not None and answer.status_code == 200, answer
            completion = {"model": "gen", "prompt": "x", "max_tokens": 2, "priority": PRIORITY}
            assert httpx.post(f"{url}/v1/completions", json=completion, timeout=60).status_code == 200
            chat = {"model": "gen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "priority": PRIORITY}
            assert httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60).status_code == 200
        finally:
            gateway.terminate()
            gateway.wait(timeout=60)
    assert _bodies(engine, "/v1/completions")[-1]["priority"] == PRIORITY
    assert "priority" not in _bodies(engine, "/v1/chat/completions")[-1]
