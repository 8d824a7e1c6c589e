"""The tracing proxy against real loopback servers, with the real openai client: nothing lost, nothing altered."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time

import httpx
import openai
import pytest

from scepsy.tracing.capture.proxy import Clock, ProxyConfig, ServerThread, create_app, workflow_request_id
from scepsy.tracing.capture.store import TraceStore, read_store

from tracing_fixtures import Recorder, engine, proxied, usage_of, wait_for  # noqa: F401 - fixtures

CHAT = {"model": "gen", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5}


def test_non_streaming_chat_is_passed_through_and_recorded(proxied):
    url, recorder, engine = proxied
    client = openai.OpenAI(base_url=f"{url}/gen/v1", api_key="sk-test-secret", max_retries=0)
    response = client.chat.completions.create(
        model="gen", messages=CHAT["messages"], max_tokens=5, extra_headers={"X-Workflow-Id": "req-1", "X-Workflow-Name": "beam"}
    )
    assert response.choices[0].message.content == "tok0 tok1 tok2 tok3 tok4 "
    wait_for(lambda: recorder.records)
    (record,) = recorder.records
    assert (record.llm, record.path, record.workflow, record.workflow_id) == ("gen", "/v1/chat/completions", "beam", "req-1")
    assert (record.status, record.outcome, record.stream) == (200, "ok", False)
    assert (record.prompt_tokens, record.completion_tokens, record.usage_source) == (usage_of(response).prompt_tokens, 5, "usage")
    assert record.end_s > record.start_s and record.ttft_s is None
    # the upstream got the body unchanged and the client's Authorization (forwarded, never stored)
    assert json.loads(engine.received[-1]["body"]) == json.loads(record.request_body)
    assert engine.received[-1]["headers"]["authorization"] == "Bearer sk-test-secret"
    assert json.loads(record.response_body)["choices"][0]["message"]["content"] == "tok0 tok1 tok2 tok3 tok4 "


def test_bytes_identical_to_direct_streamed_and_not(proxied):
    url, recorder, engine = proxied
    for payload in (CHAT, {**CHAT, "stream": True}, {"model": "gen", "prompt": "x", "max_tokens": 4, "stream": True}):
        path = "/v1/chat/completions" if "messages" in payload else "/v1/completions"
        direct = httpx.post(engine.url + path, json=payload)
        proxied_response = httpx.post(f"{url}/gen{path}", json=payload)
        assert proxied_response.status_code == direct.status_code == 200
        assert proxied_response.content == direct.content
        assert proxied_response.headers["content-type"] == direct.headers["content-type"]
    wait_for(lambda: len(recorder.records) == 3)
    # the recorded response body is exactly what the client got
    assert recorder.records[-1].response_body == proxied_response.content


def test_streaming_with_openai_client_records_ttft_and_tokens(proxied):
    url, recorder, engine = proxied
    client = openai.OpenAI(base_url=f"{url}/gen/v1", api_key="k", max_retries=0)
    stream = client.chat.completions.create(model="gen", messages=CHAT["messages"], max_tokens=6, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "".join(f"tok{i} " for i in range(6))
    stream = client.chat.completions.create(
        model="gen", messages=CHAT["messages"], max_tokens=3, stream=True, stream_options={"include_usage": True}
    )
    usage = [chunk.usage for chunk in stream if chunk.usage]
    wait_for(lambda: len(recorder.records) == 2)
    without, with_usage = recorder.records
    assert (without.stream, without.completion_tokens, without.prompt_tokens, without.usage_source) == (True, 6, None, "stream_events")
    assert 0 < without.ttft_s < without.latency_s
    assert (with_usage.completion_tokens, with_usage.prompt_tokens, with_usage.usage_source) == (3, usage[0].prompt_tokens, "usage")


def test_chunks_are_forwarded_as_they_arrive(engine):
    """Pass-through proven by order, not by time: the upstream holds back every token after the
    first until the client has received that first token through the proxy. A proxy that buffered
    the stream would never deliver it, and the upstream's wait would run out instead."""
    engine.gate = threading.Event()
    recorder = Recorder()
    received = b""
    with ServerThread(create_app(ProxyConfig({"gen": engine.url}, store=recorder))) as proxy:
        with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json={**CHAT, "max_tokens": 5, "stream": True}) as response:
            for chunk in response.iter_raw():
                received += chunk
                if b"tok0" in received and not engine.gate.is_set():
                    assert b"tok1" not in received  # the rest is still held upstream
                    engine.gate.set()
    assert engine.gate_waits == [True]  # the client's receipt opened the gate
    assert b"tok4" in received and received.rstrip().endswith(b"data: [DONE]")
    wait_for(lambda: recorder.records)
    assert 0 < recorder.records[0].ttft_s < recorder.records[0].latency_s


