"""The OTLP reader on real trace files of other projects (tests/fixtures/otlp/SOURCES.md): what the
OpenTelemetry Collector's file exporter wrote in opentelemetry-rust's integration test, the same
spans as the Rust `opentelemetry-proto` crate serializes them, the protocol's own JSON example and
the file exporter specification's JSON lines.

Each file is read as its producer wrote it. The other layouts the Collector writes are built here
around the real message, as collector-contrib's exporter/fileexporter writes them (file_writer.go:
a line per message with `format: json`, a 4-byte big-endian size before each message with
`format: proto` or any `compression`; codec.go: with `compression: zstd` each message is a zstd
frame of its own; the `exporter.file.nativeCompression` gate compresses the whole stream): no
licensed public file in those layouts was found (docs/tracing.md).
"""

from __future__ import annotations

import base64
import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scepsy import api
from scepsy.cli import app
from scepsy.models.errors import InputError
from scepsy.tracing.capture.otlp import JSON, LENGTH_PREFIXED, Decoded, decode, read_otlp
from scepsy.tracing.capture.span_calls import span_calls
from scepsy.tracing.capture.spans import OTHER, Span, classify

FIXTURES = Path(__file__).parent / "fixtures" / "otlp"
COLLECTOR = FIXTURES / "collector_file_exporter_pretty.json"
RUST_SERDE = FIXTURES / "rust_proto_serde.json"
PROTOCOL_EXAMPLE = FIXTURES / "otlp_example_trace.json"
SPEC_LINES = FIXTURES / "spec_file_exporter_example.jsonl"
TRACE, ROOT, CHILD = "9b458af7378cba65253d7042d34fc72e", "d58cf2d702a061e0", "cd7cf7bf939930b7"


def _by_id(decoded: Decoded) -> dict[str, Span]:
    """The spans by span id, without the file location (which differs between layouts)."""
    return {s.span_id: replace(s, location="") for s in decoded.spans}


def test_collector_file_exporter_output_is_read_span_by_span():
    decoded = read_otlp(COLLECTOR)
    assert (decoded.framing, decoded.compression, decoded.compressed_messages, decoded.rows) == (JSON, (), False, [])
    spans = _by_id(decoded)
    assert set(spans) == {ROOT, CHILD} and {s.trace_id for s in spans.values()} == {TRACE}
    root, child = spans[ROOT], spans[CHILD]
    assert root.parent_id is None  # the Collector writes a root's parent as "parentSpanId": ""
    assert child.parent_id == ROOT
    assert (root.name, root.start_ns, root.end_ns) == ("operation", 1703985537070558635, 1703985537070580454)
    assert (child.name, child.start_ns, child.end_ns) == ("Sub operation...", 1703985537070566698, 1703985537070572718)
    assert root.attributes == {"ex.com/another": "yes"} and child.attributes == {"lemons": "five"}
    for span in spans.values():
        assert span.resource == {"service.name": "basic-otlp-tracing-example"} and span.scope == "ex.com/basic"
        assert not span.failed and span.status_message is None  # "status": {}
        assert classify(span).kind == OTHER  # no LLM attribute scheme


def test_rust_serde_encoding_gives_the_same_spans():
    """Every default field written out (traceState "", status code 0 and message "", an event
    attribute value as a bare string) changes nothing."""
    serde = read_otlp(RUST_SERDE)
    assert serde.framing == JSON and _by_id(serde) == _by_id(read_otlp(COLLECTOR))


def test_protocol_example_with_upper_case_ids_and_numeric_times():
    decoded = read_otlp(PROTOCOL_EXAMPLE)
    (span,) = decoded.spans
    assert (span.trace_id, span.span_id, span.parent_id) == (
        "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174", "eee19b7ec3c1b173")  # lower-cased; the parent is not in the file
    assert (span.start_ns, span.end_ns) == (1544712660000000000, 1544712661000000000)  # JSON numbers, not strings
    assert (span.name, span.attributes) == ("I'm a server span", {"my.span.attr": "some value"})
    assert (span.resource, span.scope) == ({"service.name": "my.service"}, "my.library")


@pytest.mark.parametrize("path, spans", [(COLLECTOR, 2), (RUST_SERDE, 2), (PROTOCOL_EXAMPLE, 1)])
def test_spans_without_llm_calls_are_one_error_line_about_spans(path, spans):
    with pytest.raises(InputError) as error:
        api.aggregate_traces([path])
    assert error.value.problem == f"no span is an LLM call ({spans} read: {spans} other)"
    assert error.value.fix is not None and "OpenLLMetry or OpenInference" in error.value.fix
    result = CliRunner().invoke(app, ["aggregate", str(path)])
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {path}: no span is an LLM call") and "X-Workflow-Id" not in line


