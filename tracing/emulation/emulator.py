"""The engine emulator: an OpenAI-compatible server whose timing follows the engine model.

`scepsy emulate --model M --gpu G --tp T --fraction F --port P` serves what a vLLM replica of
model M on T shards of a fraction F of GPU G would serve, with the engine model's timing
(models/performance/engine.py) and the continuous-batching scheduler of models/performance/replica.py run in real time
(tracing/emulation/livereplica.py), for testing workflows, the proxy, the profiler and routers at scale
without GPUs. Content is deterministic filler text (tracing/emulation/tokenizer.py); token counts are an
approximation of a BPE tokenizer; the `usage` of every response is exact for what was emitted.

Endpoints (the request and response shapes of vLLM's OpenAI-compatible server):

    GET  /health, /v1/models, /metrics (Prometheus text, vLLM's metric names and labels; with
                                 the sglang personality SGLang's too: metrics.py)
    POST /v1/chat/completions, /v1/completions   decoders; streamed (SSE, one token per event,
                                                 a final usage chunk with stream_options.
                                                 include_usage) or not; n choices; list prompts
    POST /v1/embeddings                          encoder embedders (e5-...): float or base64
    POST /v1/rerank (/rerank, /v2/rerank)        encoders: Jina/Cohere format
    POST /v1/score (/score)                      encoders: text_1/text_2 pairs

Personality (`--personality`): `vllm` (default) serves only the endpoints above, as vLLM does (no
`/server_info`); `sglang` adds SGLang's metadata endpoints `GET /server_info`, `/model_info` (and
their deprecated `/get_server_info`, `/get_model_info`), which the SGLang model gateway reads when
it registers a worker (fields as SGLang's `http_server.py` returns them: the server arguments with
`model_path` and `served_model_name`; `model_path`, `tokenizer_path`, `is_generation`), and answers
`/v1/rerank` in SGLang's shape (a bare list of `{score, document, index, meta_info}`, best first)
instead of vLLM's (`{results: [{index, document, relevance_score}]}`); and, like SGLang, it serves a
request whatever its `model` field names (vLLM answers 404 for a model it does not serve).

Output length of a sequence. The cap is `max_tokens` (or `max_completion_tokens`), else what the
context leaves (`max_model_len - prompt`). The sequence runs to the cap unless an end of sequence
is drawn first: with `--mean-output-tokens N` (and for every request without a cap) each
sequence's natural length is drawn from a geometric distribution of mean N (default 256 for
uncapped requests) seeded by the request's content, and `ignore_eos: true` turns the draw off;
`min_tokens` is honoured; `stop` strings cut the filler text where they occur. finish_reason is
`length` at the cap, else `stop`.

Request content that only steers sampling or formatting (temperature, top_p, seed, tools,
response_format, logit_bias, ...) is accepted and changes nothing but the seed of the filler text;
`logprobs` are not produced (null), as by a server that does not return them.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import math
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import uvicorn
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from scepsy.models.catalog import catalog
from scepsy.models.catalog.catalog import GpuCard, ModelCard, encoder_task
from scepsy.models.catalog.model_config import resolve_model
from scepsy.models.performance.aiconfigurator import make_timer
from scepsy.models.performance.engine import DEFAULT_SETTINGS, Engine, EngineSettings, IterationTimer
from scepsy.models.errors import InputError
from scepsy.models.arguments import check_fraction

from scepsy.tracing.emulation import metrics
from scepsy.tracing.emulation.livereplica import BLOCK_TOKENS, LiveReplica, LiveSequence
from scepsy.tracing.emulation.tokenizer import (
    apply_stop,
    chat_units,
    filler_tokens,
    natural_length,
    prompt_units,
    request_seed,
    sequence_rng,
    token_units,
)

UNCAPPED_MEAN_OUTPUT_TOKENS = 256.0
ENCODER_SPECIAL_TOKENS = 2  # [CLS] text [SEP]
PAIR_SPECIAL_TOKENS = 4  # <s> query </s></s> document </s> (XLM-RoBERTa cross-encoders)
MAX_CHOICES = 128
PERSONALITIES = ("vllm", "sglang")


# ----------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class EmulatorConfig:
    """One emulated replica. Build it with `emulator_config` (which checks that it fits)."""

    model: ModelCard
    gpu: GpuCard
    tp: int = 1
    fraction: float = 1.0
    served_model_names: tuple[str, ...] = ()
    max_model_len: int = 0
    speedup: float = 1.0
    mean_output_tokens: float = 0.0  # 0: sequences with a cap run to it
    prefix_caching: bool = True
    settings: EngineSettings = DEFAULT_SETTINGS
    timer: IterationTimer | None = None  # another engine model (models/performance/aiconfigurator.py); None: the roofline
    personality: str = "vllm"  # which engine's extra endpoints to serve (PERSONALITIES)

    @property
    def engine(self) -> Engine:
        return Engine(self.model, self.gpu, self.tp, self.fraction, self.settings, timer=self.timer)

    @property
    def names(self) -> tuple[str, ...]:
        return self.served_model_names or (self.model.hf_id,)

    def describe(self) -> str:
        engine = self.engine
        what = f"{self.model.name} on {self.gpu.name} (tp {self.tp}, fraction {self.fraction:g})"
        if self.model.encoder:
            timing = f"{engine.prefill_time_s(128) * 1e3:.2f} ms per 128-token input alone"
            memory = f"encoder ({encoder_task(self.model)})"
        else:
            timing = f"single-stream decode {engine.decode_step_time_s(1, 512) * 1e3:.2f} ms/token at 512 tokens of context"
            memory = f"KV cache {engine.kv_capacity_gib:.2f} GiB = {engine.kv_capacity_tokens} tokens"
        caching = "prefix caching" if self.prefix_caching and not self.model.encoder else "no prefix caching"
        timed_by = f"; timed by {self.timer.describe()}" if self.timer is not None else ""
        return (f"{what}: {memory}, max_model_len {self.max_model_len}, {timing}, {caching}, "
                f"speedup {self.speedup:g}x; served as {', '.join(self.names)}{timed_by}")


def emulator_config(
    model: str,
    gpu: str,
    tp: int = 1,
    fraction: float = 1.0,
    served_model_names: tuple[str, ...] | list[str] = (),
    max_model_len: int | None = None,
    speedup: float = 1.0,
    mean_output_tokens: float = 0.0,
    prefix_caching: bool = True,
    settings: EngineSettings = DEFAULT_SETTINGS,
    weights: str | None = None,
    engine_model: str = "builtin",
    backend: str = "vllm",
    database_version: str = "current",
    personality: str = "vllm",
) -> EmulatorConfig:
    """Resolve catalog names (or a config.json) and check that the replica can run (InputError
    naming the argument); `engine_model` aiconfigurator times iterations from its database."""
    card, gpu_card = resolve_model(model, weights), catalog.gpu(gpu)
    if tp < 1 or card.heads % tp:
        raise InputError(None, "tp", f"{tp} does not divide the {card.heads} attention heads of {card.name}",
                         f"use one of: {', '.join(str(d) for d in range(1, card.heads + 1) if card.heads % d == 0 and d <= 8)}")
    check_fraction(fraction)
    if not (speedup > 0 and math.isfinite(speedup)):
        raise InputError(None, "speedup", f"{speedup:g} is not a positive number", "give e.g. 1 (real time) or 10")
    if personality not in PERSONALITIES:
        raise InputError(None, "personality", f"unknown personality {personality!r}", f"use one of: {', '.join(PERSONALITIES)}")
    if not mean_output_tokens >= 0:
        raise InputError(None, "mean_output_tokens", f"{mean_output_tokens:g} is negative", "give 0 (off) or a mean length")
    engine = Engine(card, gpu_card, tp, fraction, settings)
    if not engine.fits:
        usable = tp * fraction * gpu_card.memory_gib * settings.memory_utilization
        needed = card.weights_gib / (tp * gpu_card.memory_gib * settings.memory_utilization)
        raise InputError(
            None, "fraction",
            f"{card.name} needs {card.weights_gib:.2f} GiB of weights, but tp x fraction x {gpu_card.memory_gib:g} GiB x "
            f"{settings.memory_utilization:g} leaves {usable:.2f} GiB on {gpu_card.name}",
            f"use a `fraction` above {needed:.3f} at `tp` {tp}, or a larger `tp`",
        )
    limit = card.max_context if card.encoder else min(card.max_context, engine.kv_capacity_tokens)
    if not card.encoder and engine.kv_capacity_tokens < BLOCK_TOKENS:
        raise InputError(None, "fraction", f"the KV cache holds only {engine.kv_capacity_tokens} tokens",
                         "use a larger `fraction` or `tp`")
    if max_model_len is None:
        max_model_len = limit
    elif not 2 <= max_model_len <= limit:
        if limit == card.max_context:
            why, fix = "the model's context", f"give at most {limit}"
        else:
            why, fix = "the tokens the KV cache holds", f"give at most {limit}, or a larger `fraction` or `tp`"
        raise InputError(None, "max_model_len", f"{max_model_len} is outside 2..{limit} ({why})", fix)
    names = tuple(dict.fromkeys(n for n in served_model_names if n))
    timer = make_timer(engine_model, card, gpu_card, tp, backend, database_version)
    return EmulatorConfig(card, gpu_card, tp, fraction, names, max_model_len, speedup, mean_output_tokens,
                          prefix_caching, settings, timer, personality)


# ----------------------------------------------------------------------------------------------
# Request bodies (vLLM's field names; anything else is accepted and only seeds the filler)


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None


class _Sampling(_Body):
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: dict | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)

    @property
    def cap(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and (self.stream_options or {}).get("include_usage"))


class ChatBody(_Sampling):
    messages: list[dict] = Field(min_length=1)


class CompletionBody(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]


class EmbeddingBody(_Body):
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)


class RerankBody(_Body):
    query: str
    documents: list[str | dict]
    top_n: int = Field(default=0, ge=0)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)


class ScoreBody(_Body):
    text_1: str | list[str] | None = None
    text_2: str | list[str] | None = None
    data_1: str | list[str] | None = None
    data_2: str | list[str] | None = None
    queries: str | list[str] | None = None
    documents: str | list[str] | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)


class HttpError(Exception):
    """An error answered to the client in the OpenAI format."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}
        return JSONResponse(body, status_code=self.status)


