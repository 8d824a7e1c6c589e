"""`scepsy aggregate` on spans from the instrumentation packages people run, generated here against
`scepsy emulate` servers: the official OpenTelemetry openai-v2 instrumentation (with the GenAI
workflow, agent and tool spans of opentelemetry-util-genai), OpenLLMetry's LangChain and OpenAI
instrumentations and OpenInference's LangChain instrumentation (tests/support/instrumented.py,
one process per case, since instrumentors patch their libraries globally).

Each case runs two LangGraph workflows with a fan-out inside one LLM and one across LLMs, and the
workflow records every call's interval around its client call: n and p from the spans must be
within 2% of n and p computed from those intervals (the definitions of tracing/statistics/stats.py,
computed here independently). Files in the Collector's layouts are built from the same run with the
real encoders: the SDK's OTLP JSON file exporter and opentelemetry-exporter-otlp-proto-common's
protobuf encoder, framed and compressed as collector-contrib's exporter/fileexporter writes them
(file_writer.go `exportMessageAsBuffer`: a 4-byte big-endian size before each message, for
`format: proto` and for `compression: zstd`, where codec.go compresses each message as a zstd frame
of its own; the `exporter.file.nativeCompression` feature gate compresses the whole file instead).

No wall-clock bound: emulator readiness is polled with a generous limit, and the comparison is of
the workflow's own measurements against the spans of the same calls.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from support.ports import free_port

from scepsy import api
from scepsy.cli import app
from scepsy.models.errors import InputError
from scepsy.tracing.capture.span_calls import SpanSummary
from scepsy.tracing.capture.traces import read_traces
from scepsy.tracing.statistics.stats import TraceStats, stats_to_dict

zstandard = pytest.importorskip("zstandard")
pytest.importorskip("opentelemetry.instrumentation.openai_v2")
trace_service = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "support" / "instrumented.py"
READY_LIMIT_S = 300.0  # generous: a loaded CI machine starts three emulators
TOLERANCE = 0.02
REQUESTS = 3  # per workflow
LLMS = ("gen", "ver", "judge")
WORKFLOWS = ("wide", "narrow")  # tests/support/instrumented.py


@pytest.fixture(scope="module")
def emulators(tmp_path_factory):
    """One `scepsy emulate` process per LLM (llama-3.2-1b on a quarter of an L4: ~43 ms a token)."""
    logs = tmp_path_factory.mktemp("emulators")
    processes, urls = [], {}
    try:
        for llm in LLMS:
            port = free_port()
            log = open(logs / f"{llm}.log", "wb")
            processes.append((subprocess.Popen(
                [sys.executable, "-m", "scepsy", "emulate", "--model", "llama-3.2-1b", "--gpu", "L4", "--fraction", "0.25",
                 "--served-model-name", llm, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT), log))
            urls[llm] = f"http://127.0.0.1:{port}"
        for llm, url in urls.items():
            deadline = time.monotonic() + READY_LIMIT_S
            while not _healthy(url):
                assert time.monotonic() < deadline, f"emulator of {llm} not ready: {(logs / f'{llm}.log').read_text()}"
                time.sleep(0.2)
        yield urls
    finally:
        for process, log in processes:
            process.terminate()
            process.wait(timeout=30)
            log.close()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5.0).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def run(emulators, tmp_path_factory):
    """run(case) -> the folder with the case's sdk.jsonl, spans.pb and truth.json (once per case)."""
    done: dict[str, Path] = {}

    def run_case(case: str) -> Path:
        if case not in done:
            out = tmp_path_factory.mktemp(case)
            result = subprocess.run([sys.executable, str(SCRIPT), case, json.dumps(emulators), str(out), str(REQUESTS)],
                                    capture_output=True, text=True)
            assert result.returncode == 0, result.stdout + result.stderr
            done[case] = out
        return done[case]

    return run_case


# ---------------------------------------------------------------------------------------------
# the truth the workflow knows, computed independently of scepsy's statistics code


def _busy_s(intervals: list[tuple[int, int]]) -> float:
    total, current_start, current_end = 0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None and current_start is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None and current_start is not None:
        total += current_end - current_start
    return total / 1e9


