"""Measurement: `scepsy proxy`, `traces export`, `aggregate`, `emulate`, `topology` (docs/tracing.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from scepsy.cli.app import app, traces_app
from scepsy.cli.common import (
    CatalogGpuOpt,
    CatalogModelOpt,
    DatabaseVersionOpt,
    EngineBackendOpt,
    EngineModelOpt,
    FractionOpt,
    HostOpt,
    JsonOpt,
    PortOpt,
    TpOpt,
    TracesArg,
    WeightsOpt,
    emit_json,
    errors,
    finite,
    say,
    stderr,
    stdout,
)
from scepsy.models.errors import InputError
from scepsy.models.output import check_output, write_text, writing
from scepsy.tracing.capture.otlp import FORMATS as OTLP_FORMATS


def _parse_upstreams(values: list[str]) -> dict[str, str]:
    upstreams: dict[str, str] = {}
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise InputError(None, "--upstream", f"{value!r} is not NAME=URL", "write e.g. --upstream gen=http://127.0.0.1:8001")
        if name in upstreams:
            raise InputError(None, "--upstream", f"llm {name!r} given twice", "name each upstream once")
        upstreams[name] = url
    if not upstreams:
        raise InputError(None, "--upstream", "no upstream given", "add --upstream NAME=URL for each LLM")
    return upstreams


def _parse_llm_names(values: list[str]) -> dict[str, str]:
    names = {}
    for value in values:
        model, sep, llm = value.partition("=")
        if not sep or not model or not llm:
            raise InputError(None, "--llm-name", f"{value!r} is not MODEL=LLM", "write e.g. --llm-name meta-llama/Llama-3.2-1B=gen")
        names[model] = llm
    return names


@app.command()
def proxy(
    upstream: Annotated[list[str], typer.Option("--upstream", help="LLM name and engine base URL, NAME=URL (repeat per LLM).")],
    port: PortOpt = 9000,
    host: HostOpt = "127.0.0.1",
    store: Annotated[Path, typer.Option("--store", help="SQLite trace store (WAL mode).")] = Path("traces.db"),
    no_bodies: Annotated[bool, typer.Option("--no-bodies", help="Do not record request/response bodies (traces then cannot be replayed).")] = False,
    timeout_s: Annotated[float, typer.Option("--timeout-s", min=0.1, help="Answer 504 when an upstream sends nothing for this long.")] = 600.0,
    max_body_mib: Annotated[float, typer.Option("--max-body-mib", min=0.0, help="Store request/response bodies up to this size, MiB (larger ones: only their sizes).")] = 16.0,
) -> None:
    """Run the tracing proxy in front of OpenAI-compatible engines (until Ctrl-C)."""
    from scepsy.tracing.capture.proxy import ProxyConfig, serve
    from scepsy.tracing.capture.store import TraceStore

    with errors():
        finite(timeout_s, "--timeout-s")
        finite(max_body_mib, "--max-body-mib")
        upstreams = _parse_upstreams(upstream)
        try:
            trace_store = TraceStore(store)
        except Exception as exc:  # noqa: BLE001 - sqlite errors become one line
            raise InputError(str(store), None, f"cannot open the trace store ({exc})", "choose a writable --store path") from None
        routes = ", ".join(f"{name}={url} (/{name}/v1/...)" for name, url in sorted(upstreams.items()))
        stderr.print(f"scepsy proxy on http://{host}:{port}: {routes}; recording to {store}", markup=False, highlight=False)
        try:
            config = ProxyConfig(upstreams, store=trace_store, record_bodies=not no_bodies, timeout_s=timeout_s,
                                 max_body_bytes=int(max_body_mib * 2**20))
            serve(config, host=host, port=port)
        finally:
            trace_store.close()
            stderr.print(f"recorded {trace_store.written} calls to {store}" + (f" ({trace_store.write_errors} failed to write)" if trace_store.write_errors else ""), markup=False)


@app.command()
def emulate(
    model: CatalogModelOpt,
    gpu: CatalogGpuOpt,
    tp: TpOpt = 1,
    fraction: FractionOpt = 1.0,
    port: PortOpt = 8000,
    host: HostOpt = "127.0.0.1",
    served_model_name: Annotated[list[str], typer.Option("--served-model-name", help="Name clients put in the `model` field (repeat for several; default: the model's Hugging Face id).")] = [],
    max_model_len: Annotated[Optional[int], typer.Option("--max-model-len", min=2, help="Longest prompt + completion, tokens (default: the model's context, capped by the KV cache).")] = None,
    speedup: Annotated[float, typer.Option("--speedup", help="Run the modelled clock this many times faster than the wall clock (every modelled time is divided by it).")] = 1.0,
    mean_output_tokens: Annotated[float, typer.Option("--mean-output-tokens", min=0.0, help="Draw each sequence's end from a geometric length of this mean (0: sequences run to max_tokens).")] = 0.0,
    prefix_caching: Annotated[bool, typer.Option("--prefix-caching/--no-prefix-caching", help="Reuse the KV cache of earlier prompts and outputs (vLLM's default).")] = True,
    weights: WeightsOpt = None,
    engine_model: EngineModelOpt = "builtin",
    backend: EngineBackendOpt = "vllm",
    database_version: DatabaseVersionOpt = "current",
    personality: Annotated[str, typer.Option("--personality", help="vllm (no /server_info) or sglang (adds /server_info and /model_info, as the SGLang gateway reads them).")] = "vllm",
) -> None:
    """Serve an OpenAI-compatible engine emulator whose timing follows the engine model (until Ctrl-C)."""
    from scepsy.tracing.emulation.emulator import emulator_config, serve

    with errors():
        config = emulator_config(model, gpu, tp, fraction, served_model_name, max_model_len, speedup,
                                 mean_output_tokens, prefix_caching, weights=weights, engine_model=engine_model,
                                 backend=backend, database_version=database_version, personality=personality)
        stderr.print(f"scepsy emulate on http://{host}:{port}: {config.describe()}", markup=False, highlight=False, soft_wrap=True)
        serve(config, host=host, port=port)


@traces_app.command("export")
def traces_export(
    traces: TracesArg,
    out: Annotated[Path, typer.Option("--out", help="Output file.")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or parquet.")] = "jsonl",
    no_bodies: Annotated[bool, typer.Option("--no-bodies", help="Leave request/response bodies out.")] = False,
) -> None:
    """Export traces as JSONL (one call per line) or Parquet."""
    from scepsy.tracing.capture.traces import export_traces, load_traces

    with errors():
        if fmt not in ("jsonl", "parquet"):
            raise InputError(None, "--format", f"unknown format {fmt!r}", "use jsonl or parquet")
        check_output(out, traces)
        calls = load_traces(traces)
        with writing(out):
            count = export_traces(calls, out, fmt, bodies=not no_bodies)
        stderr.print(f"wrote {count} calls to {out}", markup=False)


@app.command(epilog="Accepted trace files: proxy stores (.db); scepsy's .jsonl and .parquet exports; OpenTelemetry "
             f"spans in any file, read by content: {OTLP_FORMATS}. Spans of the OpenTelemetry GenAI conventions, "
             "OpenLLMetry and OpenInference are read; see docs/tracing.md.")
def aggregate(
    traces: TracesArg,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the statistics as YAML (each workflow's `stages` drops into an instance).")] = None,
    workflow: Annotated[str, typer.Option("--workflow", help="Workflow name for calls that carry none (no X-Workflow-Name header; spans without a workflow name).")] = "workflow",
    llm_name: Annotated[list[str], typer.Option("--llm-name", help="Spans: map a model name (gen_ai.request.model, llm.model_name) to an LLM name, MODEL=LLM.")] = [],
    workflow_attribute: Annotated[Optional[str], typer.Option("--workflow-attribute", metavar="KEY", help="Spans: the attribute that names each request's workflow (on the span the application starts per request); tried before gen_ai.workflow.name, traceloop.workflow.name, scepsy.workflow.name, the root span's name and service.name.")] = None,
    json_output: JsonOpt = False,
) -> None:
    """Per workflow and LLM: invocations n, parallelism p, their spread and time shares."""
    import yaml

    from scepsy import api
    from scepsy.tracing.statistics.stats import stats_to_dict, stats_view

    with errors():
        if out is not None:
            check_output(out, traces)
        stats = api.aggregate_traces(traces, _parse_llm_names(llm_name), workflow, workflow_attribute)
        for warning in stats.warnings:
            say(f"warning: {warning}")
        data = stats_to_dict(stats)
        if out is not None:
            write_text(out, f"# scepsy aggregate {' '.join(map(str, traces))}\n" + yaml.safe_dump(data, sort_keys=False))
        if json_output:
            sys.stdout.write(json.dumps(data, indent=2) + "\n")
        else:
            stdout.print(stats_view(stats))


@app.command()
def topology(
    node_name: Annotated[Optional[str], typer.Option("--node-name", help="Node name in the cluster file (default: this host's name, as Kubernetes uses it).")] = None,
    gpu_type: Annotated[Optional[str], typer.Option("--gpu-type", help="GPU type name (default: derived from the NVML product name, e.g. H100, A6000).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the node entry (YAML) to this file.")] = None,
    record: Annotated[Optional[Path], typer.Option("--record", help="Also save NVML's raw answers (JSON) to this file, for a bug report or --replay.")] = None,
    replay: Annotated[Optional[Path], typer.Option("--replay", help="Read NVML answers saved with --record instead of this machine's NVML.")] = None,
    json_output: JsonOpt = False,
) -> None:
    """Read this GPU node's topology from NVML and write its cluster-file entry (GPUs, NVLink domains, UUIDs)."""
    from scepsy.tracing.discovery.topology import RecordedNvml, discover, real_nvml
    from scepsy.tracing.discovery.topology import record as record_answers

    with errors():
        for path, option in ((out, "--out"), (record, "--record")):
            if path is not None:
                check_output(path, [replay], option)
        nvml = RecordedNvml.from_file(replay) if replay is not None else real_nvml()
        found = discover(nvml, node_name, gpu_type)
        if record is not None:
            emit_json(record_answers(nvml), record, False, option="--record")
        text = found.to_yaml()
        if out is not None:
            write_text(out, text)
        if json_output:
            emit_json(found.to_json(), None, True)
        else:
            sys.stdout.write(text)
        for warning in found.warnings:
            stderr.print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)
