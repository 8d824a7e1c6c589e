"""What a response says about tokens: usage objects and OpenAI-style server-sent event streams.

`summarize_stream` reads the SSE body of a streamed completion after the stream has ended (the
proxy's hot path only keeps the chunks and their arrival times). An event "carries generated text"
when one of its choices has a non-empty `delta.content`, `delta.reasoning_content`,
`delta.tool_calls` (chat) or `text` (completions). TTFT is the arrival time of the chunk that
holds the first such event. When the stream has a `usage` object (the client asked for
`stream_options.include_usage`, or the engine always sends one), its counts are used; otherwise
completion_tokens is the number of text-carrying events -- vLLM, SGLang and llama.cpp send one
token per event, so this is exact for them and a lower bound for engines that batch tokens -- and
prompt_tokens stays unknown (None). The proxy never changes the request to ask for usage, since
that would change the events the client receives.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from itertools import accumulate
from dataclasses import dataclass


@dataclass(frozen=True)
class TokenSummary:
    prompt_tokens: int | None
    completion_tokens: int | None
    usage_source: str | None
    first_text_offset: int | None = None  # byte offset of the first text-carrying event


def _int_or_none(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def usage_counts(payload: object) -> tuple[int | None, int | None] | None:
    """(prompt_tokens, completion_tokens) from a response's usage, or None when it has none.

    Covers chat/completions (`usage.prompt_tokens`, `usage.completion_tokens`), embeddings and
    score (`usage.prompt_tokens` / `usage.total_tokens`), vLLM rerank (`usage.total_tokens`) and
    Cohere-style rerank (`meta.billed_units.search_units` is not a token count and is ignored).
    """
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = _int_or_none(usage.get("prompt_tokens", usage.get("input_tokens")))
    completion = _int_or_none(usage.get("completion_tokens", usage.get("output_tokens")))
    if prompt is None and completion is None:
        total = _int_or_none(usage.get("total_tokens"))
        if total is None:
            return None
        prompt = total
    return prompt, completion


def summarize_json(body: bytes) -> TokenSummary:
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return TokenSummary(None, None, None)
    counts = usage_counts(payload)
    if counts is None:
        return TokenSummary(None, None, None)
    return TokenSummary(counts[0], counts[1], "usage")


def _carries_text(event: dict) -> bool:
    for choice in event.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and (
            delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
        ):
            return True
    return False


def _event_of(line: bytes) -> dict | None:
    stripped = line.strip()
    if not stripped.startswith(b"data:"):
        return None
    data = stripped[5:].strip()
    if not data or data == b"[DONE]":
        return None
    try:
        event = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return event if isinstance(event, dict) else None


def iter_events(body: bytes):
    """(byte offset, parsed JSON) of each `data:` event of an SSE body; [DONE] and non-JSON skipped."""
    lines = body.splitlines(keepends=True)
    for line, start in zip(lines, accumulate(map(len, lines), initial=0)):
        event = _event_of(line)
        if event is not None:
            yield start, event


def summarize_stream(body: bytes) -> TokenSummary:
    """Usage (the last event that has one), the first text-carrying event, else a count of them.

    It runs on the proxy's event loop once per stream, so it parses as few events as it can: the
    usage object is looked for from the end (engines send it last), the first text event from the
    start; only a stream without usage is parsed whole. A 64-token stream costs ~20 us instead of
    ~240 us, and the cost no longer grows with the response's length.
    """
    lines = body.splitlines(keepends=True)
    parsed: dict[int, dict | None] = {}
    usage = None
    for index in range(len(lines) - 1, -1, -1):
        event = parsed[index] = _event_of(lines[index])
        counts = usage_counts(event) if event is not None else None
        if counts is not None:
            usage = counts
            break
    first_offset = None
    text_events = 0
    for index, line in enumerate(lines):
        event = parsed[index] if index in parsed else _event_of(line)
        if event is None or not _carries_text(event):
            continue
        text_events += 1
        if first_offset is None:
            first_offset = sum(map(len, lines[:index]))
            if usage is not None:
                break  # the count is only needed without usage
    if usage is not None:
        return TokenSummary(usage[0], usage[1], "usage", first_offset)
    if text_events == 0 and first_offset is None:
        return TokenSummary(None, 0 if body else None, "stream_events" if body else None, None)
    return TokenSummary(None, text_events, "stream_events", first_offset)


def time_of_offset(offset: int, chunk_ends: list[int], chunk_times: list[float]) -> float | None:
    """Arrival time of the chunk holding byte `offset` (chunk_ends: cumulative end offsets)."""
    index = bisect_left(chunk_ends, offset + 1)
    return chunk_times[index] if index < len(chunk_times) else None
