"""A scripted OpenAI-compatible upstream for proxy tests and the proxy benchmark.

It answers chat/completions, completions (streamed or not), embeddings, rerank and models with
deterministic content: `max_tokens` tokens "tok0 tok1 ...", one SSE event per token, `token_delay_s`
apart, after `first_token_delay_s`. Request headers can script failures, so that one server covers
every case the proxy must pass through unchanged:

    X-Script-Status: 503        answer with this status and a JSON error
    X-Script-Delay-S: 2.5       wait this long before answering (slow upstream / timeout)
    X-Script-Break-After: 3     stream this many events, then drop the connection
    X-Script-Usage: 0           streams carry no usage chunk even when asked for one

With `gate` set to a threading.Event, every stream sends its first token and then waits until the
gate is opened (at most `gate_timeout_s`; `gate_waits` records for each wait whether the gate was
opened rather than timed out): tests order events with it instead of timing them.

With `serial=True` non-streamed generations are served one at a time (an asyncio lock), so the
server saturates at 1 / service time like a single llama.cpp slot.

It is a real HTTP server (Starlette under uvicorn), not a mock of one: it is used where the
behaviour under test is the proxy's, and a real engine would make the test slow or could not be
made to fail on demand. Every response carries an `x-script-request` header echoing the request body
length and its Authorization header's presence, so tests can check what the upstream received.
"""

from __future__ import annotations

import asyncio
import json
import threading

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def _tokens(count: int) -> list[str]:
    return [f"tok{i} " for i in range(count)]


class ScriptedEngine:
    def __init__(self, first_token_delay_s: float = 0.0, token_delay_s: float = 0.0, model: str = "scripted",
                 serial: bool = False):
        self.first_token_delay_s = first_token_delay_s
        self.token_delay_s = token_delay_s
        self.model = model
        self.serial = serial  # serve one generation at a time, like llama.cpp (capacity 1 / service time)
        self._lock: asyncio.Lock | None = None
        self.gate: threading.Event | None = None  # streams hold every token after the first until it is set
        self.gate_timeout_s = 30.0
        self.gate_waits: list[bool] = []  # per held stream: True when the gate opened, False on timeout
        self.received: list[dict] = []  # (path, headers, body, time) of every request, in arrival order
        self.url = ""  # where it serves, once a server runs it (tests set it)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.generate, methods=["POST"]),
                Route("/v1/completions", self.generate, methods=["POST"]),
                Route("/v1/embeddings", self.embeddings, methods=["POST"]),
                Route("/v1/rerank", self.rerank, methods=["POST"]),
                Route("/v1/score", self.rerank, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),  # what the SGLang gateway probes a worker with
            ]
        )

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _prelude(self, request: Request) -> tuple[dict, Response | None]:
        body = await request.body()
        self.received.append({"path": request.url.path, "headers": dict(request.headers), "body": body,
                              "time": asyncio.get_running_loop().time()})
        delay = float(request.headers.get("x-script-delay-s", "0"))
        if delay:
            await asyncio.sleep(delay)
        status = int(request.headers.get("x-script-status", "200"))
        if status != 200:
            return {}, JSONResponse({"error": {"message": "scripted failure", "code": status}}, status_code=status)
        try:
            return json.loads(body), None
        except ValueError:
            return {}, JSONResponse({"error": {"message": "body is not JSON", "code": 400}}, status_code=400)

    async def generate(self, request: Request) -> Response:
        payload, failure = await self._prelude(request)
        if failure is not None:
            return failure
        chat = request.url.path.endswith("chat/completions")
        tokens = _tokens(int(payload.get("max_tokens") or 16))
        prompt_tokens = len(json.dumps(payload.get("messages") or payload.get("prompt") or "").split())
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(tokens), "total_tokens": prompt_tokens + len(tokens)}
        ident = "cmpl-scripted"
        if not payload.get("stream"):
            if self.serial:
                self._lock = self._lock or asyncio.Lock()
                async with self._lock:
                    await asyncio.sleep(self.first_token_delay_s + self.token_delay_s * max(len(tokens) - 1, 0))
            else:
                await asyncio.sleep(self.first_token_delay_s + self.token_delay_s * max(len(tokens) - 1, 0))
            text = "".join(tokens)
            choice = {"index": 0, "finish_reason": "length"}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            body = {"id": ident, "object": "chat.completion" if chat else "text_completion", "model": self.model,
                    "choices": [choice], "usage": usage}
            return JSONResponse(body)
        include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
        include_usage = include_usage and request.headers.get("x-script-usage", "1") != "0"
        break_after = int(request.headers.get("x-script-break-after", "-1"))
        obj = "chat.completion.chunk" if chat else "text_completion"

        def event(choice: dict, extra: dict | None = None) -> bytes:
            data = {"id": ident, "object": obj, "model": self.model, "choices": [choice] if choice else []}
            data.update(extra or {})
            return b"data: " + json.dumps(data).encode() + b"\n\n"

        async def events():
            if chat:
                yield event({"index": 0, "delta": {"role": "assistant"}, "finish_reason": None})
            await asyncio.sleep(self.first_token_delay_s)
            for i, token in enumerate(tokens):
                if i == break_after:
                    raise ConnectionResetError("scripted break")
                if i == 1 and self.gate is not None:
                    self.gate_waits.append(await asyncio.to_thread(self.gate.wait, self.gate_timeout_s))
                if i:
                    await asyncio.sleep(self.token_delay_s)
                choice = {"index": 0, "delta": {"content": token}} if chat else {"index": 0, "text": token}
                choice["finish_reason"] = "length" if i == len(tokens) - 1 else None
                yield event(choice)
            if include_usage:
                yield event({}, {"usage": usage})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def embeddings(self, request: Request) -> Response:
        payload, failure = await self._prelude(request)
        if failure is not None:
            return failure
        inputs = payload.get("input")
        inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
        data = [{"object": "embedding", "index": i, "embedding": [float(len(text) % 7), 1.0, 0.5]} for i, text in enumerate(inputs)]
        tokens = sum(len(str(text).split()) for text in inputs)
        return JSONResponse({"object": "list", "data": data, "model": self.model,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def rerank(self, request: Request) -> Response:
        payload, failure = await self._prelude(request)
        if failure is not None:
            return failure
        documents = payload.get("documents") or []
        results = [{"index": i, "relevance_score": 1.0 / (1 + i)} for i in range(len(documents))]
        return JSONResponse({"id": "rerank-1", "model": self.model, "results": results,
                             "usage": {"total_tokens": sum(len(str(d).split()) for d in documents)}})

    async def models(self, request: Request) -> Response:
        await self._prelude(request)
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "scripted"}]})
