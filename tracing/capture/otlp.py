"""OTLP trace files: what the OpenTelemetry Collector's file exporter and the SDKs' file exporters
write, in any of their framings and compressions, read into `Span`s (tracing/capture/spans.py).

The framing is read from the content, never from the file name (the Collector writes whatever
`path` says, often without an extension):

- OTLP JSON: one `ExportTraceServiceRequest` (`{"resourceSpans": [...]}`) per line, as the
  Collector's file exporter writes with `format: json` (its `exportMessageAsLine`) and the SDKs'
  OTLP JSON file exporters write; or such objects one after another in any layout (one
  pretty-printed document per file). Other JSON objects in the same stream (scepsy's own call
  records, `scepsy traces export`) are handed back as rows.
- Length-prefixed messages: each message preceded by its size as a 4-byte big-endian unsigned
  integer, as the file exporter writes with `format: proto`, and with `compression: zstd` in either
  format (its `exportMessageAsBuffer`, collector-contrib exporter/fileexporter/file_writer.go).
  Each message is a protobuf-encoded `ExportTraceServiceRequest` (decoded with the
  `opentelemetry-proto` package), or a JSON one; with the Collector's `compression: zstd` each
  message is a zstd frame of its own (exporter/fileexporter/codec.go `zstdCompress`).
- A whole file compressed with zstd (the file exporter's `exporter.file.nativeCompression` feature
  gate, or `zstd` run on any of the above) or gzip: decompressed, then read as above.

Everything is bounded by the input size limit (`SCEPSY_MAX_INPUT_MIB`, models/inputs.py), the
decompressed size too, so a small compressed file cannot expand without limit.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import io
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping

from scepsy.models.errors import InputError
from scepsy.models.inputs import max_input_bytes, parse_json_values, read_bytes, MAX_INPUT_ENV

from scepsy.tracing.capture.spans import Span

if TYPE_CHECKING:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
FORMATS = (
    "OTLP JSON (one ExportTraceServiceRequest per line, as the Collector's file exporter with format: json and "
    "the SDKs' OTLP JSON file exporters write), OTLP protobuf (4-byte length-prefixed messages, the file "
    "exporter's format: proto), plain or compressed (zstd, as compression: zstd writes, or gzip)"
)
_FIX = "pass an OTLP file as the Collector's file exporter or an SDK's OTLP file exporter writes it"
_STATUS_ERROR = 2


JSON, LENGTH_PREFIXED = "json", "length-prefixed"  # the framings (module docstring)


@dataclass
class Decoded:
    """What one file holds: spans, and JSON objects that are not OTLP (with their line numbers), and
    the layout they were found in: the framing, the compression of the whole file (outermost first)
    and whether each message was compressed on its own (the file exporter's `compression: zstd`)."""

    spans: list[Span] = field(default_factory=list)
    rows: list[tuple[int, dict]] = field(default_factory=list)
    framing: str | None = None  # JSON or LENGTH_PREFIXED; None for an empty file
    compression: tuple[str, ...] = ()  # "gzip" / "zstd" layers around the whole file
    compressed_messages: bool = False


def _too_large(source: str) -> InputError:
    limit = max_input_bytes()
    return InputError(source, None, f"the file expands to more than {limit / 2**20:g} MiB, the input size limit",
                      f"pass a smaller file, or raise the limit with {MAX_INPUT_ENV}")


def _gunzip(data: bytes, source: str) -> bytes:
    limit = max_input_bytes()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as handle:
            out = handle.read(limit + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(source, None, f"broken gzip data ({exc})", "pass an intact file") from None
    if len(out) > limit:
        raise _too_large(source)
    return out


def _unzstd(data: bytes, source: str) -> bytes:
    """Every zstd frame of `data`, decompressed and joined (at most the input size limit)."""
    try:
        import zstandard
    except ModuleNotFoundError:
        raise InputError(source, None, "zstd-compressed, and the zstandard package is not installed",
                         "pip install 'scepsy[tracing]'") from None
    limit = max_input_bytes()
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
            out = reader.read(limit + 1)
    except zstandard.ZstdError as exc:
        raise InputError(source, None, f"broken zstd data ({exc})", "pass an intact file") from None
    if len(out) > limit:
        raise _too_large(source)
    return out


def _is_json(data: bytes) -> bool:
    stripped = data.lstrip(b" \t\r\n")
    if stripped.startswith(b"\xef\xbb\xbf"):
        stripped = stripped[3:].lstrip(b" \t\r\n")
    return stripped[:1] in (b"{", b"[")


def read_otlp(path: Path | str) -> Decoded:
    """The spans (and non-OTLP JSON rows) of one file, read with the size bound."""
    source = str(path)
    return decode(read_bytes(path, _FIX), source)


def decode(data: bytes, source: str) -> Decoded:
    """Spans from the bytes of an OTLP file (module docstring)."""
    decoded = Decoded()
    for _ in range(3):  # a compressed file may hold a compressed file; more layers are not real
        if data.startswith(GZIP_MAGIC):
            data = _gunzip(data, source)
            decoded.compression += ("gzip",)
        elif data.startswith(ZSTD_MAGIC):
            data = _unzstd(data, source)
            decoded.compression += ("zstd",)
        else:
            break
    if not data.strip():
        return decoded
    if _is_json(data):
        decoded.framing = JSON
        _read_json(data, source, decoded)
    else:
        decoded.framing = LENGTH_PREFIXED
        _read_messages(data, source, decoded)
    return decoded


def _read_json(data: bytes, source: str, decoded: Decoded) -> None:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(source, f"byte {exc.start}", "not UTF-8 text", "save the file as UTF-8") from None
    for line, value in parse_json_values(text, source, _FIX):
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, dict):
                raise InputError(source, f"line {line}", "not a JSON object", _FIX)
            if "resourceSpans" in item or "resource_spans" in item:
                decoded.spans += json_spans(item, f"{source}:{line}")
            else:
                decoded.rows.append((line, item))


def _unknown(source: str) -> InputError:
    return InputError(source, None, "unknown trace format: neither JSON nor length-prefixed OTLP protobuf",
                      f"pass a proxy store (.db), a .jsonl or .parquet export, or an OTLP file: {FORMATS}")


def _messages(data: bytes, source: str) -> Iterator[tuple[int, bytes]]:
    """The length-prefixed messages of `data`: (number from 1, bytes)."""
    position, number = 0, 0
    while position < len(data):
        number += 1
        size = int.from_bytes(data[position:position + 4], "big") if position + 4 <= len(data) else None
        if size is None or position + 4 + size > len(data):
            if number == 1:
                raise _unknown(source)
            raise InputError(source, f"message {number}", "truncated: its size prefix runs past the end of the file",
                             "pass a whole file (the Collector may still be writing it)")
        position += 4
        yield number, data[position:position + size]
        position += size


def _read_messages(data: bytes, source: str, decoded: Decoded) -> None:
    for number, message in _messages(data, source):
        where = f"{source}:message {number}"
        if message.startswith(ZSTD_MAGIC):  # the file exporter's per-message compression
            message = _unzstd(message, where)
            decoded.compressed_messages = True
        if _is_json(message):
            for line, value in parse_json_values(message.decode("utf-8", errors="replace"), where, _FIX):
                if not isinstance(value, dict) or not ("resourceSpans" in value or "resource_spans" in value):
                    raise InputError(source, f"message {number}", "a JSON message that is not an OTLP export", _FIX)
                decoded.spans += json_spans(value, where)
        else:
            try:
                decoded.spans += proto_spans(message, source, number)
            except InputError as error:
                if number == 1 and error.field is not None:  # the first message is no protobuf export either
                    raise _unknown(source) from None
                raise


# ---------------------------------------------------------------------------------------------
# OTLP JSON (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding): camelCase names,
# hex trace and span ids, 64-bit integers as strings, enums as integers.


def _get(obj: Mapping, camel: str, snake: str) -> object:
    return obj[camel] if camel in obj else obj.get(snake)


def _json_value(value: object) -> object:
    if not isinstance(value, Mapping):
        return None
    for key in ("stringValue", "string_value", "boolValue", "bool_value", "doubleValue", "double_value"):
        if key in value:
            return value[key]
    integer = _get(value, "intValue", "int_value")
    if integer is not None:
        try:
            return int(str(integer))
        except ValueError:
            return None
    array = _get(value, "arrayValue", "array_value")
    if isinstance(array, Mapping):
        return [_json_value(v) for v in array.get("values") or ()]
    kvlist = _get(value, "kvlistValue", "kvlist_value")
    if isinstance(kvlist, Mapping):
        return _json_attributes(kvlist.get("values"))
    return None


def _json_attributes(items: object) -> dict[str, object]:
    if not isinstance(items, list):
        return {}
    return {str(item.get("key")): _json_value(item.get("value")) for item in items if isinstance(item, Mapping)}


def _id(value: object, length: int) -> str | None:
    """A trace or span id as lowercase hex: OTLP JSON writes hex; protobuf's generic JSON mapping
    writes base64, also accepted."""
    if not isinstance(value, str) or not value:
        return None
    if len(value) == 2 * length:
        try:
            bytes.fromhex(value)
            return value.lower()
        except ValueError:
            pass
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == length else None


def _nanoseconds(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(str(value))
    except ValueError:
        return None


def json_spans(payload: Mapping, source: str) -> list[Span]:
    """The spans of one OTLP JSON `ExportTraceServiceRequest`; a list of the protocol that is not a
    list of objects is refused (a document shaped otherwise is no OTLP export, not an empty one)."""
    spans: list[Span] = []
    for i, resource_spans in enumerate(_list(_get(payload, "resourceSpans", "resource_spans"), source, "resourceSpans")):
        where = f"resourceSpans[{i}]"
        resource = _json_attributes((_mapping(resource_spans.get("resource"))).get("attributes"))
        scopes = _get(resource_spans, "scopeSpans", "scope_spans") or resource_spans.get("instrumentationLibrarySpans")
        for j, scope_spans in enumerate(_list(scopes or [], source, f"{where}.scopeSpans")):
            scope = _mapping(scope_spans.get("scope") or scope_spans.get("instrumentationLibrary")).get("name")
            for span in _list(scope_spans.get("spans") or [], source, f"{where}.scopeSpans[{j}].spans"):
                spans.append(_json_span(span, resource, scope if isinstance(scope, str) else "", source))
    return spans


def _list(value: object, source: str, name: str) -> list[Mapping]:
    """The objects of an OTLP list field; anything else is not OTLP."""
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        raise InputError(source, name, f"is not a list of objects ({type(value).__name__}), so this is no OTLP export", _FIX)
    return value


def _mapping(value: object) -> Mapping:
    return value if isinstance(value, Mapping) else {}


def _json_span(span: Mapping, resource: Mapping[str, object], scope: str, source: str) -> Span:
    raw_trace_id, raw_span_id = _get(span, "traceId", "trace_id"), _get(span, "spanId", "span_id")
    trace_id, span_id = _id(raw_trace_id, 16), _id(raw_span_id, 8)
    name = span.get("name")
    where = f"span {span_id}" if span_id else f"span {name!r}"
    if not raw_trace_id or not raw_span_id:  # the protocol gives every span both ids
        raise InputError(source, where, "no traceId or spanId", "export spans as an OpenTelemetry SDK records them, with their ids")
    if trace_id is None or span_id is None:
        raise InputError(source, where, f"malformed traceId/spanId ({raw_trace_id!r}, {raw_span_id!r})",
                         "export spans with OTLP JSON's hex ids")
    start, end = _nanoseconds(_get(span, "startTimeUnixNano", "start_time_unix_nano")), _nanoseconds(_get(span, "endTimeUnixNano", "end_time_unix_nano"))
    if start is None or end is None or not 0 <= start <= end < 2**64:  # fixed64 in the protocol
        raise InputError(source, where, "missing or bad start/end time", "export spans with startTimeUnixNano and endTimeUnixNano")
    status = _mapping(span.get("status"))
    code = status.get("code")
    message = status.get("message")
    return Span(
        trace_id=trace_id,
        span_id=span_id,
        parent_id=_id(_get(span, "parentSpanId", "parent_span_id"), 8),
        name=name if isinstance(name, str) else "",
        start_ns=start,
        end_ns=end,
        attributes=_json_attributes(span.get("attributes")),
        resource=resource,
        scope=scope,
        failed=code in (_STATUS_ERROR, "STATUS_CODE_ERROR"),
        status_message=message if isinstance(message, str) and message else None,
        location=source,
    )


# ---------------------------------------------------------------------------------------------
# OTLP protobuf, decoded by the opentelemetry-proto package


def _proto_value(value: AnyValue) -> object:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_proto_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _proto_attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind) if kind else None


def _proto_attributes(items: Iterable[KeyValue]) -> dict[str, object]:
    return {item.key: _proto_value(item.value) for item in items}


def proto_spans(message: bytes, source: str, number: int) -> list[Span]:
    """The spans of one protobuf-encoded `ExportTraceServiceRequest`."""
    try:
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    except ModuleNotFoundError:
        raise InputError(source, None, "OTLP protobuf, and the opentelemetry-proto package is not installed",
                         "pip install 'scepsy[tracing]'") from None
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(message)
    except DecodeError as exc:
        raise InputError(source, f"message {number}", f"not an OTLP protobuf export ({exc})", _FIX) from None
    where = f"{source}:message {number}"
    spans = []
    for resource_spans in request.resource_spans:
        resource = _proto_attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(_proto_span(span, resource, scope_spans.scope.name, where))
    return spans


def _proto_span(span: ProtoSpan, resource: Mapping[str, object], scope: str, source: str) -> Span:
    where = f"span {span.span_id.hex()}" if len(span.span_id) == 8 else f"span {span.name!r}"
    if not span.trace_id or not span.span_id:  # the protocol gives every span both ids
        raise InputError(source, where, "no trace_id or span_id", "export spans as an OpenTelemetry SDK records them, with their ids")
    if len(span.trace_id) != 16 or len(span.span_id) != 8:
        raise InputError(source, where, "malformed trace_id/span_id (not 16 and 8 bytes)", _FIX)
    if span.end_time_unix_nano < span.start_time_unix_nano:
        raise InputError(source, where, "ends before it starts", _FIX)
    return Span(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex() if len(span.parent_span_id) == 8 else None,
        name=span.name,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        attributes=_proto_attributes(span.attributes),
        resource=resource,
        scope=scope,
        failed=span.status.code == _STATUS_ERROR,
        status_message=span.status.message or None,
        location=source,
    )