def test_specification_json_lines_without_span_ids_are_refused_naming_the_span():
    """The specification's example is four JSON lines whose spans have empty ids (the Collector's
    test data): such a span cannot be placed in a trace, and the file is refused with one line."""
    assert len(SPEC_LINES.read_text().splitlines()) == 4
    with pytest.raises(InputError) as error:
        read_otlp(SPEC_LINES)
    assert (error.value.file, error.value.field, error.value.problem) == (f"{SPEC_LINES}:1", "span 'operationA'", "no traceId or spanId")
    result = CliRunner().invoke(app, ["aggregate", str(SPEC_LINES)])
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# the Collector's other layouts, around the real message


def _framed(*messages: bytes) -> bytes:
    return b"".join(len(m).to_bytes(4, "big") + m for m in messages)


def _protobuf(message: dict) -> bytes:
    """The message as protobuf: OTLP JSON differs from protobuf's JSON mapping only in its hex ids."""
    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    for resource_spans in message["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return ParseDict(message, ExportTraceServiceRequest()).SerializeToString()


def test_every_collector_layout_of_the_real_message_is_detected():
    zstandard = pytest.importorskip("zstandard")
    zstd = zstandard.ZstdCompressor()
    message = json.loads(COLLECTOR.read_bytes())
    line = json.dumps(message, separators=(",", ":")).encode()  # as the Collector wrote it, before pretty-printing
    proto = _protobuf(message)
    layouts = {  # name -> (bytes, exports in it, framing, whole-file compression, per-message compression)
        "format: json": (line + b"\n", 1, JSON, (), False),
        "format: json, two exports": (line + b"\n" + line + b"\n", 2, JSON, (), False),
        "format: json, compression: zstd": (_framed(zstd.compress(line)), 1, LENGTH_PREFIXED, (), True),
        "format: json, native zstd": (zstd.compress(line + b"\n"), 1, JSON, ("zstd",), False),
        "format: json, gzip": (gzip.compress(line + b"\n"), 1, JSON, ("gzip",), False),
        "format: proto, two exports": (_framed(proto, proto), 2, LENGTH_PREFIXED, (), False),
        "format: proto, compression: zstd": (_framed(zstd.compress(proto)), 1, LENGTH_PREFIXED, (), True),
        "format: proto, native zstd": (zstd.compress(_framed(proto)), 1, LENGTH_PREFIXED, ("zstd",), False),
    }
    reference = _by_id(read_otlp(COLLECTOR))
    for name, (data, exports, framing, compression, compressed_messages) in layouts.items():
        decoded = decode(data, name)
        assert (decoded.framing, decoded.compression, decoded.compressed_messages) == (framing, compression, compressed_messages), name
        assert len(decoded.spans) == exports * len(reference) and _by_id(decoded) == reference, name


# ---------------------------------------------------------------------------------------------
# a rule a real export showed: OpenLit writes a LangChain span around the OpenAI client span of the
# same call, both under its one scope `openlit.otel.tracing` (pmcollins/otel-llm-bakeoff
# output/ott-lit.json, no licence to copy it: the two spans of one of its traces, abbreviated)


def _openlit_span(span_id: str, parent_id: str | None, start_ns: int, end_ns: int, system: str) -> Span:
    return Span(trace_id="43d621" + "0" * 26, span_id=span_id, parent_id=parent_id, name="chat gpt-3.5-turbo",
                start_ns=start_ns, end_ns=end_ns, scope="openlit.otel.tracing",
                attributes={"gen_ai.operation.name": "chat", "gen_ai.system": system, "gen_ai.request.model": "gpt-3.5-turbo"},
                resource={"service.name": "default", "telemetry.sdk.name": "openlit"})


def test_a_call_recorded_at_two_nested_levels_by_one_instrumentation_counts_once():
    outer = _openlit_span("3e1c24" + "00" * 5, None, 1_000_000_000, 2_179_360_000, "langchain")
    inner = _openlit_span("2b584e" + "00" * 5, outer.span_id, 1_000_900_000, 2_179_171_000, "openai")
    found = span_calls([outer, inner])
    assert [c.call_id for c in found.calls] == [inner.span_id]
    assert (found.summary.duplicate_calls, found.summary.calls_without_parent) == (1, 0)
    assert any("recorded by two instrumentations (openlit.otel.tracing, nested)" in w for w in found.summary.warnings)
    # two calls of a fan-out from one instrumentation, side by side under one parent, stay two
    first = replace(inner, span_id="aa" * 8, parent_id="bb" * 8)
    second = replace(inner, span_id="cc" * 8, parent_id="bb" * 8, start_ns=inner.start_ns + 1, end_ns=inner.end_ns - 1)
    assert len(span_calls([first, second]).calls) == 2
    # spans whose every LLM call failed give no request, and say why
    failed = span_calls([replace(inner, failed=True, parent_id=None)]).summary
    assert failed.no_requests()[0] == "no LLM-call span completed (1 read, each with status ERROR)"
