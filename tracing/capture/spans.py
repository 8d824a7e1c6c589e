"""OpenTelemetry spans and the attribute schemes that say which of them are LLM calls.

A `Span` is one span as any OTLP file holds it (tracing/capture/otlp.py reads them), with its
attributes flattened to Python values. `classify` reads the three attribute schemes that LLM
instrumentations write and says what the span is:

- OpenTelemetry GenAI semantic conventions (`gen_ai.*`; the official `opentelemetry-instrumentation-
  openai-v2`, `opentelemetry-util-genai`): `gen_ai.operation.name` is `chat`, `text_completion`,
  `generate_content` or `embeddings` for a model call; `invoke_workflow`, `invoke_agent`,
  `create_agent`, `execute_task` and `execute_tool` are the framework's own spans. Older
  instrumentations set only `gen_ai.request.model` / `gen_ai.system` on model calls.
- OpenLLMetry (Traceloop): `traceloop.span.kind` is `workflow`, `task`, `agent` or `tool` on the
  framework's spans; model calls carry `llm.request.type` (`chat`, `completion`, `embedding`,
  `rerank`) with the GenAI attributes.
- OpenInference (Arize): `openinference.span.kind` is `LLM`, `EMBEDDING` or `RERANKER` for a model
  call, `CHAIN`, `AGENT`, `TOOL`, `RETRIEVER`, `GUARDRAIL`, `EVALUATOR` or `PROMPT` otherwise; the
  model is `llm.model_name` (`embedding.model_name`, `reranker.model_name`), tokens
  `llm.token_count.prompt` / `llm.token_count.completion`.

Spans of none of these schemes are `other` (HTTP, database, the application's own spans) unless
they carry attributes that look like an LLM scheme scepsy does not read (`UNKNOWN`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

# What a span is; only LLM_CALL spans are counted, the others are skipped and counted by kind.
LLM_CALL = "llm_call"
WORKFLOW, AGENT, TASK, TOOL, CHAIN = "workflow", "agent", "task", "tool", "chain"
OTHER = "other"  # no LLM scheme at all: HTTP, database, the application's own spans
UNKNOWN = "unknown"  # LLM-looking attributes of a scheme (or a value) scepsy does not read

# gen_ai.operation.name -> what the span is (the call's path for LLM calls)
GENAI_CALLS = {
    "chat": "/v1/chat/completions",
    "text_completion": "/v1/completions",
    "generate_content": "/v1/chat/completions",
    "embeddings": "/v1/embeddings",
}
GENAI_FRAMEWORK = {
    "invoke_workflow": WORKFLOW,
    "invoke_agent": AGENT,
    "create_agent": AGENT,
    "execute_task": TASK,
    "execute_tool": TOOL,
}
# llm.request.type (OpenLLMetry) of a model call
TRACELOOP_CALLS = {
    "chat": "/v1/chat/completions",
    "completion": "/v1/completions",
    "embedding": "/v1/embeddings",
    "rerank": "/v1/rerank",
}
TRACELOOP_FRAMEWORK = {"workflow": WORKFLOW, "task": TASK, "agent": AGENT, "tool": TOOL}
# openinference.span.kind
OPENINFERENCE_CALLS = {
    "LLM": ("/v1/chat/completions", "llm.model_name"),
    "EMBEDDING": ("/v1/embeddings", "embedding.model_name"),
    "RERANKER": ("/v1/rerank", "reranker.model_name"),
}
OPENINFERENCE_FRAMEWORK = {
    "CHAIN": CHAIN, "AGENT": AGENT, "TOOL": TOOL, "RETRIEVER": "retriever", "GUARDRAIL": "guardrail",
    "EVALUATOR": "evaluator", "PROMPT": "prompt",
}

# Attribute names that mark a span as coming from some LLM instrumentation: a span with one of them
# that no rule above reads is UNKNOWN (and reported), not OTHER.
_LLM_LOOKING = re.compile(r"^(gen_ai|llm|ai|openinference|traceloop|langsmith|mlflow|langfuse|lmnr)\.|(^|\.)model(_name|_id)?$")


@dataclass(frozen=True)
class Span:
    """One span of an OTLP export, times in Unix nanoseconds, ids as lowercase hex."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, object] = field(default_factory=dict)
    resource: Mapping[str, object] = field(default_factory=dict)
    scope: str = ""  # the instrumentation scope's name: which instrumentation wrote the span
    failed: bool = False
    status_message: str | None = None
    location: str = ""  # file and record, for messages


