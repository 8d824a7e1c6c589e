"""Token summaries of SSE streams: hand-built cases, and the fast reader against a whole-body walk."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy.tracing.capture.sse import TokenSummary, _carries_text, iter_events, summarize_stream, usage_counts


def _sse(*events: object) -> bytes:
    out = b""
    for event in events:
        data = event if isinstance(event, bytes) else json.dumps(event).encode()
        out += b"data: " + data + b"\n\n"
    return out


def _text(content: str, key: str = "content") -> dict:
    return {"choices": [{"index": 0, "delta": {key: content}}]}


def _usage(prompt: int, completion: int) -> dict:
    return {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}


def _reference(body: bytes) -> TokenSummary:
    """The specification: walk every event; the last usage wins; count text events."""
    text_events, first_offset, usage = 0, None, None
    for offset, event in iter_events(body):
        if _carries_text(event):
            text_events += 1
            first_offset = offset if first_offset is None else first_offset
        usage = usage_counts(event) or usage
    if usage is not None:
        return TokenSummary(usage[0], usage[1], "usage", first_offset)
    if text_events == 0:
        return TokenSummary(None, 0 if body else None, "stream_events" if body else None, None)
    return TokenSummary(None, text_events, "stream_events", first_offset)


def test_usage_at_the_end_wins_over_the_event_count():
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    body = _sse(role, _text("a"), _text("b"), _usage(7, 5), b"[DONE]")
    summary = summarize_stream(body)
    assert summary == TokenSummary(7, 5, "usage", len(_sse(role)))


def test_without_usage_text_events_are_counted():
    body = b": keep-alive\n\n" + _sse(_text(""), _text("x"), _text("thinking", "reasoning_content"), {"choices": [{"text": "y"}]}, b"[DONE]")
    summary = summarize_stream(body)
    assert (summary.prompt_tokens, summary.completion_tokens, summary.usage_source) == (None, 3, "stream_events")
    assert body[summary.first_text_offset:].startswith(b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}')


def test_the_last_of_several_usage_objects_is_taken():
    body = _sse(_text("a"), _usage(1, 1), _text("b"), _usage(2, 9), {"choices": []})
    assert summarize_stream(body) == TokenSummary(2, 9, "usage", 0)


def test_empty_and_textless_streams():
    assert summarize_stream(b"") == TokenSummary(None, None, None, None)
    assert summarize_stream(_sse(b"[DONE]")) == TokenSummary(None, 0, "stream_events", None)
    assert summarize_stream(_sse(b"not json", _usage(3, 0))) == TokenSummary(3, 0, "usage", None)


_EVENTS = st.one_of(
    st.builds(_text, st.sampled_from(["", "a", "tok "]), st.sampled_from(["content", "reasoning_content"])),
    st.builds(_usage, st.integers(0, 50), st.integers(0, 50)),
    st.just({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}),
    st.just({"choices": [{"text": "t"}]}),
    st.just(b"[DONE]"),
    st.just(b"{broken"),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_EVENTS, max_size=12), st.sampled_from([b"\n\n", b"\r\n\r\n", b"\n"]))
def test_fast_summary_equals_the_whole_body_walk(events, separator):
    body = _sse(*events).replace(b"\n\n", separator)
    assert summarize_stream(body) == _reference(body)
