"""Trace store, exports and OTLP GenAI import."""

from __future__ import annotations

import json

import pytest

from scepsy.models.errors import InputError
from scepsy.tracing.capture.records import CallRecord
from scepsy.tracing.capture.store import TraceStore, read_store, write_store
from scepsy.tracing.capture.traces import export_traces, load_traces

CALLS = [
    CallRecord(call_id=f"c{i}", llm="gen" if i % 2 else "ver", path="/v1/chat/completions", start_s=1.7e9 + i,
               end_s=1.7e9 + i + 0.5, status=200, workflow="beam", workflow_id=f"r{i // 4}", stream=bool(i % 3),
               ttft_s=0.1 if i % 3 else None, prompt_tokens=10 + i, completion_tokens=None if i == 2 else 5,
               usage_source="usage", request_body=b'{"model": "gen", "x": "\\u00e9"}', response_body=b"data: {}\n\n")
    for i in range(8)
]


def test_store_batches_and_flushes_everything(tmp_path):
    store = TraceStore(tmp_path / "t.db", batch_size=3, flush_interval_s=0.01)
    for call in CALLS:
        store.put(call)
    store.flush()
    assert len(list(read_store(tmp_path / "t.db"))) == 8  # readable while the writer is open (WAL)
    store.close()
    assert list(read_store(tmp_path / "t.db")) == CALLS


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_export_roundtrip(tmp_path, fmt):
    write_store(tmp_path / "t.db", CALLS)
    out = tmp_path / f"t.{fmt}"
    assert export_traces(load_traces([tmp_path / "t.db"]), out, fmt) == 8
    assert load_traces([out]) == CALLS
    export_traces(CALLS, tmp_path / f"nb.{fmt}", fmt, bodies=False)
    assert all(c.request_body is None for c in load_traces([tmp_path / f"nb.{fmt}"]))


def test_jsonl_is_deterministic(tmp_path):
    export_traces(CALLS, tmp_path / "a.jsonl", "jsonl")
    export_traces(list(reversed(CALLS)), tmp_path / "b.jsonl", "jsonl")
    assert sorted((tmp_path / "a.jsonl").read_text().splitlines()) == sorted((tmp_path / "b.jsonl").read_text().splitlines())
    assert load_traces([tmp_path / "b.jsonl"]) == CALLS  # sorted by start time on load


def _attr(key, value):
    kind = {str: "stringValue", int: "intValue", bool: "boolValue", float: "doubleValue"}[type(value)]
    return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}


def otlp_export():
    spans = []
    for r, trace in enumerate(["a" * 32, "b" * 32]):
        for k in range(3):
            start = 1_700_000_000_000_000_000 + r * 10**10 + k * 10**8
            spans.append({
                "traceId": trace, "spanId": f"{r}{k}".rjust(16, "0"), "name": "chat gen",
                "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 10**9),
                "attributes": [_attr("gen_ai.operation.name", "chat"), _attr("gen_ai.request.model", "meta/llama-1b"),
                               _attr("gen_ai.usage.input_tokens", 12), _attr("gen_ai.usage.output_tokens", 7)],
            })
        spans.append({"traceId": trace, "spanId": f"{r}9".rjust(16, "0"), "name": "tool call",
                      "startTimeUnixNano": "1", "endTimeUnixNano": "2", "attributes": [_attr("tool.name", "calc")]})
    resource = {"attributes": [_attr("service.name", "beam")]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "openllmetry"}, "spans": spans}]}]}


def test_otlp_genai_spans(tmp_path):
    (tmp_path / "spans.json").write_text(json.dumps(otlp_export()))
    (tmp_path / "spans.jsonl").write_text(json.dumps(otlp_export()) + "\n")
    calls = load_traces([tmp_path / "spans.json"], llm_names={"meta/llama-1b": "gen"})
    assert len(calls) == 6  # the tool span is not an LLM call
    first = calls[0]
    assert (first.llm, first.workflow, first.workflow_id, first.prompt_tokens, first.completion_tokens) == ("gen", "beam", "a" * 32, 12, 7)
    assert first.latency_s == pytest.approx(1.0)
    from scepsy.tracing.statistics.stats import aggregate

    (gen,) = aggregate(calls).workflow("beam").llms
    assert gen.invocations == 3 and gen.parallelism == pytest.approx(3 / 1.2)  # 3 s of calls over a 1.2 s union
    assert len(load_traces([tmp_path / "spans.jsonl"])) == 6


def test_bad_trace_files(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_traces([tmp_path / "missing.db"])
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(InputError, match="unknown trace format"):
        load_traces([tmp_path / "x.csv"])
    (tmp_path / "bad.jsonl").write_text('{"llm": "gen"}\n')
    with pytest.raises(InputError, match="line 1.*missing field call_id"):
        load_traces([tmp_path / "bad.jsonl"])
    (tmp_path / "bad.db").write_text("not sqlite")
    with pytest.raises(InputError, match="cannot read traces"):
        load_traces([tmp_path / "bad.db"])
