"""Fixtures of the tracing tests: real HTTP servers on loopback (uvicorn in threads).

A plain module (not conftest.py) so that it merges with any project-wide conftest; test modules
import the fixtures they use.
"""

from __future__ import annotations

import pytest
from openai.types import CompletionUsage

from scepsy.tracing.capture.proxy import ProxyConfig, ServerThread, create_app
from support.scripted import ScriptedEngine


class Recorder:
    """A store stand-in that keeps records in memory (the SQLite store has its own tests)."""

    def __init__(self):
        self.records = []

    def put(self, record):
        self.records.append(record)


@pytest.fixture
def engine():
    scripted = ScriptedEngine(token_delay_s=0.002)
    with ServerThread(scripted.app()) as server:
        scripted.url = server.url
        yield scripted


@pytest.fixture
def proxied(engine):
    """(proxy url, recorder, engine) with upstreams gen and ver on the scripted engine."""
    recorder = Recorder()
    config = ProxyConfig({"gen": engine.url, "ver": engine.url}, store=recorder, timeout_s=1.0)
    with ServerThread(create_app(config)) as proxy:
        yield proxy.url, recorder, engine


def wait_for(condition, timeout_s: float = 30.0):
    """Poll until `condition()` is truthy (records are stored just after the response ends)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


def usage_of(response) -> CompletionUsage:
    """The usage of an OpenAI response or stream chunk: optional in the client's types, always
    sent by the servers under test (a missing one fails the test here)."""
    assert response.usage is not None, response
    return response.usage


def cached_tokens(response) -> int:
    """The prompt tokens a response says came from the prefix cache."""
    details = usage_of(response).prompt_tokens_details
    assert details is not None and details.cached_tokens is not None, response
    return details.cached_tokens
