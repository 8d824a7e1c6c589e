"""Measurement: `scepsy proxy`, `traces export`, `aggregate`, `emulate`, `topology` (docs/tracing.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand

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
    stderr,
    stdout,
    warn,
)


def _tell(line: str) -> None:
    stderr.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command()
def proxy(
    upstream: Annotated[list[str], typer.Option("--upstream", help="LLM name and engine base URL, NAME=URL (repeat per LLM).")],
    port: PortOpt = 9000,
    host: HostOpt = "127.0.0.1",
    store: Annotated[Path, typer.Option("--store", help="SQLite trace store (WAL mode).")] = Path("traces.db"),
    no_store: Annotated[bool, typer.Option("--no-store", help="Record nothing (the workflow entry of a deployment: --workflow-priority, --max-in-flight).")] = False,
    no_bodies: Annotated[bool, typer.Option("--no-bodies", help="Do not record request/response bodies (traces then cannot be replayed).")] = False,
    timeout_s: Annotated[float, typer.Option("--timeout-s", min=0.1, help="Answer 504 when an upstream sends nothing for this long.")] = 600.0,
    max_body_mib: Annotated[float, typer.Option("--max-body-mib", min=0.0, help="Store request/response bodies up to this size, MiB (larger ones: only their sizes).")] = 16.0,
    max_in_flight: Annotated[list[str], typer.Option("--max-in-flight", help="LLM=N: at most N of the LLM's calls outstanding upstream; the others wait here, oldest workflow request first (repeat per LLM; scepsy plan prints N as entry_limit).")] = [],
    workflow_priority: Annotated[bool, typer.Option("--workflow-priority", help="Set each chat/completions call's `priority` to its workflow request's start (whole seconds since the epoch), for engines deployed by `scepsy manifests` (they serve older workflows first); a call without a workflow id counts as a workflow of its own, and a client's own priority is replaced.")] = False,
    trust_client_priority: Annotated[bool, typer.Option("--trust-client-priority", help="With --workflow-priority: keep a `priority` the client set (trusted clients only: a lower value jumps the queue).")] = False,
    workflow_done_s: Annotated[float, typer.Option("--workflow-done-s", min=0.001, help="GET /metrics counts a workflow request as finished once none of its calls has been in flight for this many seconds (scepsy_entry_request_duration_seconds).")] = 30.0,
) -> None:
    """Run the tracing proxy in front of OpenAI-compatible engines (until Ctrl-C)."""
    from scepsy import api

    with errors():
        api.proxy(upstream, host=host, port=port, store=None if no_store else store, record_bodies=not no_bodies, timeout_s=timeout_s,
                  max_body_mib=max_body_mib, workflow_priority=workflow_priority, trust_client_priority=trust_client_priority, max_in_flight=max_in_flight, workflow_done_s=workflow_done_s, on_start=_tell,
                  on_stop=lambda recorded: _tell(api.recorded_view(recorded)))


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
    from scepsy import api

    with errors():
        config = api.emulator_config(model, gpu, tp, fraction, served_model_names=served_model_name,
                                     max_model_len=max_model_len, speedup=speedup, mean_output_tokens=mean_output_tokens,
                                     prefix_caching=prefix_caching, weights=weights, engine_model=engine_model,
                                     backend=backend, database_version=database_version, personality=personality)
        api.emulate(config, host=host, port=port, on_start=_tell)


@traces_app.command("export")
def traces_export(
    traces: TracesArg,
    out: Annotated[Path, typer.Option("--out", help="Output file.")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or parquet.")] = "jsonl",
    no_bodies: Annotated[bool, typer.Option("--no-bodies", help="Leave request/response bodies out.")] = False,
) -> None:
    """Export traces as JSONL (one call per line) or Parquet."""
    from scepsy import api

    with errors():
        count = api.export_traces(traces, out, fmt, bodies=not no_bodies)
        stderr.print(f"wrote {count} calls to {out}", markup=False)


class _TraceFilesHelp(TyperCommand):
    """`scepsy aggregate`, whose help ends with the trace files scepsy.api reads; the text is fetched
    when the help is shown (importing the API takes seconds, too long for every command line)."""

    @property
    def epilog(self) -> str:
        from scepsy import api

        return (f"Accepted trace files: {api.trace_files()}. Spans of the OpenTelemetry GenAI conventions, "
                "OpenLLMetry and OpenInference are read; see docs/tracing.md.")

    @epilog.setter
    def epilog(self, value: str | None) -> None:
        pass  # click sets the epilog it was given (none)


@app.command(cls=_TraceFilesHelp)
def aggregate(
    traces: TracesArg,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the statistics as YAML (each workflow's `stages` drops into an instance).")] = None,
    workflow: Annotated[str, typer.Option("--workflow", help="Workflow name for calls that carry none (no X-Workflow-Name header; spans without a workflow name).")] = "workflow",
    llm_name: Annotated[list[str], typer.Option("--llm-name", help="Spans: map a model name (gen_ai.request.model, llm.model_name) to an LLM name, MODEL=LLM.")] = [],
    workflow_attribute: Annotated[Optional[str], typer.Option("--workflow-attribute", metavar="KEY", help="Spans: the attribute that names each request's workflow (on the span the application starts per request); tried before gen_ai.workflow.name, traceloop.workflow.name, scepsy.workflow.name, the root span's name and service.name.")] = None,
    json_output: JsonOpt = False,
) -> None:
    """Per workflow and LLM: invocations n, parallelism p, their spread and time shares."""
    from scepsy import api

    with errors():
        stats = api.aggregate_traces(traces, llm_name, workflow, out, workflow_attribute=workflow_attribute)
        for warning in stats.warnings:
            warn(warning)
        if json_output:
            emit_json(api.stats_document(stats), None, True)
        else:
            stdout.print(api.stats_view(stats))


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
    from scepsy import api

    with errors():
        found = api.topology(node_name, gpu_type, replay=replay, record=record, out=out)
        if json_output:
            emit_json(api.topology_document(found), None, True)
        else:
            sys.stdout.write(found.to_yaml())
        for warning in found.warnings:
            _tell(f"warning: {warning}")
