"""The OpenAI-compatible endpoints of one emulated replica (tracing/emulation/emulator.py describes
them): request bodies checked, sequences entered into the live replica
(tracing/emulation/livereplica.py), answers in vLLM's (or SGLang's) shapes when they finish."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from scepsy.models.catalog.catalog import encoder_task
from scepsy.tracing.emulation import metrics
from scepsy.tracing.emulation.config import EmulatorConfig
from scepsy.tracing.emulation.embeddings import hashed_embedding, text_features, unit_vector
from scepsy.tracing.emulation.generation import Choice, sequence_plan, token_texts, usage_counts
from scepsy.tracing.emulation.livereplica import LiveReplica, LiveSequence
from scepsy.tracing.emulation.requests import (
    ChatBody,
    CompletionBody,
    EmbeddingBody,
    HttpError,
    RerankBody,
    ScoreBody,
    Body,
    Sampling,
    validation_message,
)
from scepsy.tracing.emulation.streaming import Disconnected, EventStream, wait_all
from scepsy.tracing.emulation.tokenizer import apply_stop, chat_units, filler_tokens, prompt_units, request_seed, sequence_rng

ENCODER_SPECIAL_TOKENS = 2  # [CLS] text [SEP]
PAIR_SPECIAL_TOKENS = 4  # <s> query </s></s> document </s> (XLM-RoBERTa cross-encoders)


class Emulator:
    """The ASGI application of one emulated replica (create with `create_app`)."""

    def __init__(self, config: EmulatorConfig):
        self.config = config
        self._live: LiveReplica | None = None  # started with the app's lifespan
        self.started_s = int(time.time())
        self.requests_ok = 0
        self.finished: dict[str, int] = {}  # requests answered in full, by the finish reason of their first choice
        self.registry = metrics.registry(self.snapshot)
        self.latency = metrics.latency_histograms(self.registry, config.personality, config.names[0])  # their latencies

    # -- plumbing -------------------------------------------------------------------------------

    def snapshot(self) -> metrics.Snapshot:
        """The numbers `GET /metrics` exposes (tracing/emulation/metrics.py)."""
        live, config = self.live, self.config
        stats = live.stats
        return metrics.Snapshot(
            config.names[0], config.personality, live.running, live.waiting, live.kv_usage, live.replica.preemptions,
            stats.prompt_tokens, stats.generation_tokens, stats.cached_tokens, dict(self.finished), stats.iterations,
            live.busy_s, stats.aborted_sequences, stats.lag_s_max, stats.lag_s_mean, config.speedup)

    def finish(self, reason: str, sequences: Sequence[LiveSequence]) -> None:
        """Count a request answered in full (vLLM's `vllm:request_success_total{finished_reason}`)
        and observe its latency (the engines' `e2e_request_latency_seconds`): the engine model's,
        from its sequences' arrival in the scheduler to their last token, in wall-clock seconds
        (modelled seconds over `speedup`; the driver's lateness is the emulator's, not the engine's)."""
        self.requests_ok += 1
        self.finished[reason] = self.finished.get(reason, 0) + 1
        requests = [s.request for s in sequences if s.request is not None]
        ended = [r.finish_s for r in requests if r.finish_s is not None]
        if requests and ended:
            latency_s = max(max(ended) - min(r.arrival_s for r in requests), 0.0) / self.config.speedup
            for histogram in self.latency:
                histogram.observe(latency_s)

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
            raise HttpError(400, validation_message(error)) from None
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

    def _model_name(self, body: Body) -> str:
        return body.model or self._name

    def _submit(self, notify: asyncio.Event, prompt: list[str], completion_tokens: int, output: list[str], stream: bool) -> LiveSequence:
        sequence = LiveSequence(notify=notify, completion_tokens=completion_tokens, units=prompt + output, stream=stream)
        return self.live.submit(sequence, len(prompt), prompt)

    # -- chat and completions ---------------------------------------------------------------

    async def chat(self, request: Request) -> Response | EventStream:
        self._require("generate", "Chat Completions")
        body, payload = await self._body(request, ChatBody)
        return await self._generate(request, body, payload, [chat_units(body.messages)], chat=True)

    async def completions(self, request: Request) -> Response | EventStream:
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

    def _choices(self, body: Sampling, payload: dict, prompts: list[list[str]], notify: asyncio.Event) -> list[Choice]:
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
                length, finish = sequence_plan(body, room[prompt_index], sequence_rng(seed, index, "eos"),
                                                self.config.mean_output_tokens)
                tokens = filler_tokens(sequence_rng(seed, index), length)
                used, text, stop = apply_stop(tokens, body.stops) if body.stops else (length, "".join(tokens), None)
                sequence = self._submit(notify, units, used, tokens[:used], body.stream)
                choices.append(Choice(index, prompt_index, len(units), token_texts(tokens, used, text),
                                       "stop" if stop else finish, stop, sequence))
        return choices

    async def _generate(self, request: Request, body: Sampling, payload: dict, prompts: list[list[str]], chat: bool) -> Response | EventStream:
        notify = asyncio.Event()
        choices = self._choices(body, payload, prompts, notify)
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        header = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                  "created": int(time.time()), "model": self._model_name(body)}
        if body.stream:
            return EventStream(self.live, self.finish, choices, notify, header, chat, body.include_usage)
        finished = await wait_all(request, notify, lambda: all(c.sequence.finished for c in choices))
        if not finished:
            for choice in choices:
                self.live.abort(choice.sequence)
            return Response(status_code=499)
        self.finish(choices[0].finish_reason, [c.sequence for c in choices])
        return JSONResponse(self._final(choices, header, chat))

    def _final(self, choices: list[Choice], header: dict, chat: bool) -> dict:
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
                "usage": usage_counts(choices)}

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
        finished = await wait_all(request, notify, lambda: all(s.finished for s in sequences))
        if not finished:
            for sequence in sequences:
                self.live.abort(sequence)
            raise Disconnected()
        self.finish("stop", sequences)
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
        features = [text_features(item) for item in inputs]
        lengths = [self._fit(len(f) + ENCODER_SPECIAL_TOKENS, body.truncate_prompt_tokens, "embedding generation") for f in features]
        await self._encode(request, lengths)
        data = []
        for i, feature in enumerate(features):
            vector = hashed_embedding(feature, width)[: body.dimensions or width]
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
        features = {text: text_features(text) for text in dict.fromkeys(queries + documents)}
        if cross:
            lengths = [self._fit(len(features[q]) + len(features[d]) + PAIR_SPECIAL_TOKENS, truncate, "scoring")
                       for q, d in zip(queries, documents)]
        else:
            lengths = [self._fit(len(f) + ENCODER_SPECIAL_TOKENS, truncate, "scoring") for f in features.values()]
        await self._encode(request, lengths)
        width = self.config.model.hidden
        vectors = {text: unit_vector(hashed_embedding(f, width)) for text, f in features.items()}
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
