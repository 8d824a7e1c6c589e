"""The engine emulator: an OpenAI-compatible server whose timing follows the engine model.

`scepsy emulate --model M --gpu G --tp T --fraction F --port P` serves what a vLLM replica of
model M on T shards of a fraction F of GPU G would serve, with the engine model's timing
(models/performance/engine.py) and the continuous-batching scheduler of models/performance/replica.py run in real time
(tracing/emulation/livereplica.py), for testing workflows, the proxy, the profiler and routers at scale
without GPUs. Content is deterministic filler text (tracing/emulation/tokenizer.py); token counts are an
approximation of a BPE tokenizer; the `usage` of every response is exact for what was emitted.

This module configures a replica (`emulator_config`, checked to fit) and serves it (`create_app`,
`serve`). Its parts: tracing/emulation/config.py (the configuration), tracing/emulation/requests.py
(request bodies, errors), tracing/emulation/endpoints.py (the endpoints),
tracing/emulation/generation.py (each choice's length, text and usage), tracing/emulation/streaming.py
(server-sent events, client disconnects), tracing/emulation/embeddings.py (vectors and scores).

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

import math
from contextlib import asynccontextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from scepsy.models.arguments import check_fraction
from scepsy.models.catalog import catalog
from scepsy.models.catalog.model_config import resolve_model
from scepsy.models.errors import InputError
from scepsy.models.performance.aiconfigurator import make_timer
from scepsy.models.performance.engine import DEFAULT_SETTINGS, Engine, EngineSettings
from scepsy.tracing.emulation.config import PERSONALITIES, EmulatorConfig
from scepsy.tracing.emulation.endpoints import Emulator
from scepsy.tracing.emulation.livereplica import BLOCK_TOKENS, LiveReplica
from scepsy.tracing.emulation.requests import HttpError
from scepsy.tracing.emulation.streaming import Disconnected


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


def _guard(handler):
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except HttpError as error:
            return error.response()
        except Disconnected:
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