def _validation_message(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "body"
    return f"{where}: {first.get('msg', 'invalid value')}"


# ----------------------------------------------------------------------------------------------
# Generation


@dataclass(eq=False)
class _Choice:
    """One sequence of a generation request, and what of it was sent already."""

    index: int
    prompt_index: int
    prompt_tokens: int
    token_texts: list[str]
    finish_reason: str
    stop_reason: str | None
    sequence: LiveSequence
    sent: int = 0

    @property
    def text(self) -> str:
        return "".join(self.token_texts)


def _token_texts(tokens: list[str], used: int, text: str) -> list[str]:
    """The text each of the first `used` tokens adds, clipped to the returned `text` (tokens of a
    stop string add nothing)."""
    texts, offset = [], 0
    for token in tokens[:used]:
        end = offset + len(token)
        texts.append(text[min(offset, len(text)):min(end, len(text))])
        offset = end
    return texts


def _sequence_plan(body: _Sampling, room: int, rng, default_mean: float) -> tuple[int, str]:
    """(tokens to generate before any stop string, finish reason) of one sequence; `room` is what
    the context leaves after the prompt (the cap of a request without max_tokens)."""
    cap = body.cap
    mean = default_mean
    if cap is None:
        cap = room
        mean = mean or UNCAPPED_MEAN_OUTPUT_TOKENS
    natural = natural_length(rng, mean) if mean > 0 and not body.ignore_eos else math.inf
    length = max(min(cap, natural), min(body.min_tokens, cap))
    return int(length), ("length" if length >= cap else "stop")


class Emulator:
    """The ASGI application of one emulated replica (create with `create_app`)."""

    def __init__(self, config: EmulatorConfig):
        self.config = config
        self._live: LiveReplica | None = None  # started with the app's lifespan
        self.started_s = int(time.time())
        self.requests_ok = 0
        self.finished: dict[str, int] = {}  # requests answered in full, by the finish reason of their first choice
        self.registry = metrics.registry(self.snapshot)

    # -- plumbing -------------------------------------------------------------------------------

    def snapshot(self) -> metrics.Snapshot:
        """The numbers `GET /metrics` exposes (tracing/emulation/metrics.py)."""
        live, config = self.live, self.config
        stats = live.stats
        return metrics.Snapshot(
            config.names[0], config.personality, live.running, live.waiting, live.kv_usage, live.replica.preemptions,
            stats.prompt_tokens, stats.generation_tokens, stats.cached_tokens, dict(self.finished), stats.iterations,
            live.busy_s, stats.aborted_sequences, stats.lag_s_max, stats.lag_s_mean, config.speedup)

    def finish(self, reason: str) -> None:
        """Count a request answered in full (vLLM's `vllm:request_success_total{finished_reason}`)."""
        self.requests_ok += 1
        self.finished[reason] = self.finished.get(reason, 0) + 1

    @property
    def live(self) -> LiveReplica:
        if self._live is None:
            raise RuntimeError("the emulator serves only after its lifespan started the live replica")
        return self._live

    @live.setter
    def live(self, replica: LiveReplica) -> None:
        self._live = replica

    async def _body(self, request: Request, schema: type[BaseModel]) -> tuple[Any, dict]:
        raw = await request.body()
        try:
            payload = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise HttpError(400, "the request body is not JSON") from None
        if not isinstance(payload, dict):
            raise HttpError(400, "the request body must be a JSON object")
        try:
            body: Any = schema.model_validate(payload)
        except ValidationError as error:
            raise HttpError(400, _validation_message(error)) from None
        # vLLM answers 404 for a model it does not serve; SGLang serves whatever `model` says
        # (the field "is only for compatibility with OpenAI API", sgl-project/sglang#4293)
        if self.config.personality == "vllm" and body.model is not None and body.model not in self.config.names:
            raise HttpError(404, f"The model `{body.model}` does not exist. Served: {', '.join(self.config.names)}.",
                            "NotFoundError", "model")
        return body, payload

    def _require(self, task: str, endpoint: str) -> None:
        """Refuse an endpoint the model does not serve: decoders generate; embedders embed and
        score; cross-encoders score."""
        model = self.config.model
        kind = encoder_task(model) if model.encoder else "generate"
        serves, what = {"generate": ({"generate"}, "decoder"), "embed": ({"embed", "score"}, "embedding model"),
                        "score": ({"score"}, "cross-encoder")}[kind]
        if task not in serves:
            raise HttpError(400, f"{model.name} does not serve the {endpoint} API (it is a {what})")

    @property
    def _name(self) -> str:
        return self.config.names[0]

    def _model_name(self, body: _Body) -> str:
        return body.model or self._name

    def _submit(self, notify: asyncio.Event, prompt: list[str], completion_tokens: int, output: list[str], stream: bool) -> LiveSequence:
        sequence = LiveSequence(notify=notify, completion_tokens=completion_tokens, units=prompt + output, stream=stream)
        return self.live.submit(sequence, len(prompt), prompt)

    # -- chat and completions ---------------------------------------------------------------

    async def chat(self, request: Request) -> Response | _EventStream:
        self._require("generate", "Chat Completions")
        body, payload = await self._body(request, ChatBody)
        return await self._generate(request, body, payload, [chat_units(body.messages)], chat=True)

    async def completions(self, request: Request) -> Response | _EventStream:
        self._require("generate", "Completions")
        body, payload = await self._body(request, CompletionBody)
        prompt = body.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompts = [prompt]
        else:
            prompts = list(prompt)
        if not prompts or any(len(p) == 0 for p in prompts if not isinstance(p, str)):
            raise HttpError(400, "prompt: empty")
        return await self._generate(request, body, payload, [prompt_units(p) for p in prompts], chat=False)

    def _check_length(self, prompt_tokens: int, cap: int | None) -> None:
        limit = self.config.max_model_len
        if prompt_tokens >= limit or (cap is not None and prompt_tokens + cap > limit):
            asked = f"{prompt_tokens} in the messages, {cap} in the completion" if cap else f"{prompt_tokens} in the prompt"
            raise HttpError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                 f"{prompt_tokens + (cap or 0)} tokens ({asked}). Please reduce the length of the "
                                 "messages or completion.", param="max_tokens" if cap else "messages")

    def _choices(self, body: _Sampling, payload: dict, prompts: list[list[str]], notify: asyncio.Event) -> list[_Choice]:
        """Plan every choice (its length, text and finish reason), then enter them all into the
        engine; a request that is too long for the context is refused before anything runs."""
        for units in prompts:
            self._check_length(len(units), body.cap)
        seed = request_seed(payload)
        room = [self.config.max_model_len - len(units) for units in prompts]
        choices = []
        for prompt_index, units in enumerate(prompts):
            for j in range(body.n):
                index = prompt_index * body.n + j
                length, finish = _sequence_plan(body, room[prompt_index], sequence_rng(seed, index, "eos"),
                                                self.config.mean_output_tokens)
                tokens = filler_tokens(sequence_rng(seed, index), length)
                used, text, stop = apply_stop(tokens, body.stops) if body.stops else (length, "".join(tokens), None)
                sequence = self._submit(notify, units, used, tokens[:used], body.stream)
                choices.append(_Choice(index, prompt_index, len(units), _token_texts(tokens, used, text),
                                       "stop" if stop else finish, stop, sequence))
        return choices

    def _usage(self, choices: list[_Choice]) -> dict:
        first: dict[int, _Choice] = {}
        for choice in choices:
            first.setdefault(choice.prompt_index, choice)
        prompt = sum(c.prompt_tokens for c in first.values())
        completion = sum(c.sequence.generated for c in choices)
        cached = sum(c.sequence.cached_tokens for c in first.values())
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    async def _generate(self, request: Request, body: _Sampling, payload: dict, prompts: list[list[str]], chat: bool) -> Response | _EventStream:
        notify = asyncio.Event()
        choices = self._choices(body, payload, prompts, notify)
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        header = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                  "created": int(time.time()), "model": self._model_name(body)}
        if body.stream:
            return _EventStream(self, choices, notify, header, chat, body.include_usage)
        finished = await _wait_all(request, notify, lambda: all(c.sequence.finished for c in choices))
        if not finished:
            for choice in choices:
                self.live.abort(choice.sequence)
            return Response(status_code=499)
        self.finish(choices[0].finish_reason)
        return JSONResponse(self._final(choices, header, chat))

    def _final(self, choices: list[_Choice], header: dict, chat: bool) -> dict:
        out = []
        for choice in choices:
            entry: dict[str, Any] = {"index": choice.index}
            if chat:
                entry["message"] = {"role": "assistant", "content": choice.text, "tool_calls": []}
            else:
                entry["text"] = choice.text
            entry.update({"logprobs": None, "finish_reason": choice.finish_reason, "stop_reason": choice.stop_reason})
            out.append(entry)
        return {**header, "object": "chat.completion" if chat else "text_completion", "choices": out,
                "usage": self._usage(choices)}

    # -- encoders ---------------------------------------------------------------------------

    def _fit(self, tokens: int, truncate: int | None, what: str) -> int:
        limit = self.config.max_model_len
        if truncate is not None:
            tokens = min(tokens, limit if truncate == -1 else truncate)
        if tokens > limit:
            raise HttpError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                 f"{tokens} tokens in the input for {what}. Please reduce the length of the input, "
                                 "or set truncate_prompt_tokens.")
        return max(tokens, 1)

    async def _encode(self, request: Request, lengths: list[int]) -> list[LiveSequence]:
        notify = asyncio.Event()
        sequences = [self.live.submit(LiveSequence(notify=notify, completion_tokens=0, stream=False), n) for n in lengths]
        finished = await _wait_all(request, notify, lambda: all(s.finished for s in sequences))
        if not finished:
            for sequence in sequences:
                self.live.abort(sequence)
            raise _Disconnected()
        self.finish("stop")
        return sequences

    async def embeddings(self, request: Request) -> Response:
        self._require("embed", "Embeddings")
        body, _ = await self._body(request, EmbeddingBody)
        inputs = body.input
        if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        if not inputs:
            raise HttpError(400, "input: empty", param="input")
        width = self.config.model.hidden
        if body.dimensions is not None and body.dimensions > width:
            raise HttpError(400, f"dimensions: at most {width} for {self.config.model.name}", param="dimensions")
        features = [_features(item) for item in inputs]
        lengths = [self._fit(len(f) + ENCODER_SPECIAL_TOKENS, body.truncate_prompt_tokens, "embedding generation") for f in features]
        await self._encode(request, lengths)
        data = []
        for i, feature in enumerate(features):
            vector = _embedding(feature, width)[: body.dimensions or width]
            vector = vector / (np.linalg.norm(vector) or 1.0)
            encoded = (base64.b64encode(vector.astype("<f4").tobytes()).decode() if body.encoding_format == "base64"
                       else [float(x) for x in vector.astype(np.float32)])
            data.append({"index": i, "object": "embedding", "embedding": encoded})
        total = sum(lengths)
        return JSONResponse({"id": f"embd-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                             "model": self._model_name(body), "data": data,
                             "usage": {"prompt_tokens": total, "total_tokens": total, "completion_tokens": 0}})

    async def _pair_scores(self, request: Request, queries: list[str], documents: list[str], truncate: int | None) -> tuple[list[float], int]:
        """Scores of (query, document) pairs and the tokens processed: a cross-encoder reads each
        pair as one sequence; an embedder embeds every distinct text once and takes cosines."""
        cross = encoder_task(self.config.model) == "score"
        features = {text: _features(text) for text in dict.fromkeys(queries + documents)}
        if cross:
            lengths = [self._fit(len(features[q]) + len(features[d]) + PAIR_SPECIAL_TOKENS, truncate, "scoring")
                       for q, d in zip(queries, documents)]
        else:
            lengths = [self._fit(len(f) + ENCODER_SPECIAL_TOKENS, truncate, "scoring") for f in features.values()]
        await self._encode(request, lengths)
        width = self.config.model.hidden
        vectors = {text: _unit(_embedding(f, width)) for text, f in features.items()}
        cosines = [float(vectors[q] @ vectors[d]) for q, d in zip(queries, documents)]
        scores = [1.0 / (1.0 + math.exp(-(10.0 * c - 2.0))) for c in cosines] if cross else cosines
        return scores, sum(lengths)

    async def rerank(self, request: Request) -> Response:
        self._require("score", "Rerank")
        body, _ = await self._body(request, RerankBody)
        documents = [d if isinstance(d, str) else str(d.get("text", "")) for d in body.documents]
        if not documents:
            raise HttpError(400, "documents: empty", param="documents")
        scores, tokens = await self._pair_scores(request, [body.query] * len(documents), documents, body.truncate_prompt_tokens)
        order = sorted(range(len(documents)), key=lambda i: (-scores[i], i))
        if body.top_n:
            order = order[: body.top_n]
        if self.config.personality == "sglang":
            # SGLang's /v1/rerank answers with a bare list, best first (serving_rerank.py)
            return JSONResponse([{"score": scores[i], "document": documents[i], "index": i,
                                  "meta_info": {"prompt_tokens": tokens}} for i in order])
        results = [{"index": i, "document": {"text": documents[i]}, "relevance_score": scores[i]} for i in order]
        return JSONResponse({"id": f"rerank-{uuid.uuid4().hex}", "model": self._model_name(body),
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "results": results})

    async def score(self, request: Request) -> Response:
        self._require("score", "Score")
        body, _ = await self._body(request, ScoreBody)
        first = next((v for v in (body.text_1, body.data_1, body.queries) if v is not None), None)
        second = next((v for v in (body.text_2, body.data_2, body.documents) if v is not None), None)
        if first is None or second is None:
            raise HttpError(400, "give text_1 and text_2 (or data_1/data_2, or queries/documents)", param="text_1")
        left = [first] if isinstance(first, str) else list(first)
        right = [second] if isinstance(second, str) else list(second)
        if len(left) == 1:
            left = left * len(right)
        if not right or len(left) != len(right):
            raise HttpError(400, f"text_1 has {len(left)} entries and text_2 {len(right)}: give one text_1, or as many as text_2",
                            param="text_2")
        scores, tokens = await self._pair_scores(request, left, right, body.truncate_prompt_tokens)
        data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
        return JSONResponse({"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                             "model": self._model_name(body), "data": data,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}})

    # -- service endpoints ------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        data = [{"id": name, "object": "model", "created": self.started_s, "owned_by": "scepsy-emulator",
                 "root": self.config.model.hf_id, "parent": None, "max_model_len": self.config.max_model_len}
                for name in self.config.names]
        return JSONResponse({"object": "list", "data": data})

    async def server_info(self, request: Request) -> Response:
        """SGLang's server arguments (a subset, same field names) as `GET /server_info` returns them."""
        config = self.config
        return JSONResponse({
            "model_path": config.model.hf_id, "tokenizer_path": config.model.hf_id, "served_model_name": self._name,
            "tp_size": config.tp, "dp_size": 1, "mem_fraction_static": config.settings.memory_utilization,
            "context_length": config.max_model_len, "is_embedding": config.model.encoder, "version": "scepsy-emulator",
        })

    async def model_info(self, request: Request) -> Response:
        model = self.config.model
        return JSONResponse({"model_path": model.hf_id, "tokenizer_path": model.hf_id, "is_generation": not model.encoder})

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def metrics(self, request: Request) -> Response:
        return Response(metrics.exposition(self.registry), media_type=metrics.CONTENT_TYPE)


