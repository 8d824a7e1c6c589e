"""The tracing proxy: a transparent reverse proxy in front of OpenAI-compatible engines (ASGI, aiohttp).

Routing. A request for `/<llm>/v1/<endpoint>` goes to the upstream named `<llm>`; a request for
`/v1/<endpoint>` goes to the upstream whose name equals the body's `model` field, or to the only
upstream when there is one. Endpoints: chat/completions, completions, embeddings, rerank, score
(traced) and models (passed through, not traced; `/v1/models` without a prefix lists the models of
every upstream). `GET /metrics` serves the entry's Prometheus metrics: workflow requests arrived
and the durations of finished ones, per workflow (entry_metrics.py). Anything else is answered 404
with a JSON error.

Transparency. The request body is forwarded unchanged, with the client's headers except hop-by-hop
ones and `Accept-Encoding` (set to `identity`, so the proxy can read usage from the response); the
proxy adds none of its own (no User-Agent, Accept or Content-Type defaults).
The response status, headers and body bytes go back unchanged, each chunk as soon as it arrives
(no buffering). An unreachable upstream is answered 502, an upstream that does not answer within
`timeout_s` is answered 504, both with a JSON error; an upstream that breaks a stream midway makes
the proxy drop the client connection too, so the client sees a broken response, never a truncated
one that looks complete.

Recording. Every traced call -- whatever its outcome, including client disconnects -- becomes one
`CallRecord` handed to the store's queue when the call ends. The workflow request id is the
`X-Workflow-Id` header, else the trace id of a W3C `traceparent` header, else none; the workflow
name is the `X-Workflow-Name` header. No header is recorded other than these two; in particular
Authorization and API keys never reach the store. Both are read as UTF-8 (HTTP carries header
values as bytes; a server hands them over as Latin-1) and capped: a value that is not UTF-8, holds
control characters or is longer than MAX_WORKFLOW_HEADER_CHARS is answered 400 without being
forwarded, so one client cannot store a name that slows every later report down.
Bodies are stored up to `max_body_bytes` each (default 16 MiB); a larger one is left out of the
record, whose `request_bytes` and `response_bytes` still give the sizes.

Workflow priority (`workflow_priority`, the entry of a deployment whose engines schedule by
priority). The proxy then sets the JSON body's `priority` of every chat or completions call to its
workflow request's start: the wall-clock time of its first call through this proxy, in whole
seconds since the Unix epoch (an integer that fits the 32-bit fields of gateways that parse
request bodies; calls of equal priority are served in their arrival order). A call without a
workflow request id is neither left behind every workflow (SGLang serves untagged calls last and
lets tagged ones preempt them) nor put ahead of older ones: a chat call that continues an earlier
one's conversation (its `messages` begin with all of that call's messages, or equal them) takes
that call's start, as a workflow request's later calls do, while the conversation has had a call
that ended within `workflow_done_s`; any other call starts a workflow request of its own when it arrives
(ConversationStarts). Stamping each call anew would put a conversation's later calls behind every
workflow that started meanwhile, and after a burst that loses their cached prefixes. A `priority` the client set is replaced, so that no client jumps
the queue, unless the operator trusts the clients' (`trust_client_priority`). Engines
that serve lower values first (vLLM `--scheduling-policy priority`; SGLang
`--enable-priority-scheduling --schedule-low-priority-values-first`) then serve older workflow
requests first, so that a burst cannot leave every workflow's next call queued behind newer ones
(models/simulation/simulator.py, docs/deploy.md). A workflow request keeps its start however long
it runs and however long it pauses between calls: the proxy remembers the starts of the
MAX_TRACKED_WORKFLOWS workflow requests seen most recently (about 150 bytes each). The body is
then re-encoded (same JSON, compact separators); the recorded request body is the one sent.

Calls in flight (`max_in_flight`, LLM name -> N: the entry's hold, `scepsy plan` prints N per LLM).
At most N of an LLM's traced calls are outstanding upstream; the others wait in the proxy and go
on, as calls finish, oldest workflow request first (its start, then the call's arrival; a call
without a workflow request id counts as a workflow starting when it arrives). Routers that rebuild
the request body without `priority` (the SGLang model gateway's chat completions route) then still
leave the engines a bounded queue, so that after a burst the calls that wait are at the entry, in
the order of their workflows' age (models/simulation/entry.py models it). Past MAX_HELD_CALLS
waiting calls of one LLM a call is answered 429 with `Retry-After`.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import heapq
import itertools
import json
import math
import os
import re
import threading
import time
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Iterable, Mapping, Protocol, Self

import aiohttp
import uvicorn
from starlette.datastructures import Headers

from scepsy.models.errors import InputError
from scepsy.models.performance.replica import PRIORITY_UNIT_S
from scepsy.tracing.capture.entry_metrics import WORKFLOW_DONE_S, EntryMetrics
from scepsy.tracing.capture.records import CallRecord
from scepsy.tracing.capture.sse import summarize_json, summarize_stream, time_of_offset

TRACED_ENDPOINTS = ("chat/completions", "completions", "embeddings", "rerank", "score")
PASSED_ENDPOINTS = ("models",)
HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
        "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding",
    }
)
RESPONSE_DROP = frozenset({"connection", "keep-alive", "transfer-encoding", "trailer", "upgrade"})
WORKFLOW_ID_HEADER = "x-workflow-id"
WORKFLOW_NAME_HEADER = "x-workflow-name"
MAX_WORKFLOW_HEADER_CHARS = 256
DEFAULT_MAX_BODY_BYTES = 16 * 2**20
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
PRIORITY_ENDPOINTS = ("/v1/chat/completions", "/v1/completions")  # the OpenAI requests that carry `priority` in vLLM and SGLang
MAX_TRACKED_WORKFLOWS = 1_000_000  # workflow request starts remembered, least recently seen forgotten first
METRICS_PATH = "/metrics"  # the entry's Prometheus metrics (entry_metrics.py)
_ENDPOINT = re.compile(r"^/(?:(?P<llm>[^/]+)/)?v1/(?P<endpoint>chat/completions|completions|embeddings|rerank|score|models)/?$")


class Clock:
    """Wall-clock seconds with perf_counter resolution: anchored once, then monotonic."""

    def __init__(self) -> None:
        self._wall0 = time.time()
        self._perf0 = time.perf_counter()

    def now(self) -> float:
        return self._wall0 + (time.perf_counter() - self._perf0)


KEEP_ALIVE_S = 75  # an idle client connection's life at the proxy (serve)
MAX_HELD_CALLS = 10_000  # calls of one LLM waiting at the entry, past which it answers 429
RETRY_AFTER_S = 1


class InFlightLimit:
    """At most `limit` holders at once; the others wait and are let in lowest key first."""

    def __init__(self, limit: int, max_waiting: int = MAX_HELD_CALLS):
        self.limit = limit
        self.max_waiting = max_waiting
        self.active = 0
        self._waiting: list[tuple[float, int, asyncio.Future]] = []
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(1 for *_, future in self._waiting if not future.done())

    def full(self) -> bool:
        return self.active >= self.limit and len(self._waiting) >= self.max_waiting

    async def acquire(self, key: float) -> None:
        if self.active < self.limit and not self._waiting:
            self.active += 1
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (key, next(self._order), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # the slot came as the waiter left: pass it on
            raise

    def release(self) -> None:
        """Hand the slot to the lowest waiting key, or free it."""
        while self._waiting:
            *_, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)
                return
        self.active -= 1


class WorkflowStarts:
    """The start of each workflow request seen (wall-clock seconds of its first call), kept however
    long the request runs; beyond `limit` entries the least recently seen request is forgotten."""

    def __init__(self, limit: int = MAX_TRACKED_WORKFLOWS):
        self.limit = limit
        self._starts: OrderedDict[str, float] = OrderedDict()  # id -> start, least recently seen first

    def __len__(self) -> int:
        return len(self._starts)

    def __contains__(self, workflow_id: str) -> bool:
        return workflow_id in self._starts

    def start_of(self, workflow_id: str, now_s: float) -> float:
        start_s = self._starts.setdefault(workflow_id, now_s)
        self._starts.move_to_end(workflow_id)
        if len(self._starts) > self.limit:
            self._starts.popitem(last=False)
        return start_s


class ConversationStarts:
    """The start of each untagged chat conversation, found by its message lists: a call whose
    messages begin with (or equal) those of a call that ended (or arrived) within `idle_s` takes
    that call's start; others start when they arrive. Each call's whole message list is remembered (a SHA-256 chain
    over its messages, so that every prefix is one digest), at most `limit` of them."""

    def __init__(self, idle_s: float, limit: int = MAX_TRACKED_WORKFLOWS):
        self.idle_s = idle_s
        self.limit = limit
        self._seen: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # digest -> (start, last call), oldest last call first

    def __len__(self) -> int:
        return len(self._seen)

    @staticmethod
    def digests(messages: list) -> list[bytes]:
        """The digest of each prefix of `messages` (one per length, 1 to all)."""
        chain, out = b"", []
        for message in messages:
            chain = hashlib.sha256(chain + json.dumps(message, sort_keys=True, separators=(",", ":")).encode()).digest()
            out.append(chain)
        return out

    def start_of(self, messages: list, now_s: float) -> tuple[float, bytes | None]:
        """The conversation's start, and the key to `ended()` once the call has ended."""
        while self._seen and next(iter(self._seen.values()))[1] < now_s - self.idle_s:
            self._seen.popitem(last=False)
        digests = self.digests(messages)
        start_s = next((self._seen[d][0] for d in reversed(digests) if d in self._seen), now_s)
        if not digests:
            return start_s, None
        self.ended(digests[-1], start_s, now_s)
        if len(self._seen) > self.limit:
            self._seen.popitem(last=False)
        return start_s, digests[-1]

    def ended(self, key: bytes, start_s: float, now_s: float) -> None:
        """The conversation of `key` had a call in flight until `now_s` (idle counts from then)."""
        self._seen.pop(key, None)
        self._seen[key] = (start_s, now_s)