@dataclass(frozen=True)
class Classified:
    """What a span is: its kind and, for LLM calls, the model, the call's path and its tokens."""

    kind: str
    scheme: str | None = None  # genai, openllmetry or openinference
    model: str | None = None
    path: str = "/v1/chat/completions"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    stream: bool = False
    unknown: str | None = None  # for UNKNOWN: the attribute (and value) that was not understood


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if number >= 0 else None


def _first(attributes: Mapping[str, object], *keys: str) -> object:
    return next((attributes[k] for k in keys if attributes.get(k) is not None), None)


def _genai_model(attributes: Mapping[str, object]) -> str | None:
    return _text(_first(attributes, "gen_ai.request.model", "gen_ai.response.model", "llm.request.model", "llm.response.model"))


def _genai_call(attributes: Mapping[str, object], scheme: str, path: str) -> Classified:
    model = _genai_model(attributes)
    if model is None:
        return Classified(UNKNOWN, scheme, unknown="an LLM call without gen_ai.request.model")
    prompt = _first(attributes, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.usage.prompt_tokens")
    completion = _first(attributes, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.usage.completion_tokens")
    stream = _first(attributes, "gen_ai.request.stream", "llm.is_streaming")
    return Classified(LLM_CALL, scheme, model, path, _count(prompt), _count(completion), stream is True)


def _openinference(attributes: Mapping[str, object], kind: str) -> Classified:
    if kind in OPENINFERENCE_FRAMEWORK:
        return Classified(OPENINFERENCE_FRAMEWORK[kind], "openinference")
    if kind not in OPENINFERENCE_CALLS:
        return Classified(UNKNOWN, "openinference", unknown=f"openinference.span.kind={kind}")
    path, model_key = OPENINFERENCE_CALLS[kind]
    model = _text(_first(attributes, model_key, "llm.model_name"))
    if model is None:
        return Classified(UNKNOWN, "openinference", unknown=f"an {kind} span without {model_key}")
    return Classified(LLM_CALL, "openinference", model, path, _count(attributes.get("llm.token_count.prompt")),
                      _count(attributes.get("llm.token_count.completion")))


def classify(span: Span) -> Classified:
    """What the span is, by the first scheme whose marker it carries (module docstring)."""
    attributes = span.attributes
    openinference = _text(attributes.get("openinference.span.kind"))
    if openinference is not None:
        return _openinference(attributes, openinference.upper())
    traceloop_kind = _text(attributes.get("traceloop.span.kind"))
    if traceloop_kind is not None:
        if traceloop_kind in TRACELOOP_FRAMEWORK:
            return Classified(TRACELOOP_FRAMEWORK[traceloop_kind], "openllmetry")
        return Classified(UNKNOWN, "openllmetry", unknown=f"traceloop.span.kind={traceloop_kind}")
    operation = _text(attributes.get("gen_ai.operation.name"))
    if operation is not None:
        if operation in GENAI_FRAMEWORK:
            return Classified(GENAI_FRAMEWORK[operation], "genai")
        if operation in GENAI_CALLS:
            return _genai_call(attributes, "genai", GENAI_CALLS[operation])
        return Classified(UNKNOWN, "genai", unknown=f"gen_ai.operation.name={operation}")
    request_type = _text(attributes.get("llm.request.type"))
    if request_type is not None:
        if request_type in TRACELOOP_CALLS:
            return _genai_call(attributes, "openllmetry", TRACELOOP_CALLS[request_type])
        return Classified(UNKNOWN, "openllmetry", unknown=f"llm.request.type={request_type}")
    if _genai_model(attributes) is not None:  # older GenAI conventions: a model, no operation
        return _genai_call(attributes, "genai", GENAI_CALLS["chat"])
    if _text(_first(attributes, "gen_ai.workflow.name", "traceloop.workflow.name")) is not None:
        return Classified(WORKFLOW)  # the application's own span, named as a workflow
    looking = sorted(key for key in attributes if _LLM_LOOKING.search(key))
    if looking:
        return Classified(UNKNOWN, unknown=looking[0])
    return Classified(OTHER)
