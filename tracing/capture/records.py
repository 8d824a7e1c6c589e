"""One traced LLM call (`CallRecord`) and its row form, shared by the store, the exports and the readers.

Times are Unix epoch seconds (float) taken from one monotonic clock anchored to the wall clock when
the proxy starts, so that differences between calls are exact to the microsecond. A call's
latency is `end_s - start_s`: from the moment the proxy received the request to the moment the last
response byte reached the client (or the call failed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

# What ended a call. "ok": the whole response was passed on (whatever its HTTP status);
# "client_disconnect": the client went away before the end; "timeout": the upstream did not answer
# (or stalled) within the proxy's timeout; "upstream_error": the upstream could not be reached or
# broke the connection.
OUTCOMES = ("ok", "client_disconnect", "timeout", "upstream_error")

# Where the token counts come from: the response's `usage` object, or (streams without usage)
# the number of SSE events that carried generated text, which is the completion token count for
# engines that send one token per event (vLLM, SGLang, llama.cpp); prompt_tokens is then unknown.
USAGE_SOURCES = ("usage", "stream_events")


@dataclass(frozen=True)
class CallRecord:
    call_id: str
    llm: str
    path: str  # the upstream path, e.g. /v1/chat/completions
    start_s: float
    end_s: float
    status: int  # HTTP status the client got (504 for a timeout, 502 for an unreachable upstream)
    outcome: str = "ok"
    workflow: str | None = None  # workflow name (X-Workflow-Name), if the client sent one
    workflow_id: str | None = None  # workflow request id (X-Workflow-Id, else traceparent trace id)
    model: str | None = None  # the request's `model` field
    stream: bool = False
    ttft_s: float | None = None  # time to the first event carrying generated text (streams only)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    usage_source: str | None = None
    request_body: bytes | None = None  # None: not recorded (--no-bodies, or larger than the proxy's bound)
    response_body: bytes | None = None
    error: str | None = None
    request_bytes: int | None = None  # body sizes, recorded whether or not the bodies are
    response_bytes: int | None = None

    @property
    def latency_s(self) -> float:
        return self.end_s - self.start_s

    def to_row(self, bodies_as_text: bool = True) -> dict:
        """A flat dict; bodies as UTF-8 text (JSON/SSE are text) unless `bodies_as_text` is False."""
        row = {name: getattr(self, name) for name in COLUMNS}  # flat fields: no deep copy (asdict) needed
        if bodies_as_text:
            for key in ("request_body", "response_body"):
                value = row[key]
                row[key] = value.decode("utf-8", errors="replace") if value is not None else None
        return row

    @classmethod
    def from_row(cls, row: dict) -> "CallRecord":
        """A record from its row form; a field of the wrong type is a ValueError naming it."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in row.items() if k in known}
        _check_types(values)
        for key in ("request_body", "response_body"):
            value = values.get(key)
            if isinstance(value, str):
                values[key] = value.encode("utf-8")
        for key in ("prompt_tokens", "completion_tokens", "status", "request_bytes", "response_bytes"):
            if values.get(key) is not None:
                values[key] = int(values[key])
        if "stream" in values:
            values["stream"] = bool(values["stream"])
        return cls(**values)


COLUMNS = tuple(f.name for f in fields(CallRecord))

_TEXT = ("call_id", "llm", "path")
_OPTIONAL_TEXT = ("outcome", "workflow", "workflow_id", "model", "usage_source", "error")
_TIMES = ("start_s", "end_s")
_COUNTS = ("status", "prompt_tokens", "completion_tokens", "request_bytes", "response_bytes")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_types(values: dict) -> None:
    """Rows come from files anyone can write: refuse a field of the wrong type before it is used."""
    for name in _TEXT:
        if not isinstance(values.get(name), str):
            raise ValueError(f"field {name} must be text, got {values.get(name)!r:.60}")
    for name in _OPTIONAL_TEXT:
        if values.get(name) is not None and not isinstance(values[name], str):
            raise ValueError(f"field {name} must be text or null, got {values[name]!r:.60}")
    for name in _TIMES:
        if not _is_number(values.get(name)):
            raise ValueError(f"field {name} must be a finite number of seconds, got {values.get(name)!r:.60}")
    if not _is_number(values.get("status")):
        raise ValueError(f"field status must be an HTTP status code, got {values.get('status')!r:.60}")
    if values["end_s"] < values["start_s"]:
        raise ValueError(f"end_s {values['end_s']} is before start_s {values['start_s']}")
    if values.get("ttft_s") is not None and not _is_number(values["ttft_s"]):
        raise ValueError(f"field ttft_s must be a finite number or null, got {values['ttft_s']!r:.60}")
    for name in _COUNTS:
        value = values.get(name)
        if value is not None and (not _is_number(value) or value != int(value) or value < 0):
            raise ValueError(f"field {name} must be a whole number >= 0, got {value!r:.60}")
    if "stream" in values and not isinstance(values["stream"], (bool, int)):
        raise ValueError(f"field stream must be true or false, got {values['stream']!r:.60}")
    for name in ("request_body", "response_body"):
        if values.get(name) is not None and not isinstance(values[name], (str, bytes)):
            raise ValueError(f"field {name} must be text or null, got {values[name]!r:.60}")
