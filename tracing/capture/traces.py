"""Reading and writing traces: the proxy's SQLite store, JSONL and Parquet exports, OpenTelemetry spans.

`read_traces(paths)` reads any mix of:
- `*.db` / `*.sqlite`: a proxy store (tracing/capture/store.py);
- `*.parquet`: a Parquet export;
- any other file, by its content: OTLP spans in any framing and compression the OpenTelemetry
  Collector's file exporter or an SDK's OTLP file exporter writes (tracing/capture/otlp.py), and
  JSON lines of call records as `export_traces` writes them (`.jsonl`).

Spans become call records in tracing/capture/span_calls.py: one workflow request per trace, the
workflow named from the span attributes, only LLM-call spans counted, a call recorded by two
instrumentations counted once; what it found is in the `SpanSummary` with its warnings. Spans
carry no request bodies, so they feed `aggregate` but not `profile`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from scepsy.models.errors import InputError
from scepsy.models.inputs import check_input

from scepsy.tracing.capture.otlp import FORMATS, read_otlp
from scepsy.tracing.capture.records import COLUMNS, CallRecord
from scepsy.tracing.capture.span_calls import SpanSummary, span_calls
from scepsy.tracing.capture.spans import Span
from scepsy.tracing.capture.store import read_store

_TRACE_FIX = "pass a proxy store (.db), a .jsonl or .parquet export, or an OTLP file"
# the trace files `read_traces` accepts (`scepsy aggregate --help` lists them)
TRACE_FILES = ("proxy stores (.db); scepsy's .jsonl and .parquet exports; OpenTelemetry spans in any file, read by "
               f"content: {FORMATS}")


@dataclass(frozen=True)
class TraceSet:
    """The calls of some trace files, and what their spans held (None: no span was read)."""

    calls: tuple[CallRecord, ...]
    spans: SpanSummary | None = None


def _call_rows(path: Path, rows: list[tuple[int, dict]]) -> list[CallRecord]:
    calls = []
    for number, row in rows:
        missing = [c for c in ("call_id", "llm", "path", "start_s", "end_s", "status") if c not in row]
        if missing:
            raise InputError(str(path), f"line {number}", f"neither OTLP spans (resourceSpans) nor a call record (missing field {missing[0]})",
                             "export traces with `scepsy traces export` or an OpenTelemetry file exporter")
        try:
            calls.append(CallRecord.from_row(row))
        except ValueError as exc:
            raise InputError(str(path), f"line {number}", str(exc), "export traces with `scepsy traces export`") from None
    return calls


def _read_parquet(path: Path) -> list[CallRecord]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    return [CallRecord.from_row(row) for row in table.to_pylist()]


_STORES = (".db", ".sqlite", ".sqlite3")


def _read_file(path: Path) -> tuple[list[CallRecord], list[Span]]:
    """The call records and the spans of one trace file (by its suffix, else by its content)."""
    suffix = path.suffix.lower()
    if suffix in _STORES:
        return list(read_store(path)), []
    if suffix == ".parquet":
        return _read_parquet(path), []
    decoded = read_otlp(path)
    return _call_rows(path, decoded.rows), decoded.spans


def parse_llm_names(items: Iterable[str]) -> dict[str, str]:
    """OTLP model -> LLM name from MODEL=LLM items (the command line's `--llm-name`)."""
    names = {}
    for item in items:
        model, sep, llm = item.partition("=")
        if not sep or not model or not llm:
            raise InputError(None, "llm_names", f"{item!r} is not MODEL=LLM", "write e.g. meta-llama/Llama-3.2-1B=gen")
        names[model] = llm
    return names


def read_traces(paths: Iterable[Path | str], llm_names: Mapping[str, str] | None = None,
                workflow_attribute: str | None = None) -> TraceSet:
    """Every call record in the given files, sorted by (start_s, call_id); `llm_names` renames span
    models to LLM names, `workflow_attribute` is the span attribute that names a request's workflow."""
    if workflow_attribute is not None and not workflow_attribute.strip():
        raise InputError(None, "workflow_attribute", "is empty", "give the key of the span attribute that names each "
                         "request's workflow, e.g. app.workflow, or leave it out")
    calls: list[CallRecord] = []
    spans: list[Span] = []
    for path in map(Path, paths):
        check_input(path, _TRACE_FIX)
        try:
            records, found_spans = _read_file(path)
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - sqlite/pyarrow/protobuf errors become one clear line
            raise InputError(str(path), None, f"cannot read traces ({type(exc).__name__}: {exc})", "pass an intact trace file") from None
        if not records and not found_spans:  # stop here rather than report zero calls
            what = "an empty file" if path.stat().st_size == 0 else "holds no call records and no spans"
            raise InputError(str(path), None, f"{what}: no traces to read", f"{_TRACE_FIX} that recorded calls")
        calls += records
        spans += found_spans
    summary = None
    if spans:
        found = span_calls(spans, llm_names, workflow_attribute)
        calls += found.calls
        summary = found.summary
    return TraceSet(tuple(sorted(calls, key=lambda c: (c.start_s, c.call_id))), summary)


def load_traces(paths: Iterable[Path | str], llm_names: Mapping[str, str] | None = None) -> list[CallRecord]:
    """Every call record in the given files, sorted by (start_s, call_id) (`read_traces`' calls)."""
    return list(read_traces(paths, llm_names).calls)


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