def test_routing_by_model_field_and_errors(proxied):
    url, recorder, engine = proxied
    assert httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "model": "ver"}).status_code == 200
    wait_for(lambda: recorder.records)
    assert recorder.records[0].llm == "ver"
    unknown = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "model": "other"})
    assert unknown.status_code == 404 and "gen, ver" in unknown.json()["error"]["message"]
    assert httpx.post(f"{url}/nope/v1/chat/completions", json=CHAT).status_code == 404
    assert httpx.post(f"{url}/gen/v1/images/generations", json=CHAT).status_code == 404
    wrong_method = httpx.put(f"{url}/gen/v1/chat/completions", json=CHAT)
    assert wrong_method.status_code == 405 and "use GET or POST" in wrong_method.json()["error"]["message"]
    assert len(recorder.records) == 1  # routing errors are not LLM calls


def test_models_listing_merges_upstreams(proxied):
    url, recorder, engine = proxied
    listing = httpx.get(f"{url}/v1/models").json()
    assert [m["id"] for m in listing["data"]] == ["scripted", "scripted"]
    assert httpx.get(f"{url}/gen/v1/models").json()["data"][0]["id"] == "scripted"
    assert recorder.records == []


def test_embeddings_and_rerank_are_traced(proxied):
    url, recorder, engine = proxied
    client = openai.OpenAI(base_url=f"{url}/gen/v1", api_key="k", max_retries=0)
    client.embeddings.create(model="gen", input=["a b c", "d e"])
    httpx.post(f"{url}/gen/v1/rerank", json={"model": "gen", "query": "q", "documents": ["a b", "c"]})
    wait_for(lambda: len(recorder.records) == 2)
    embed, rerank = recorder.records
    assert (embed.path, embed.prompt_tokens, embed.completion_tokens) == ("/v1/embeddings", 5, None)
    assert (rerank.path, rerank.prompt_tokens) == ("/v1/rerank", 3)