def untagged_start(conversations: ConversationStarts, payload: dict | None, now_s: float) -> tuple[float, bytes | None]:
    """The start of a call without a workflow request id: its conversation's, for a chat call (and
    the conversation's key, None for other calls)."""
    messages = payload.get("messages") if payload is not None else None
    if isinstance(messages, list) and messages:
        return conversations.start_of(messages, now_s)
    return now_s, None


def with_priority(body: bytes, payload: dict, start_s: float, keep_client: bool = False) -> bytes:
    """The body with `priority` set to the workflow request's start in whole PRIORITY_UNIT_S since
    the epoch (lower values are served first), replacing the client's unless `keep_client`."""
    priority = math.floor(start_s / PRIORITY_UNIT_S)
    if keep_client and "priority" in payload:
        return body
    return json.dumps({**payload, "priority": priority}, separators=(",", ":")).encode()


class HeaderError(ValueError):
    """A workflow header the proxy will not record (answered 400)."""


def workflow_header(headers: Mapping[str, str], name: str) -> str | None:
    """The header's value as UTF-8 text (stripped; None when absent or empty); HeaderError when it
    is not UTF-8, holds control characters or is longer than MAX_WORKFLOW_HEADER_CHARS."""
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        text = raw.encode("latin-1").decode("utf-8").strip()
    except UnicodeError:
        raise HeaderError(f"{name} is not UTF-8 text") from None
    if len(text) > MAX_WORKFLOW_HEADER_CHARS:
        raise HeaderError(f"{name} is longer than {MAX_WORKFLOW_HEADER_CHARS} characters")
    if any(unicodedata.category(c) == "Cc" for c in text):
        raise HeaderError(f"{name} holds control characters")
    return text or None