class _Disconnected(Exception):
    """The client went away while its request was in the engine."""


async def _wait_all(request: Request, notify: asyncio.Event, done) -> bool:
    """Wait until `done()`; False if the client disconnects first."""
    listener = asyncio.ensure_future(_disconnect(request.receive))
    try:
        while not done():
            waiter = asyncio.ensure_future(notify.wait())
            ready, _ = await asyncio.wait({waiter, listener}, return_when=asyncio.FIRST_COMPLETED)
            if waiter not in ready:
                waiter.cancel()
                return False
            notify.clear()
        return True
    finally:
        listener.cancel()


async def _disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _EventStream:
    """A streamed generation (ASGI): one SSE event per token, sent when its iteration ends.

    The client's disconnect is watched all along (also while the request waits in the queue), and
    aborts its sequences in the engine.
    """

    def __init__(self, emulator: Emulator, choices: list[_Choice], notify: asyncio.Event, header: dict, chat: bool,
                 include_usage: bool):
        self.emulator, self.choices, self.notify = emulator, choices, notify
        self.header, self.chat, self.include_usage = header, chat, include_usage

    def _event(self, choice_fields: list[dict], **extra) -> bytes:
        return b"data: " + json.dumps({**self.header, "choices": choice_fields, **extra}, ensure_ascii=False).encode() + b"\n\n"

    def _token_event(self, choice: _Choice, i: int) -> bytes:
        last = i == len(choice.token_texts) - 1
        finish = choice.finish_reason if last else None
        fields: dict[str, Any] = {"index": choice.index}
        if self.chat:
            fields["delta"] = {"content": choice.token_texts[i]}
        else:
            fields["text"] = choice.token_texts[i]
        fields.update({"logprobs": None, "finish_reason": finish})
        if not self.chat or last:
            fields["stop_reason"] = choice.stop_reason if last else None
        return self._event([fields])

    def _pending(self) -> bytes:
        """Events for every token produced since the last call, in choice order."""
        out = []
        for choice in self.choices:
            produced = choice.sequence.generated
            if self.chat and choice.sent == 0 and produced:
                out.append(self._event([{"index": choice.index, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]))
            while choice.sent < produced:
                out.append(self._token_event(choice, choice.sent))
                choice.sent += 1
        return b"".join(out)

    async def _produce(self, send) -> None:
        choices = self.choices
        while True:
            await self.notify.wait()
            self.notify.clear()
            chunk = self._pending()
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if all(c.sequence.finished for c in choices):
                break
        tail = b""
        if self.include_usage:
            tail += self._event([], usage=self.emulator._usage(choices))
        await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n", "more_body": False})
        self.emulator.finish(choices[0].finish_reason)

    async def __call__(self, scope, receive, send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        producing = asyncio.ensure_future(self._produce(send))
        listening = asyncio.ensure_future(_disconnect(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await asyncio.wait({producing, listening}, return_when=asyncio.FIRST_COMPLETED)
        except OSError:
            pass
        finally:
            for task in (producing, listening):
                task.cancel()
            await asyncio.gather(producing, listening, return_exceptions=True)
            for choice in self.choices:
                if not choice.sequence.finished:
                    self.emulator.live.abort(choice.sequence)


# ----------------------------------------------------------------------------------------------
# Embeddings and scores: deterministic, and similar for texts that share words


def _features(item) -> list[str]:
    """The units of an input (text, or token ids) as embedding features (case-folded)."""
    if isinstance(item, str):
        return [unit.strip().lower() for unit in token_units(item)]
    return [f"#{int(token)}" for token in item]


def _embedding(features: list[str], width: int) -> np.ndarray:
    """Feature hashing: each feature adds +-1 at a hashed position, so cosine similarity grows
    with shared words; a small hash of the whole input keeps distinct inputs apart."""
    vector = np.zeros(width, dtype=np.float64)
    for feature in features:
        digest = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "big")
        vector[digest % width] += 1.0 if (digest >> 32) & 1 else -1.0
    whole = np.random.default_rng(int.from_bytes(hashlib.blake2b("\x00".join(features).encode(), digest_size=8).digest(), "big"))
    return vector + 0.05 * whole.standard_normal(width)


def _unit(vector: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(vector)
    return vector / norm if norm else vector


# ----------------------------------------------------------------------------------------------
# Metrics, app, server


def _guard(handler):
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except HttpError as error:
            return error.response()
        except _Disconnected:
            return Response(status_code=499)

    return endpoint


def create_app(config: EmulatorConfig) -> Starlette:
    """The emulator's ASGI app; the live replica starts with the app's lifespan."""
    emulator = Emulator(config)

    @asynccontextmanager
    async def lifespan(app):
        emulator.live = LiveReplica(config.engine, config.speedup, config.prefix_caching, name=config.model.name)
        try:
            yield
        finally:
            emulator.live.close()

    post, get = ["POST"], ["GET"]
    routes = [
        Route("/v1/chat/completions", _guard(emulator.chat), methods=post),
        Route("/v1/completions", _guard(emulator.completions), methods=post),
        Route("/v1/embeddings", _guard(emulator.embeddings), methods=post),
        *(Route(path, _guard(emulator.rerank), methods=post) for path in ("/v1/rerank", "/rerank", "/v2/rerank")),
        *(Route(path, _guard(emulator.score), methods=post) for path in ("/v1/score", "/score")),
        Route("/v1/models", emulator.models, methods=get),
        Route("/health", emulator.health, methods=get),
        Route("/metrics", emulator.metrics, methods=get),
    ]
    if config.personality == "sglang":
        routes += [Route(p, emulator.server_info, methods=get) for p in ("/server_info", "/get_server_info")]
        routes += [Route(p, emulator.model_info, methods=get) for p in ("/model_info", "/get_model_info")]

    async def not_found(request: Request, exc) -> Response:
        status = getattr(exc, "status_code", 404)
        return HttpError(status, f"{request.method} {request.url.path}: not served by the emulator", "NotFoundError").response()

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    app.state.emulator = emulator
    return app


def serve(config: EmulatorConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the emulator in the foreground until interrupted (the `scepsy emulate` command)."""
    uvicorn.run(create_app(config), host=host, port=port, log_level="warning", access_log=False)