def test_upstream_error_status_and_body_pass_through(proxied):
    url, recorder, engine = proxied
    client = openai.OpenAI(base_url=f"{url}/gen/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.APIStatusError) as failure:
        client.chat.completions.create(model="gen", messages=CHAT["messages"], extra_headers={"X-Script-Status": "503"})
    assert failure.value.status_code == 503
    body = failure.value.body
    assert isinstance(body, dict), body
    assert body["message"] == "scripted failure" or body.get("error", {}).get("message") == "scripted failure"
    wait_for(lambda: recorder.records)
    assert (recorder.records[0].status, recorder.records[0].outcome) == (503, "ok")


def test_slow_upstream_times_out_with_504(proxied):
    url, recorder, engine = proxied  # the proxy's timeout is 1 s
    response = httpx.post(f"{url}/gen/v1/chat/completions", json=CHAT, headers={"X-Script-Delay-S": "3"}, timeout=10)
    assert response.status_code == 504 and response.json()["error"]["type"] == "upstream_timeout"
    wait_for(lambda: recorder.records)
    assert (recorder.records[0].status, recorder.records[0].outcome) == (504, "timeout")
    # a slow upstream within the timeout is just slow
    assert httpx.post(f"{url}/gen/v1/chat/completions", json=CHAT, headers={"X-Script-Delay-S": "0.3"}).status_code == 200


def test_unreachable_upstream_is_502():
    recorder = Recorder()
    with ServerThread(create_app(ProxyConfig({"gen": "http://127.0.0.1:9"}, store=recorder))) as proxy:
        response = httpx.post(f"{proxy.url}/v1/chat/completions", json=CHAT)
    assert response.status_code == 502 and response.json()["error"]["type"] == "upstream_error"
    assert (recorder.records[0].status, recorder.records[0].outcome) == (502, "upstream_error")


def test_client_disconnect_mid_stream_is_recorded(engine):
    """Proved by ordering, not by timing: the upstream holds every token after the first until
    the gate opens, and the gate opens only after the call is recorded; so the proxy recorded the
    call without reading the upstream stream to its end (it closed it on the disconnect)."""
    engine.gate = threading.Event()
    engine.gate_timeout_s = 120.0  # longer than wait_for: a proxy that waited for the stream fails
    recorder = Recorder()
    with ServerThread(create_app(ProxyConfig({"gen": engine.url}, store=recorder))) as proxy:
        with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json={**CHAT, "max_tokens": 40, "stream": True}) as response:
            received = b""
            for chunk in response.iter_raw():
                received += chunk
                if b"tok0" in received:
                    break
        wait_for(lambda: recorder.records)
        engine.gate.set()
        # the proxy keeps serving afterwards
        assert httpx.post(f"{proxy.url}/v1/chat/completions", json=CHAT).status_code == 200
        wait_for(lambda: len(recorder.records) == 2)
    record = recorder.records[0]
    assert record.outcome == "client_disconnect" and record.status == 200
    assert b"tok1" not in record.response_body and b"[DONE]" not in record.response_body
    assert record.response_body.startswith(received[: len(received) // 2])


def test_upstream_breaking_a_stream_breaks_the_client_response(proxied):
    url, recorder, engine = proxied
    with pytest.raises(httpx.HTTPError):
        with httpx.stream("POST", f"{url}/gen/v1/chat/completions", json={**CHAT, "stream": True},
                          headers={"X-Script-Break-After": "2"}) as response:
            for _ in response.iter_raw():
                pass
    wait_for(lambda: recorder.records)
    assert recorder.records[0].outcome == "upstream_error"


def test_workflow_id_from_traceparent():
    assert workflow_request_id({"x-workflow-id": " abc "}) == "abc"
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert workflow_request_id({"traceparent": f"00-{trace}-00f067aa0ba902b7-01"}) == trace
    assert workflow_request_id({"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"}) is None
    assert workflow_request_id({"traceparent": "garbage"}) is None
    assert workflow_request_id({}) is None


def test_concurrent_streams_to_sqlite_store_nothing_lost(engine, tmp_path):
    store = TraceStore(tmp_path / "t.db")
    with ServerThread(create_app(ProxyConfig({"gen": engine.url}, store=store))) as proxy:

        async def one(i: int, client: httpx.AsyncClient) -> bytes:
            body = {**CHAT, "max_tokens": 4, "stream": i % 2 == 0}
            response = await client.post(f"{proxy.url}/v1/chat/completions", json=body, headers={
                "X-Workflow-Id": f"w{i % 10}", "Authorization": "Bearer sk-never-stored"})
            return response.content

        async def main():
            async with httpx.AsyncClient(timeout=30) as client:
                return await asyncio.gather(*(one(i, client) for i in range(60)))

        bodies = asyncio.run(main())
    store.close()
    records = list(read_store(tmp_path / "t.db"))
    assert len(records) == 60 and all(r.outcome == "ok" and r.status == 200 for r in records)
    assert sorted(r.response_body or b"" for r in records) == sorted(bodies)
    assert sum(r.stream for r in records) == 30
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert b"sk-never-stored" not in raw and b"authorization" not in raw.lower()
    with sqlite3.connect(tmp_path / "t.db") as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_no_bodies_mode(engine):
    recorder = Recorder()
    with ServerThread(create_app(ProxyConfig({"gen": engine.url}, store=recorder, record_bodies=False))) as proxy:
        httpx.post(f"{proxy.url}/v1/chat/completions", json={**CHAT, "stream": True})
        wait_for(lambda: recorder.records)
    record = recorder.records[0]
    assert record.request_body is None and record.response_body is None
    assert record.completion_tokens == 5 and record.ttft_s is not None  # still measured


def test_workflow_headers_are_utf8_capped_and_validated(proxied):
    url, recorder, engine = proxied
    name = "Beam-Suche \u00e4\u540d"
    ok = httpx.post(f"{url}/gen/v1/chat/completions", json=CHAT,
                    headers=[(b"x-workflow-name", name.encode("utf-8")), (b"x-workflow-id", b"r-1")])
    assert ok.status_code == 200
    wait_for(lambda: recorder.records)
    assert recorder.records[0].workflow == name  # UTF-8 kept, not read as Latin-1 (mojibake)
    received = len(engine.received)
    for header, value in [(b"x-workflow-name", b"w" * 257), (b"x-workflow-name", b"\xff\xfe"),
                          (b"x-workflow-id", b"a\tb"), (b"x-workflow-id", b"i" * 5000)]:
        response = httpx.post(f"{url}/gen/v1/chat/completions", json=CHAT, headers=[(header, value)])
        assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_workflow_header"
    # a header past the HTTP server's own limit never reaches the proxy
    assert httpx.post(f"{url}/gen/v1/chat/completions", json=CHAT, headers={"x-workflow-name": "w" * 100_000}).status_code >= 400
    assert len(engine.received) == received and len(recorder.records) == 1  # nothing forwarded or recorded


def test_bodies_over_the_bound_are_left_out_with_their_sizes(engine):
    recorder = Recorder()
    config = ProxyConfig({"gen": engine.url}, store=recorder, max_body_bytes=2000)
    with ServerThread(create_app(config)) as proxy:
        small = httpx.post(f"{proxy.url}/v1/chat/completions", json=CHAT)
        big_body = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
        big = httpx.post(f"{proxy.url}/v1/chat/completions", json=big_body)
        wait_for(lambda: len(recorder.records) == 2)
    assert small.status_code == big.status_code == 200
    first, second = recorder.records
    assert first.request_body is not None and first.request_bytes == len(first.request_body)
    assert second.request_body is None and second.request_bytes > 5000  # recorded, by size only
    assert second.response_body is not None and second.response_bytes == len(big.content)


def test_workflow_priority_tags_each_call_with_its_workflow_requests_start(engine):
    """With workflow_priority the upstream sees every chat/completions call of a workflow request
    carry that request's first call's start as `priority` (s since the epoch, lower first), newer
    workflow requests larger values; a call without a workflow request id counts as a workflow
    request starting when it arrives, and a client's own priority is replaced."""
    recorder = Recorder()
    config = ProxyConfig({"gen": engine.url}, store=recorder, workflow_priority=True)
    with ServerThread(create_app(config)) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/gen/v1", api_key="k", max_retries=0)

        def chat(workflow_id: str | None, **extra) -> dict:
            headers = {"X-Workflow-Id": workflow_id} if workflow_id else {}
            client.chat.completions.create(model="gen", messages=CHAT["messages"], max_tokens=2,
                                           extra_headers=headers, extra_body=extra or None)
            return json.loads(engine.received[-1]["body"])

        first = chat("wf-1")
        other = chat("wf-2")
        again = chat("wf-1")
        completion = client.completions.create(model="gen", prompt="x", max_tokens=2, extra_headers={"X-Workflow-Id": "wf-1"})
        assert completion.choices
        tagged_completion = json.loads(engine.received[-1]["body"])
        own = chat("wf-3", priority=-5)
        untagged = chat(None)
    assert isinstance(first["priority"], int) and abs(first["priority"] - time.time()) < 3600 and first["priority"] < 2**31
    assert again["priority"] == tagged_completion["priority"] == first["priority"] <= other["priority"]
    assert other["priority"] <= own["priority"] <= untagged["priority"]  # nobody jumps, nobody is left untagged
    assert {k: v for k, v in again.items() if k != "priority"} == {**CHAT, "max_tokens": 2}
    # the record holds the body the upstream got
    wait_for(lambda: len(recorder.records) == 6)
    assert json.loads(recorder.records[0].request_body) == first


class SteppedClock(Clock):
    """The proxy's clock, moved by the test."""

    def __init__(self, now_s: float):
        super().__init__()
        self.now_s = now_s

    def now(self) -> float:
        return self.now_s


def test_the_operator_may_trust_the_clients_priority_and_a_long_workflow_keeps_its_start(engine):
    """With trust_client_priority a client's own priority reaches the upstream; a workflow request
    whose next call comes two hours after its last still carries its first call's start, ahead of a
    workflow request that started in between."""
    clock = SteppedClock(1_764_790_000.0)
    config = ProxyConfig({"gen": engine.url}, store=Recorder(), workflow_priority=True, trust_client_priority=True, clock=clock)
    with ServerThread(create_app(config)) as proxy:
        def chat(workflow_id: str, **extra) -> dict:
            body = {**CHAT, "max_tokens": 2, **extra}
            answer = httpx.post(f"{proxy.url}/gen/v1/chat/completions", json=body, headers={"X-Workflow-Id": workflow_id}, timeout=60)
            assert answer.status_code == 200
            return json.loads(engine.received[-1]["body"])

        own = chat("wf-0", priority=-5)
        first = chat("wf-1")
        clock.now_s += 7200.0
        newer = chat("wf-2")
        later = chat("wf-1")
    assert own["priority"] == -5
    assert later["priority"] == first["priority"] == 1_764_790_000 < newer["priority"] == 1_764_797_200


def test_an_untagged_chat_call_takes_the_start_of_the_conversation_it_continues(engine):
    """Without a workflow id, a chat call whose messages continue an earlier call's (or repeat
    them) carries that call's start; another conversation starts when it arrives, and so does a
    conversation idle for longer than workflow_done_s."""
    clock = SteppedClock(1_764_790_000.0)
    config = ProxyConfig({"gen": engine.url}, store=Recorder(), workflow_priority=True, clock=clock, workflow_done_s=30.0)
    question = [{"role": "system", "content": "solve"}, {"role": "user", "content": "2+2?"}]
    with ServerThread(create_app(config)) as proxy:
        def chat(messages: list, after_s: float) -> int:
            clock.now_s += after_s
            answer = httpx.post(f"{proxy.url}/gen/v1/chat/completions", json={"model": "gen", "messages": messages, "max_tokens": 2}, timeout=60)
            assert answer.status_code == 200
            return json.loads(engine.received[-1]["body"])["priority"]

        first = chat(question, 0.0)
        step = [*question, {"role": "assistant", "content": "Let me add."}, {"role": "user", "content": "go on"}]
        continued = chat(step, 20.0)
        forked = chat(step, 5.0)  # a sibling beam: the same messages
        deeper = chat([*step, {"role": "assistant", "content": "4"}, {"role": "user", "content": "check"}], 25.0)
        other = chat([question[0], {"role": "user", "content": "3+3?"}], 1.0)
        paused = chat([*step, {"role": "assistant", "content": "4"}], 31.0)  # more than workflow_done_s after its last call
    assert continued == forked == deeper == first == 1_764_790_000
    assert other == 1_764_790_051 and paused == 1_764_790_082


def test_conversation_starts_are_bounded():
    from scepsy.tracing.capture.proxy import ConversationStarts

    starts = ConversationStarts(idle_s=1e9, limit=2)
    conversations = [[{"role": "user", "content": str(k)}] for k in range(3)]
    for k, messages in enumerate(conversations):
        assert starts.start_of(messages, float(k))[0] == float(k)
    assert len(starts) == 2 and starts.start_of(conversations[0], 9.0)[0] == 9.0  # the first was forgotten
    assert starts.start_of(conversations[2] + [{"role": "assistant", "content": "x"}], 10.0)[0] == 2.0


def test_a_conversation_is_idle_from_its_last_calls_end():
    """A call that waited in a backlog for longer than idle_s: its conversation's next call,
    arriving soon after it ended, keeps the start."""
    from scepsy.tracing.capture.proxy import ConversationStarts

    starts = ConversationStarts(idle_s=30.0)
    opening = [{"role": "user", "content": "q"}]
    start_s, key = starts.start_of(opening, 100.0)
    assert key is not None
    starts.ended(key, start_s, 190.0)  # answered 90 s after it arrived
    assert starts.start_of([*opening, {"role": "assistant", "content": "a"}], 200.0)[0] == 100.0


def test_workflow_starts_are_kept_while_the_workflow_runs_and_bounded():
    from scepsy.tracing.capture.proxy import WorkflowStarts

    starts = WorkflowStarts(limit=3)
    assert starts.start_of("a", 100.0) == 100.0
    assert starts.start_of("a", 105.0) == 100.0  # the same request keeps its start
    for k, name in enumerate("bc"):
        starts.start_of(name, 106.0 + k)
    assert starts.start_of("a", 100_000.0) == 100.0  # however long it paused
    starts.start_of("d", 100_001.0)
    assert len(starts) == 3 and "b" not in starts  # "b" was the least recently seen: forgotten
    assert starts.start_of("b", 100_002.0) == 100_002.0


def test_max_in_flight_holds_an_llms_calls_and_lets_the_oldest_workflow_go_first(engine):
    """One call may be outstanding: while a streamed call is held upstream, calls of a newer and an
    older workflow request wait at the proxy, and the older one reaches the upstream first (by
    order: the upstream releases the stream once both wait at the proxy)."""
    import asyncio as aio

    engine.gate = threading.Event()
    app = create_app(ProxyConfig({"gen": engine.url}, store=Recorder(), max_in_flight={"gen": 1}))
    limit = app.endpoint.limits["gen"]
    with ServerThread(app) as proxy:
        url = f"{proxy.url}/gen/v1/chat/completions"

        async def scenario() -> list[int]:
            async with httpx.AsyncClient(timeout=120) as client:
                assert (await client.post(url, json=CHAT, headers={"X-Workflow-Id": "old"})).status_code == 200
                held = aio.create_task(client.post(url, json={**CHAT, "stream": True}, headers={"X-Workflow-Id": "w1"}))
                while not any(r["headers"].get("x-workflow-id") == "w1" for r in engine.received):
                    await aio.sleep(0.01)
                newer = aio.create_task(client.post(url, json=CHAT, headers={"X-Workflow-Id": "new"}))
                older = aio.create_task(client.post(url, json=CHAT, headers={"X-Workflow-Id": "old"}))
                while limit.waiting < 2:
                    await aio.sleep(0.01)
                assert engine.gate is not None
                engine.gate.set()
                return [a.status_code for a in await aio.gather(held, newer, older)]

        assert aio.run(scenario()) == [200, 200, 200]
    assert engine.gate_waits == [True]
    assert [r["headers"].get("x-workflow-id") for r in engine.received] == ["old", "w1", "old", "new"]


def test_max_in_flight_names_an_upstream_and_a_positive_count():
    from scepsy.models.errors import InputError
    from scepsy.tracing.capture.proxy import parse_in_flight

    assert parse_in_flight(["gen=3"], {"gen": "http://x"}) == {"gen": 3}
    for bad in ("ver=3", "gen=0", "gen=x", "gen"):
        with pytest.raises(InputError):
            parse_in_flight([bad], {"gen": "http://x"})


def _entry_metrics(url: str) -> dict[tuple[str, str], float]:
    """(sample name, workflow label) -> value, from the proxy's /metrics (the text format)."""
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(url + "/metrics", timeout=30)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {(s.name, s.labels.get("workflow", "")): s.value for family in text_string_to_metric_families(response.text)
            for s in family.samples if "le" not in s.labels and not s.name.endswith("_created")}


def test_entry_metrics_count_workflow_requests_at_arrival_also_while_held(engine):
    """A workflow request counts when its first call arrives, also while the entry holds it
    (`--max-in-flight`): with one stream held upstream, three workflow requests have arrived and
    none has finished. Once every call ended and the workflow requests were idle for
    `workflow_done_s`, each one's duration is observed once; a later call of a finished one and a
    call without a workflow request id count in neither."""
    import asyncio as aio

    engine.gate = threading.Event()
    app = create_app(ProxyConfig({"gen": engine.url}, max_in_flight={"gen": 1}, workflow_done_s=0.001))
    limit = app.endpoint.limits["gen"]
    beam = {"X-Workflow-Name": "beam"}
    with ServerThread(app) as proxy:
        url = f"{proxy.url}/gen/v1/chat/completions"

        async def scenario() -> dict:
            async with httpx.AsyncClient(timeout=120) as client:
                held = aio.create_task(client.post(url, json={**CHAT, "stream": True}, headers={**beam, "X-Workflow-Id": "w1"}))
                while not engine.received:
                    await aio.sleep(0.01)
                waiting = [aio.create_task(client.post(url, json=CHAT, headers={**beam, "X-Workflow-Id": w})) for w in ("w2", "w3")]
                while limit.waiting < 2:
                    await aio.sleep(0.01)
                seen = await aio.to_thread(_entry_metrics, proxy.url)
                assert engine.gate is not None
                engine.gate.set()
                assert [r.status_code for r in await aio.gather(held, *waiting)] == [200, 200, 200]
                return seen

        while_held = aio.run(scenario())
        assert while_held[("scepsy_entry_requests_total", "beam")] == 3.0
        assert ("scepsy_entry_request_duration_seconds_count", "beam") not in while_held  # none finished
        wait_for(lambda: _entry_metrics(proxy.url).get(("scepsy_entry_request_duration_seconds_count", "beam")) == 3.0)
        assert httpx.post(url, json=CHAT, headers={**beam, "X-Workflow-Id": "w1"}, timeout=60).status_code == 200
        assert httpx.post(url, json=CHAT, timeout=60).status_code == 200
        after = _entry_metrics(proxy.url)
    assert after[("scepsy_entry_requests_total", "beam")] == 3.0
    assert after[("scepsy_entry_request_duration_seconds_count", "beam")] == 3.0
    assert after[("scepsy_entry_request_duration_seconds_sum", "beam")] > 0


def test_entry_metrics_bound_the_workflow_names():
    from scepsy.tracing.capture.entry_metrics import MAX_WORKFLOW_LABELS, OTHER_WORKFLOW, EntryMetrics
    from scepsy.tracing.capture.proxy import MAX_TRACKED_WORKFLOWS

    metrics = EntryMetrics(MAX_TRACKED_WORKFLOWS, done_s=1.0)
    for k in range(MAX_WORKFLOW_LABELS + 5):
        metrics.call_started(f"id{k}", f"name{k}", 100.0, new=True)
        metrics.call_ended(f"id{k}", 101.0)
    metrics.call_started("unnamed", None, 100.0, new=True)
    metrics.call_ended("unnamed", 100.5)
    text = metrics.exposition(102.5)[0].decode()
    assert f'scepsy_entry_requests_total{{workflow="{OTHER_WORKFLOW}"}} 6.0' in text  # 5 past the bound + the unnamed one
    assert f'scepsy_entry_request_duration_seconds_count{{workflow="{OTHER_WORKFLOW}"}} 6.0' in text
    assert 'workflow="name105"' not in text