def truth(out: Path) -> dict[tuple[str, str], tuple[float, float]]:
    """(workflow, llm) -> (n, p): calls per request, and call time over busy time pooled over requests."""
    calls = json.loads((out / "truth.json").read_text())
    requests: dict[str, dict[str, dict[str, list[tuple[int, int]]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for call in calls:
        requests[call["workflow"]][call["request"]][call["llm"]].append((call["start_ns"], call["end_ns"]))
    out_stats = {}
    for workflow, by_request in requests.items():
        for llm in LLMS:
            mine = [r[llm] for r in by_request.values()]
            n = sum(len(m) for m in mine) / len(by_request)
            call_time = sum((end - start) / 1e9 for m in mine for start, end in m)
            busy = sum(_busy_s(m) for m in mine if m)
            out_stats[(workflow, llm)] = (n, call_time / busy)
    return out_stats


def measured(stats: TraceStats) -> dict[tuple[str, str], tuple[float, float]]:
    return {(w.name, s.llm): (s.invocations, s.parallelism) for w in stats.workflows for s in w.llms}


def assert_within(stats: TraceStats, out: Path) -> dict[tuple[str, str], tuple[float, float]]:
    """n and p of every workflow and LLM within 2% of the truth; returns the relative errors."""
    expected, got = truth(out), measured(stats)
    assert set(got) == set(expected), (sorted(got), sorted(expected))
    errors = {}
    for key, (n, p) in expected.items():
        errors[key] = (abs(got[key][0] / n - 1), abs(got[key][1] / p - 1))
        assert errors[key][0] <= TOLERANCE and errors[key][1] <= TOLERANCE, (key, got[key], (n, p))
    return errors


def calls_of(out: Path) -> int:
    return len(json.loads((out / "truth.json").read_text()))


# ---------------------------------------------------------------------------------------------
# one case per instrumentation set-up


def checked(run, case: str, workflow_attribute: str | None = None) -> tuple[TraceStats, SpanSummary, Path]:
    """The case's statistics from the SDK exporter's file, n and p checked against the truth."""
    out = run(case)
    stats = api.aggregate_traces([out / "sdk.jsonl"], workflow_attribute=workflow_attribute)
    assert_within(stats, out)
    assert stats.spans is not None
    return stats, stats.spans, out


def named_by(source: str) -> dict[str, str]:
    return {workflow: source for workflow in WORKFLOWS}


def test_workflow_named_by_an_attribute_of_the_parent_span(run):
    stats, spans, out = checked(run, "parent_attribute", "app.workflow")
    assert stats.warnings == () and spans.workflow_sources == named_by("workflow attribute")
    assert spans.skipped == {"other": 2 * REQUESTS}  # the application's request spans
    # without the attribute the root span's name (the same for both workflows) merges them: said so
    merged = api.aggregate_traces([out / "sdk.jsonl"])
    assert [w.name for w in merged.workflows] == ["handle"]
    (warning,) = merged.warnings
    assert f"all {2 * REQUESTS} workflow requests are named 'handle' (from the root span name)" in warning
    assert "pass its key as `workflow_attribute`" in warning and "--" not in warning  # the API's name


def test_genai_workflow_agent_and_tool_spans_are_skipped_and_counted(run):
    stats, spans, out = checked(run, "genai_spans")
    assert stats.warnings == () and spans.workflow_sources == named_by("gen_ai.workflow.name")
    calls = calls_of(out)
    assert spans.skipped == {"workflow": 2 * REQUESTS, "agent": calls, "tool": calls}


def test_openllmetry_and_openai_v2_together_count_each_call_once(run):
    stats, spans, out = checked(run, "openllmetry_openai_v2")
    calls = calls_of(out)
    assert (spans.llm_calls, spans.duplicate_calls) == (calls, calls)
    assert spans.workflow_sources == named_by("traceloop.workflow.name")
    assert {"task", "workflow", "agent"} <= set(spans.skipped)  # OpenLLMetry's LangGraph spans
    (warning,) = stats.warnings
    assert f"{calls} LLM calls were recorded by two instrumentations" in warning
    assert "opentelemetry.instrumentation.langchain around" in warning


def test_openllmetry_langchain_and_openai(run):
    stats, spans, _ = checked(run, "openllmetry")
    assert stats.warnings == () and spans.workflow_sources == named_by("traceloop.workflow.name")


def test_openinference_langchain(run):
    stats, spans, out = checked(run, "openinference")
    assert stats.warnings == () and spans.workflow_sources == named_by("root span name")
    assert set(spans.skipped) == {"chain"}
    tokens = [c for c in read_traces([out / "sdk.jsonl"]).calls if c.llm == "gen"]
    assert all(c.completion_tokens == 12 and c.prompt_tokens for c in tokens)  # llm.token_count.*


def test_calls_without_parent_spans_are_requests_of_their_own(run):
    """openai-v2 alone in a LangGraph app: no span joins a request's calls. Each call is then its own
    request, so n is each LLM's share of all calls and p is 1, as the warning says."""
    out = run("no_parent")
    stats = api.aggregate_traces([out / "sdk.jsonl"])
    (workflow,) = stats.workflows
    calls = json.loads((out / "truth.json").read_text())
    assert workflow.name == "scepsy-test-no_parent" and workflow.requests == len(calls)
    for llm_stats in workflow.llms:
        share = sum(1 for c in calls if c["llm"] == llm_stats.llm) / len(calls)
        assert llm_stats.invocations == pytest.approx(share, rel=TOLERANCE) and llm_stats.parallelism == 1.0
    (warning,) = stats.warnings
    assert warning.startswith(f"{len(calls)} of {len(calls)} LLM calls have no parent span")
    assert "n is then the LLM's share of all calls and p is 1" in warning


# ---------------------------------------------------------------------------------------------
# file formats: one run, written as the Collector's file exporter and the SDKs write it


def _messages(data: bytes) -> list[bytes]:
    out, position = [], 0
    while position < len(data):
        size = int.from_bytes(data[position:position + 4], "big")
        out.append(data[position + 4:position + 4 + size])
        position += 4 + size
    return out


def _framed(messages: list[bytes]) -> bytes:
    return b"".join(len(m).to_bytes(4, "big") + m for m in messages)


def collector_files(out: Path, folder: Path) -> dict[str, Path]:
    """The same spans in every layout: name -> file."""
    json_lines = (out / "sdk.jsonl").read_bytes()
    lines = [line for line in json_lines.splitlines() if line.strip()]
    proto = (out / "spans.pb").read_bytes()
    zstd = zstandard.ZstdCompressor()
    layouts = {
        "sdk.jsonl": json_lines,  # the SDK's OTLP JSON file exporter, as it wrote it
        "traces": json_lines,  # the file exporter's `path: ./traces` (no extension), format: json
        "traces.json": json_lines,  # `path: ./filename.json`, several lines
        "pretty.json": b"\n".join(json.dumps(json.loads(line), indent=2).encode() for line in lines),
        "traces.json.gz": gzip.compress(json_lines),
        "json-zstd-per-message": _framed([zstd.compress(line) for line in lines]),  # compression: zstd
        "traces.json.zst": zstd.compress(json_lines),  # exporter.file.nativeCompression
        "traces.proto": proto,  # format: proto
        "proto-zstd-per-message": _framed([zstd.compress(m) for m in _messages(proto)]),  # format: proto, compression: zstd
        "traces.proto.zst": zstd.compress(proto),  # format: proto with exporter.file.nativeCompression
    }
    files = {}
    for name, data in layouts.items():
        (folder / name).write_bytes(data)
        files[name] = folder / name
    return files


def test_every_collector_and_sdk_layout_gives_the_same_statistics(run, tmp_path):
    out = run("parent_attribute")
    files = collector_files(out, tmp_path)
    assert len(_messages(files["traces.proto"].read_bytes())) > 1  # several messages, as the Collector writes them
    reference = stats_to_dict(api.aggregate_traces([files["sdk.jsonl"]], workflow_attribute="app.workflow"))
    for name, path in files.items():
        stats = api.aggregate_traces([path], workflow_attribute="app.workflow")
        assert stats_to_dict(stats) == reference, name
        assert_within(stats, out)


def test_aggregate_command_reads_a_collector_file_and_warns_on_stderr(run, tmp_path):
    out = run("parent_attribute")
    files = collector_files(out, tmp_path)
    result = CliRunner().invoke(app, ["aggregate", str(files["traces.proto.zst"]), "--workflow-attribute", "app.workflow", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {w["name"] for w in data["workflows"]} == {"wide", "narrow"}
    assert data["spans"]["llm_calls"] == calls_of(out) and result.stderr == ""
    merged = CliRunner().invoke(app, ["aggregate", str(files["traces"])])
    assert merged.exit_code == 0, merged.output
    (line,) = merged.stderr.splitlines()
    assert line.startswith("warning: all 6 workflow requests are named 'handle'") and "pass its key as --workflow-attribute," in line
    help_text = CliRunner().invoke(app, ["aggregate", "--help"]).stdout
    for accepted in ("OTLP JSON", "OTLP protobuf", "zstd", "gzip", "--workflow-attribute"):
        assert accepted in " ".join(help_text.split()), accepted


# ---------------------------------------------------------------------------------------------
# what the spans can get wrong: each said once, with its fix


def _request(out: Path):
    request = trace_service.ExportTraceServiceRequest()
    for message in _messages((out / "spans.pb").read_bytes()):
        part = trace_service.ExportTraceServiceRequest()
        part.ParseFromString(message)
        request.MergeFrom(part)
    return request


def _write(request, path: Path) -> Path:
    path.write_bytes(_framed([request.SerializeToString()]))
    return path


def _spans(request):
    return [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]


def test_traces_without_their_root_and_with_several_roots_are_reported(run, tmp_path):
    out = run("parent_attribute")
    request = _request(out)
    roots = [(scope, span) for rs in request.resource_spans for scope in rs.scope_spans for span in scope.spans
             if span.name == "handle"]
    for scope, root in roots[:2]:  # two requests lose their root span (not flushed, or in another file)
        scope.spans.remove(root)
    scope, root = roots[2]  # one request gets a second root
    extra = scope.spans.add()
    extra.CopyFrom(root)
    extra.span_id = b"\x01" * 8
    stats = api.aggregate_traces([_write(request, tmp_path / "cut.proto")], workflow_attribute="app.workflow")
    assert stats.spans is not None
    assert (stats.spans.traces_without_root, stats.spans.traces_with_several_roots) == (2, 1)
    assert any(w.startswith(f"2 of {2 * REQUESTS} workflow requests have no root span") for w in stats.warnings)
    assert any(w.startswith(f"1 of {2 * REQUESTS} workflow requests have several root spans") for w in stats.warnings)
    # the requests without a root lose the attribute with it, and are named from their next source
    assert any(w.startswith(f"2 of {2 * REQUESTS} workflow requests carry no attribute app.workflow") for w in stats.warnings)


def test_unknown_schemes_and_spans_read_twice_are_reported(run, tmp_path):
    out = run("parent_attribute")
    request = _request(out)
    changed = 0
    for span in _spans(request):
        for attribute in span.attributes:
            if attribute.key == "gen_ai.operation.name" and changed < 2:
                attribute.value.string_value = "frobnicate"
                changed += 1
    path = _write(request, tmp_path / "odd.proto")
    stats = api.aggregate_traces([path, path], workflow_attribute="app.workflow")
    assert stats.spans is not None
    assert stats.spans.skipped.get("unknown") == 2 and stats.spans.llm_calls == calls_of(out) - 2
    assert stats.spans.repeated_spans == len(_spans(request))
    assert any("2 spans carry LLM attributes scepsy does not read (gen_ai.operation.name=frobnicate)" in w for w in stats.warnings)
    assert any(w.startswith(f"{len(_spans(request))} spans were read more than once") for w in stats.warnings)


def test_broken_and_oversized_files_are_input_errors(run, tmp_path, monkeypatch):
    out = run("parent_attribute")
    proto = (out / "spans.pb").read_bytes()
    (tmp_path / "cut").write_bytes(proto[:-10])
    with pytest.raises(InputError, match="message .*: truncated"):
        read_traces([tmp_path / "cut"])
    (tmp_path / "noise").write_text("this is not a trace file\n")
    with pytest.raises(InputError, match="unknown trace format"):
        read_traces([tmp_path / "noise"])
    # a small zstd file that expands past the input size limit is refused, not expanded
    (tmp_path / "bomb.zst").write_bytes(zstandard.ZstdCompressor().compress(b"{" + b" " * (3 * 2**20)))
    monkeypatch.setenv("SCEPSY_MAX_INPUT_MIB", "2")
    assert (tmp_path / "bomb.zst").stat().st_size < 2**20
    with pytest.raises(InputError, match="expands to more than 2 MiB"):
        read_traces([tmp_path / "bomb.zst"])


def test_an_empty_workflow_attribute_is_refused_by_its_name(run, tmp_path):
    """The API names the argument, the command line its option, before any file is read."""
    path = run("parent_attribute") / "sdk.jsonl"
    with pytest.raises(InputError) as raised:
        api.aggregate_traces([path], workflow_attribute=" ")
    assert raised.value.field == "workflow_attribute" and "--" not in str(raised.value)
    result = CliRunner().invoke(app, ["aggregate", str(path), "--workflow-attribute", ""])
    assert result.exit_code == 2 and result.stderr.startswith("error: --workflow-attribute: is empty"), result.output