def workflow_request_id(headers: Mapping[str, str]) -> str | None:
    """X-Workflow-Id, else the trace id of a valid W3C traceparent, else None (HeaderError: see
    workflow_header)."""
    explicit = workflow_header(headers, WORKFLOW_ID_HEADER)
    if explicit:
        return explicit
    match = _TRACEPARENT.match((headers.get("traceparent") or "").strip().lower())
    if match and match.group(1) != "0" * 32:
        return match.group(1)
    return None


def _json_error(status: int, message: str, kind: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return status, headers, body


def _json_object(body: bytes) -> dict | None:
    """The request body as a JSON object, or None; parsed once per request (prompts can be large)."""
    if not body:
        return None
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


async def _send_whole(send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class RecordSink(Protocol):
    """Where the proxy puts each call record (a TraceStore, a queue.Queue, ...)."""

    def put(self, record: CallRecord) -> None: ...


@dataclass
class ProxyConfig:
    upstreams: dict[str, str]  # llm name -> base URL (without /v1)
    store: RecordSink | None = None  # anything with put(CallRecord): a TraceStore, a queue...
    record_bodies: bool = True
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger bodies are not stored (their sizes are)
    timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    clock: Clock = field(default_factory=Clock)
    workflow_priority: bool = False  # tag calls with their workflow request's start (module doc)
    trust_client_priority: bool = False  # with workflow_priority: keep a `priority` the client set
    max_in_flight: dict[str, int] = field(default_factory=dict)  # llm -> its calls outstanding upstream at most
    workflow_done_s: float = WORKFLOW_DONE_S  # a workflow request idle this long counts as finished (entry_metrics.py)

    def __post_init__(self) -> None:
        self.upstreams = {name: url.rstrip("/") for name, url in self.upstreams.items()}


def parse_upstreams(items: Iterable[str]) -> dict[str, str]:
    """LLM name -> engine base URL from NAME=URL items (the command line's `--upstream`)."""
    upstreams: dict[str, str] = {}
    for item in items:
        name, sep, url = item.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise InputError(None, "upstreams", f"{item!r} is not NAME=URL", "write e.g. gen=http://127.0.0.1:8001")
        if name in upstreams:
            raise InputError(None, "upstreams", f"llm {name!r} given twice", "name each upstream once")
        upstreams[name] = url
    if not upstreams:
        raise InputError(None, "upstreams", "no upstream given", "give NAME=URL for each LLM")
    return upstreams


def parse_in_flight(items: Iterable[str], upstreams: Mapping[str, str]) -> dict[str, int]:
    """LLM name -> calls in flight from LLM=N items (the command line's `--max-in-flight`)."""
    limits: dict[str, int] = {}
    for item in items:
        name, _, count = item.partition("=")
        if name not in upstreams:
            raise InputError(None, "max_in_flight", f"{item!r} names no upstream", f"write LLM=N for one of: {', '.join(sorted(upstreams))}")
        if not count.isdigit() or int(count) < 1:
            raise InputError(None, "max_in_flight", f"{item!r} is not LLM=N with N >= 1", "write e.g. ver=14 (scepsy plan prints N per LLM)")
        limits[name] = int(count)
    return limits


class _Call:
    """The state of one proxied call while it runs, turned into a CallRecord at its end."""

    def __init__(self, config: ProxyConfig, llm: str, path: str, headers: Mapping[str, str], body: bytes,
                 payload: dict | None, start_s: float):
        self.config = config
        self.llm = llm
        self.path = path
        self.start_s = start_s
        self.workflow_id = workflow_request_id(headers)
        self.workflow = workflow_header(headers, WORKFLOW_NAME_HEADER)
        self.request_body = body
        self.model, self.stream = None, False
        if payload is not None:
            self.model = payload.get("model") if isinstance(payload.get("model"), str) else None
            self.stream = payload.get("stream") is True
        self.status = 0
        self.outcome = "ok"
        self.error: str | None = None
        self.chunks: list[bytes] = []
        self.chunk_times: list[float] = []
        self.event_stream = False

    def record(self) -> CallRecord:
        end_s = self.config.clock.now()
        body = b"".join(self.chunks)
        ttft_s = None
        if self.event_stream:
            summary = summarize_stream(body)
            if summary.first_text_offset is not None:
                ends = list(accumulate(map(len, self.chunks)))
                arrived = time_of_offset(summary.first_text_offset, ends, self.chunk_times)
                ttft_s = arrived - self.start_s if arrived is not None else None
        else:
            summary = summarize_json(body)
        keep = self.config.record_bodies
        limit = self.config.max_body_bytes
        return CallRecord(
            call_id=os.urandom(16).hex(),
            llm=self.llm,
            path=self.path,
            start_s=self.start_s,
            end_s=end_s,
            status=self.status,
            outcome=self.outcome,
            workflow=self.workflow,
            workflow_id=self.workflow_id,
            model=self.model,
            stream=self.stream or self.event_stream,
            ttft_s=ttft_s,
            prompt_tokens=summary.prompt_tokens,
            completion_tokens=summary.completion_tokens,
            usage_source=summary.usage_source,
            request_body=self.request_body if keep and len(self.request_body) <= limit else None,
            response_body=body if keep and len(body) <= limit else None,
            error=self.error,
            request_bytes=len(self.request_body),
            response_bytes=len(body),
        )


class ProxyEndpoint:
    """The ASGI endpoint that forwards one request and records it.

    Upstream requests go through one aiohttp session (its C HTTP parser keeps the cost per
    streamed chunk low); its read timeout applies between chunks, so a long stream that keeps
    sending never times out.
    """

    def __init__(self, config: ProxyConfig):
        self.config = config
        self.session: aiohttp.ClientSession | None = None
        self.starts = WorkflowStarts()
        self.conversations = ConversationStarts(config.workflow_done_s)
        self.limits = {llm: InFlightLimit(limit) for llm, limit in config.max_in_flight.items()}
        self.metrics = EntryMetrics(self.starts.limit, config.workflow_done_s)

    def open(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s, sock_read=self.config.timeout_s)
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ttl_dns_cache=None)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False,
            skip_auto_headers=("User-Agent", "Content-Type", "Accept"),
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    def route(self, path: str, payload: dict | None) -> tuple[str | None, str, str | None]:
        """(llm or None for all, upstream path, error message or None)."""
        match = _ENDPOINT.match(path)
        if match is None:
            return None, path, f"unknown endpoint {path}; the proxy serves /v1/{{{', '.join(TRACED_ENDPOINTS + PASSED_ENDPOINTS)}}}"
        upstream_path = f"/v1/{match.group('endpoint')}"
        llm = match.group("llm")
        names = sorted(self.config.upstreams)
        if llm is not None:
            if llm not in self.config.upstreams:
                return None, upstream_path, f"unknown llm {llm!r} in the path; known: {', '.join(names)}"
            return llm, upstream_path, None
        if match.group("endpoint") == "models":
            return None, upstream_path, None
        model = payload.get("model") if payload is not None else None
        if isinstance(model, str) and model in self.config.upstreams:
            return model, upstream_path, None
        if len(names) == 1:
            return names[0], upstream_path, None
        return None, upstream_path, (
            f"cannot route model {model!r}: use a path prefix /<llm>/v1/... or a model field naming one of: {', '.join(names)}"
        )

    @staticmethod
    def _upstream_headers(headers: Headers) -> list[tuple[str, str]]:
        forwarded = [(k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP]
        forwarded.append(("accept-encoding", "identity"))
        return forwarded

    async def __call__(self, scope, receive, send) -> None:
        start_s = self.config.clock.now()
        if scope["method"] not in ("GET", "POST"):
            await _send_whole(send, *_json_error(405, f"method {scope['method']} not allowed; use GET or POST", "method_not_allowed"))
            return
        if scope["path"] == METRICS_PATH and scope["method"] == "GET":
            text, kind = self.metrics.exposition(start_s)
            await _send_whole(send, 200, [(b"content-type", kind.encode()), (b"content-length", str(len(text)).encode())], text)
            return
        headers = Headers(scope=scope)
        body = await _read_body(receive)
        if body is None:
            return  # the client left before it had sent its request
        payload = _json_object(body)
        llm, upstream_path, problem = self.route(scope["path"], payload)
        if problem is not None:
            await _send_whole(send, *_json_error(404, problem, "not_found"))
            return
        if llm is None:
            await self._list_models(headers, send)
            return
        url = self.config.upstreams[llm] + upstream_path
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        if upstream_path == "/v1/models":
            await self._forward_untraced((scope["method"], url, self._upstream_headers(headers), body), send)
            return
        try:
            call = _Call(self.config, llm, upstream_path, headers, body, payload, start_s)
        except HeaderError as exc:
            await _send_whole(send, *_json_error(400, f"{exc}; send a short UTF-8 workflow name and id", "invalid_workflow_header"))
            return
        new = call.workflow_id is not None and call.workflow_id not in self.starts
        conversation = None
        if call.workflow_id is not None:
            workflow_start_s = self.starts.start_of(call.workflow_id, start_s)
        elif self.config.workflow_priority or llm in self.limits:  # the start orders the call: find its conversation's
            workflow_start_s, conversation = untagged_start(self.conversations, payload, start_s)
        else:
            workflow_start_s = start_s
        if self.config.workflow_priority and payload is not None and upstream_path in PRIORITY_ENDPOINTS:
            body = call.request_body = with_priority(body, payload, workflow_start_s, self.config.trust_client_priority)
        upstream = (scope["method"], url, self._upstream_headers(headers), body)
        self.metrics.call_started(call.workflow_id, call.workflow, workflow_start_s, new)  # at arrival: demand, before any hold
        try:
            await self._held_and_forwarded(call, llm, upstream, workflow_start_s, receive, send)
        finally:
            self.metrics.call_ended(call.workflow_id, self.config.clock.now())
            if conversation is not None:
                self.conversations.ended(conversation, workflow_start_s, self.config.clock.now())

    async def _held_and_forwarded(self, call: _Call, llm: str, upstream: tuple, workflow_start_s: float, receive, send) -> None:
        """Forward the call once the LLM's entry limit lets it go (429 when too many wait), and record it."""
        limit = self.limits.get(llm)
        if limit is not None and limit.full():
            status, error_headers, error = _json_error(
                429, f"{limit.max_waiting} calls of {llm} are waiting at the entry; retry later", "too_many_requests")
            await _send_whole(send, status, [*error_headers, (b"retry-after", str(RETRY_AFTER_S).encode())], error)
            return
        if limit is not None:
            await limit.acquire(workflow_start_s)
        try:
            await self._forward(call, upstream, receive, send)
        finally:
            if limit is not None:
                limit.release()
            if self.config.store is not None:
                self.config.store.put(call.record())

    def _client(self) -> aiohttp.ClientSession:
        if self.session is None:
            raise RuntimeError("the proxy forwards calls only after its startup opened the upstream session")
        return self.session

    async def _open(self, upstream: tuple) -> aiohttp.ClientResponse:
        method, url, headers, body = upstream
        return await self._client().request(method, url, headers=headers, data=body or None, allow_redirects=False)

    async def _forward(self, call: _Call, upstream: tuple, receive, send) -> None:
        try:
            response = await self._open(upstream)
        except asyncio.TimeoutError as exc:
            call.status, call.outcome, call.error = 504, "timeout", f"upstream timeout: {type(exc).__name__}"
            await _send_whole(send, *_json_error(504, f"upstream {call.llm} did not answer in time", "upstream_timeout"))
            return
        except (aiohttp.ClientError, OSError) as exc:
            call.status, call.outcome, call.error = 502, "upstream_error", f"{type(exc).__name__}: {exc}"
            await _send_whole(send, *_json_error(502, f"upstream {call.llm} unreachable: {type(exc).__name__}", "upstream_error"))
            return
        call.status = response.status
        call.event_stream = response.headers.get("content-type", "").startswith("text/event-stream")
        completed = False
        try:
            headers = [(k, v) for k, v in response.raw_headers if k.decode("latin-1").lower() not in RESPONSE_DROP]
            await send({"type": "http.response.start", "status": response.status, "headers": headers})
            streaming = asyncio.ensure_future(self._stream(call, response, send))
            listening = asyncio.ensure_future(_wait_for_disconnect(receive))
            try:
                await asyncio.wait((streaming, listening), return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (streaming, listening):
                    task.cancel()
                await asyncio.gather(streaming, listening, return_exceptions=True)
            completed = streaming.done() and not streaming.cancelled() and streaming.result()
            if not completed and listening.done() and not listening.cancelled() and call.outcome == "ok":
                call.outcome, call.error = "client_disconnect", "the client closed the connection before the end"
        except OSError as exc:  # the client's socket failed under us
            if call.outcome == "ok":
                call.outcome, call.error = "client_disconnect", f"{type(exc).__name__}: {exc}"
        finally:
            if completed:
                response.release()
            else:
                response.close()  # drop the upstream connection: the rest of the body is unwanted
        # A stream the upstream broke: return without completing the response, so the server drops
        # the client's connection and the client sees the failure.

    async def _stream(self, call: _Call, response: aiohttp.ClientResponse, send) -> bool:
        """Pass the body on chunk by chunk; True when it was passed on whole."""
        clock, chunks, times = self.config.clock, call.chunks, call.chunk_times
        try:
            async for chunk in response.content.iter_any():
                if chunk:
                    times.append(clock.now())
                    chunks.append(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except asyncio.TimeoutError as exc:
            call.outcome, call.error = "timeout", f"upstream stalled: {type(exc).__name__}"
            return False
        except (aiohttp.ClientError, OSError) as exc:
            call.outcome, call.error = "upstream_error", f"{type(exc).__name__}: {exc}"
            return False
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True

    async def _forward_untraced(self, upstream: tuple, send) -> None:
        try:
            async with await self._open(upstream) as response:
                content = await response.read()
                headers = [(k, v) for k, v in response.raw_headers if k.decode("latin-1").lower() not in RESPONSE_DROP]
                status = response.status
        except asyncio.TimeoutError:
            await _send_whole(send, *_json_error(504, "upstream did not answer in time", "upstream_timeout"))
            return
        except (aiohttp.ClientError, OSError) as exc:
            await _send_whole(send, *_json_error(502, f"upstream unreachable: {type(exc).__name__}", "upstream_error"))
            return
        await _send_whole(send, status, headers, content)

    async def _list_models(self, request_headers: Headers, send) -> None:
        """GET /v1/models without a prefix: the union of every upstream's list (in name order)."""
        headers = self._upstream_headers(request_headers)

        async def one(name: str) -> list[dict]:
            try:
                async with self._client().get(self.config.upstreams[name] + "/v1/models", headers=headers) as response:
                    payload = json.loads(await response.read()) if response.status == 200 else None
                data = payload.get("data") if isinstance(payload, dict) else None
                if isinstance(data, list):
                    return data
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
                pass
            return [{"id": name, "object": "model", "owned_by": "scepsy-proxy"}]

        names = sorted(self.config.upstreams)
        lists = await asyncio.gather(*(one(name) for name in names))
        body = json.dumps({"object": "list", "data": [m for models in lists for m in models]}).encode()
        await _send_whole(send, 200, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body)


async def _read_body(receive) -> bytes | None:
    """The request body, or None when the client disconnects before sending all of it."""
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(parts)


async def _wait_for_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class ProxyApp:
    """The proxy as a plain ASGI application: HTTP goes to the endpoint, lifespan opens and closes it.

    No web framework in between: the proxy has a single catch-all route, and a framework's router
    and middleware layers cost ~0.1 ms per request (measured), a tenth of the added-latency budget.
    """

    def __init__(self, config: ProxyConfig):
        self.config = config
        self.endpoint = ProxyEndpoint(config)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            await self.endpoint(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.endpoint.open()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.endpoint.close()
                # uvicorn runs this after draining the connections and then re-raises SIGTERM,
                # which ends the process without running anyone's `finally`: write every record now.
                flush = getattr(self.config.store, "flush", None)
                if flush is not None:
                    await asyncio.to_thread(flush)
                await send({"type": "lifespan.shutdown.complete"})
                return


def create_app(config: ProxyConfig) -> ProxyApp:
    return ProxyApp(config)


class ServerThread:
    """Run an ASGI app under uvicorn in a background thread (tests, benchmarks, the e2e run)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, **uvicorn_options):
        options: dict[str, Any] = {"log_level": "warning", "access_log": False, "lifespan": "on"}
        options.update(uvicorn_options)
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, **options))
        setattr(self.server, "install_signal_handlers", lambda: None)  # older uvicorn: no handlers off the main thread
        self.thread = threading.Thread(target=self.server.run, name="scepsy-uvicorn", daemon=True)
        self.host = host

    def start(self, timeout_s: float = 10.0) -> Self:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(config: ProxyConfig, host: str = "127.0.0.1", port: int = 9000) -> None:
    """Run the proxy in the foreground until interrupted (the `scepsy proxy` command)."""
    app = create_app(config)
    # Everything alive now (modules, the app) lives as long as the process: keep it out of the
    # collector's full passes, which otherwise pause every stream for ~20 ms now and then.
    gc.collect()
    gc.freeze()
    # proxy_headers off: the proxy reads no X-Forwarded-* header, so uvicorn need not rewrite the scope.
    # Idle keep-alive connections are kept KEEP_ALIVE_S, longer than clients keep theirs (httpx, the
    # openai SDK's: 5 s), so that the client closes first: a server that closes at the moment a
    # client reuses the connection fails that call ("Connection error"), as uvicorn's 5 s default did
    # under load.
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, proxy_headers=False,
                timeout_keep_alive=KEEP_ALIVE_S)
