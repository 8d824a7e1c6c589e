"""Reading and writing traces: the proxy's SQLite store, JSONL and Parquet exports, OTLP GenAI spans.

`load_traces(paths)` reads any mix of:
- `*.db` / `*.sqlite`: a proxy store (tracing/capture/store.py);
- `*.jsonl`: one call record per line as `export_traces` writes it, or OTLP JSON export lines
  (one `{"resourceSpans": [...]}` object per line, as the OpenTelemetry Collector's file exporter
  writes them);
- `*.json`: one OTLP JSON export (`{"resourceSpans": [...]}`);
- `*.parquet`: a Parquet export.

OpenTelemetry GenAI spans. A span is an LLM call when it has a `gen_ai.operation.name` or
`gen_ai.request.model` attribute. Its trace id is the workflow request id; the workflow name is the
span's `scepsy.workflow.name` attribute if set, else the resource's `service.name`; the LLM is the
`gen_ai.request.model` (renamed through `llm_names` when given), else `gen_ai.response.model`.
Token counts come from `gen_ai.usage.input_tokens` / `gen_ai.usage.output_tokens` (or the older
`prompt_tokens` / `completion_tokens` names). Spans carry no request bodies, so OTLP traces feed
`aggregate` but not `profile`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

from scepsy.models.errors import InputError
from scepsy.models.inputs import check_input, parse_json_text, read_text

from scepsy.tracing.capture.records import COLUMNS, CallRecord
from scepsy.tracing.capture.store import read_store

_TRACE_FIX = "pass a proxy store (.db), a .jsonl, .json or .parquet export"
_OTLP_OPERATION_PATHS = {
    "chat": "/v1/chat/completions",
    "text_completion": "/v1/completions",
    "generate_content": "/v1/chat/completions",
    "embeddings": "/v1/embeddings",
}


def _attribute_value(value: Mapping) -> object:
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    if "intValue" in value:
        return int(value["intValue"])
    if "arrayValue" in value:
        return [_attribute_value(v) for v in value["arrayValue"].get("values", [])]
    return None


def _attributes(items: Iterable[Mapping] | None) -> dict:
    return {item.get("key"): _attribute_value(item.get("value") or {}) for item in items or ()}


def _otlp_status(span: Mapping) -> tuple[int, str, str | None]:
    code = (span.get("status") or {}).get("code", 0)
    if code in (2, "STATUS_CODE_ERROR"):
        return 500, "upstream_error", (span.get("status") or {}).get("message")
    return 200, "ok", None


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def otlp_calls(payload: Mapping, source: str, llm_names: Mapping[str, str] | None = None) -> list[CallRecord]:
    """Call records from one OTLP JSON export (`resourceSpans`); non-GenAI spans are skipped."""
    llm_names = llm_names or {}
    calls: list[CallRecord] = []
    for resource_spans in payload.get("resourceSpans") or []:
        resource = _attributes((resource_spans.get("resource") or {}).get("attributes"))
        for scope_spans in resource_spans.get("scopeSpans") or resource_spans.get("instrumentationLibrarySpans") or []:
            for span in scope_spans.get("spans") or []:
                attrs = _attributes(span.get("attributes"))
                model = attrs.get("gen_ai.request.model") or attrs.get("gen_ai.response.model")
                operation = attrs.get("gen_ai.operation.name")
                if model is None and operation is None:
                    continue
                if model is None:
                    raise InputError(source, f"span {span.get('spanId')}", "GenAI span without gen_ai.request.model", "export spans with the model attribute")
                try:
                    start_s = int(span["startTimeUnixNano"]) / 1e9
                    end_s = int(span["endTimeUnixNano"]) / 1e9
                except (KeyError, ValueError, TypeError):
                    raise InputError(source, f"span {span.get('spanId')}", "missing or bad start/end time", "export spans with startTimeUnixNano and endTimeUnixNano") from None
                status, outcome, error = _otlp_status(span)
                prompt = attrs.get("gen_ai.usage.input_tokens", attrs.get("gen_ai.usage.prompt_tokens"))
                completion = attrs.get("gen_ai.usage.output_tokens", attrs.get("gen_ai.usage.completion_tokens"))
                calls.append(
                    CallRecord(
                        call_id=str(span.get("spanId") or f"{span.get('traceId')}-{len(calls)}"),
                        llm=llm_names.get(str(model), str(model)),
                        path=_OTLP_OPERATION_PATHS.get(str(operation), "/v1/chat/completions"),
                        start_s=start_s,
                        end_s=end_s,
                        status=status,
                        outcome=outcome,
                        workflow=_text(attrs.get("scepsy.workflow.name") or resource.get("service.name")),
                        workflow_id=str(span.get("traceId")) if span.get("traceId") else None,
                        model=str(model),
                        stream=bool(attrs.get("gen_ai.request.stream", False)),
                        prompt_tokens=int(prompt) if prompt is not None else None,
                        completion_tokens=int(completion) if completion is not None else None,
                        usage_source="usage" if prompt is not None or completion is not None else None,
                        error=error,
                    )
                )
    return calls


def _read_jsonl(path: Path, llm_names: Mapping[str, str] | None) -> list[CallRecord]:
    calls = []
    for number, line in enumerate(read_text(path, _TRACE_FIX).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise InputError(str(path), f"line {number}", f"not JSON ({exc})", "write one JSON object per line") from None
        if not isinstance(row, dict):
            raise InputError(str(path), f"line {number}", "not a JSON object", "write one record per line")
        if "resourceSpans" in row:
            calls += otlp_calls(row, f"{path}:{number}", llm_names)
            continue
        missing = [c for c in ("call_id", "llm", "path", "start_s", "end_s", "status") if c not in row]
        if missing:
            raise InputError(str(path), f"line {number}", f"missing field {missing[0]}", "export traces with `scepsy traces export`")
        try:
            calls.append(CallRecord.from_row(row))
        except ValueError as exc:
            raise InputError(str(path), f"line {number}", str(exc), "export traces with `scepsy traces export`") from None
    return calls


def _read_parquet(path: Path) -> list[CallRecord]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    return [CallRecord.from_row(row) for row in table.to_pylist()]


def parse_llm_names(items: Iterable[str]) -> dict[str, str]:
    """OTLP model -> LLM name from MODEL=LLM items (the command line's `--llm-name`)."""
    names = {}
    for item in items:
        model, sep, llm = item.partition("=")
        if not sep or not model or not llm:
            raise InputError(None, "llm_names", f"{item!r} is not MODEL=LLM", "write e.g. meta-llama/Llama-3.2-1B=gen")
        names[model] = llm
    return names


def load_traces(paths: Iterable[Path | str], llm_names: Mapping[str, str] | None = None) -> list[CallRecord]:
    """Every call record in the given files, sorted by (start_s, call_id)."""
    calls: list[CallRecord] = []
    for path in map(Path, paths):
        check_input(path, _TRACE_FIX)
        suffix = path.suffix.lower()
        try:
            if suffix in (".db", ".sqlite", ".sqlite3"):
                calls += list(read_store(path))
            elif suffix == ".jsonl":
                calls += _read_jsonl(path, llm_names)
            elif suffix == ".json":
                payload = parse_json_text(read_text(path, _TRACE_FIX), str(path), _TRACE_FIX)
                if not isinstance(payload, dict) or "resourceSpans" not in payload:
                    raise InputError(str(path), None, "not an OTLP JSON export (no resourceSpans)", "pass an OTLP JSON file or a .jsonl export")
                calls += otlp_calls(payload, str(path), llm_names)
            elif suffix == ".parquet":
                calls += _read_parquet(path)
            else:
                raise InputError(str(path), None, f"unknown trace format {suffix!r}", "use .db, .jsonl, .json (OTLP) or .parquet")
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - sqlite/pyarrow/json errors become one clear line
            raise InputError(str(path), None, f"cannot read traces ({type(exc).__name__}: {exc})", "pass an intact trace file") from None
    return sorted(calls, key=lambda c: (c.start_s, c.call_id))


def export_traces(calls: Iterable[CallRecord], out: Path | str, fmt: str, bodies: bool = True) -> int:
    """Write records as JSONL (one object per line, sorted keys) or Parquet; returns the count."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for call in calls:
        row = call.to_row()
        if not bodies:
            row["request_body"] = row["response_body"] = None
        rows.append(row)
    if fmt == "jsonl":
        with out.open("w") as handle:
            for row in rows:
                handle.write(json.dumps(row, sort_keys=True) + "\n")
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema(
            [
                ("call_id", pa.string()), ("llm", pa.string()), ("path", pa.string()), ("start_s", pa.float64()),
                ("end_s", pa.float64()), ("status", pa.int32()), ("outcome", pa.string()), ("workflow", pa.string()),
                ("workflow_id", pa.string()), ("model", pa.string()), ("stream", pa.bool_()), ("ttft_s", pa.float64()),
                ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()), ("usage_source", pa.string()),
                ("request_body", pa.string()), ("response_body", pa.string()), ("error", pa.string()),
                ("request_bytes", pa.int64()), ("response_bytes", pa.int64()),
            ]
        )
        assert tuple(schema.names) == COLUMNS
        table = pa.Table.from_pylist(rows, schema=schema)
        pq.write_table(table, out)
    else:
        raise InputError(None, "format", f"unknown format {fmt!r}", "use jsonl or parquet")
    return len(rows)
