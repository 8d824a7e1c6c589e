"""Measurement (`scepsy aggregate`, `traces export`, `proxy`, `emulate`, `topology`): traces read
and summarised, the tracing proxy, the engine emulator and the GPU node's topology."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from scepsy.models.arguments import check_choice, check_finite
from scepsy.models.errors import InputError
from scepsy.models.output import check_output, writing

if TYPE_CHECKING:  # the tracing extra (aiohttp, pyarrow) is imported where it is used
    from rich.console import RenderableType

    from scepsy.api.plan import PathLike  # not at run time: the planner's imports stay out of `scepsy emulate`

    from scepsy.tracing.discovery.topology import NodeTopology
    from scepsy.tracing.emulation.emulator import EmulatorConfig
    from scepsy.tracing.statistics.stats import TraceStats


def aggregate_traces(traces: Sequence[Path | str], llm_names: Mapping[str, str] | Sequence[str] | None = None,
                     workflow: str = "workflow", out: PathLike | None = None,
                     workflow_attribute: str | None = None) -> TraceStats:
    """Per workflow and LLM: n, p, their spread and time shares (`scepsy aggregate`); `workflow`
    names the calls sent without a workflow name, `llm_names` maps span models to LLM names (or
    MODEL=LLM items), `workflow_attribute` is the span attribute that names a request's workflow
    (docs/tracing.md); `out` writes the statistics as YAML (each workflow's `stages` drops into an
    instance). What the spans held is `result.spans`, their warnings `result.warnings`."""
    from scepsy.tracing.capture.traces import parse_llm_names, read_traces
    from scepsy.tracing.statistics.stats import aggregate, write_stats

    names = dict(llm_names) if isinstance(llm_names, Mapping) else parse_llm_names(llm_names or ())
    if out is not None:
        check_output(out, traces)
    found = read_traces(traces, names, workflow_attribute)
    stats = replace(aggregate(found.calls, default_workflow=workflow), spans=found.spans)
    if not stats.workflows:
        source = ", ".join(map(str, traces))
        if found.spans is not None and found.spans.llm_calls == len(found.calls):  # every call came from spans
            raise InputError(source, None, *found.spans.no_requests())
        raise InputError(source, None, "no completed call carries a workflow request id",
                         "send X-Workflow-Id (or a W3C traceparent) with every LLM call of a workflow request")
    if out is not None:
        write_stats(stats, out, traces)
    return stats


def stats_document(stats: TraceStats) -> dict:
    """What `scepsy aggregate --json` prints (and `out` holds as YAML)."""
    from scepsy.tracing.statistics.stats import stats_to_dict

    return stats_to_dict(stats)


def stats_view(stats: TraceStats) -> RenderableType:
    from scepsy.tracing.statistics.stats import stats_view as view

    return view(stats)


TRACE_FORMATS = ("jsonl", "parquet")  # what export_traces writes


def trace_files() -> str:
    """The trace files aggregate_traces reads (what `scepsy aggregate --help` lists)."""
    from scepsy.tracing.capture.traces import TRACE_FILES

    return TRACE_FILES


def export_traces(traces: Sequence[PathLike], out: PathLike, format: str = "jsonl", bodies: bool = True) -> int:
    """Write the recorded calls of `traces` to `out` as JSONL (one call a line) or Parquet; the
    number of calls written."""
    from scepsy.tracing.capture.traces import export_traces as export, load_traces

    check_choice(format, TRACE_FORMATS, "format", "format")
    check_output(out, traces)
    calls = load_traces(traces)
    with writing(out):
        return export(calls, out, format, bodies=bodies)


@dataclass(frozen=True)
class Recorded:
    """What a proxy run recorded (`scepsy proxy`, after Ctrl-C)."""

    store: Path | None  # None: the proxy ran without a store (the workflow entry)
    written: int
    write_errors: int


def recorded_view(recorded: Recorded) -> str:
    """What `scepsy proxy` says when it stops: one line."""
    if recorded.store is None:
        return "recorded nothing (no store)"
    failed = f" ({recorded.write_errors} failed to write)" if recorded.write_errors else ""
    return f"recorded {recorded.written} calls to {recorded.store}{failed}"


def proxy(
    upstreams: Mapping[str, str] | Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = 9000,
    store: PathLike | None = "traces.db",
    record_bodies: bool = True,
    timeout_s: float = 600.0,
    max_body_mib: float = 16.0,
    workflow_priority: bool = False,
    trust_client_priority: bool = False,
    max_in_flight: Sequence[str] = (),
    workflow_done_s: float = 30.0,
    on_start: Callable[[str], None] | None = None,
    on_stop: Callable[[Recorded], None] | None = None,
) -> Recorded:
    """Run the tracing proxy in front of OpenAI-compatible engines until interrupted, recording
    every call to the SQLite `store` (None: recording nothing, as the workflow entry runs). `upstreams`: LLM name -> engine base URL (or NAME=URL items);
    `workflow_priority` tags every chat/completions call with its workflow request's start, for
    engines that schedule by priority, replacing a client's own unless `trust_client_priority`; `max_in_flight` (LLM=N items) holds an LLM's calls beyond N
    at the proxy, oldest workflow request first (tracing/capture/proxy.py); `workflow_done_s`: a
workflow request none of whose calls is in flight for this long counts as finished in `/metrics`
(tracing/capture/entry_metrics.py); `on_start(text)` says
    where it listens, `on_stop` what it recorded (also when serving fails)."""
    from scepsy.tracing.capture.proxy import ProxyConfig, parse_in_flight, parse_upstreams, serve
    from scepsy.tracing.capture.store import TraceStore

    check_finite(timeout_s, "timeout_s")
    check_finite(max_body_mib, "max_body_mib")
    check_finite(workflow_done_s, "workflow_done_s")
    if workflow_done_s <= 0:
        raise InputError(None, "workflow_done_s", f"{workflow_done_s!r} is not a positive number of seconds", "give e.g. 30",
                         argument=True)
    routes_of = dict(upstreams) if isinstance(upstreams, Mapping) else parse_upstreams(upstreams)
    limits = parse_in_flight(max_in_flight, routes_of)
    trace_store = None
    if store is not None:
        try:
            trace_store = TraceStore(store)
        except Exception as exc:  # noqa: BLE001 - sqlite errors become one line
            raise InputError(str(store), "store", f"cannot open the trace store ({exc})", "choose a writable `store` path",
                             argument=True) from None
    routes = ", ".join(f"{name}={url} (/{name}/v1/...)" for name, url in sorted(routes_of.items()))
    if on_start is not None:
        on_start(f"scepsy proxy on http://{host}:{port}: {routes}; " + (f"recording to {store}" if store is not None else "recording nothing"))
    try:
        config = ProxyConfig(routes_of, store=trace_store, record_bodies=record_bodies, timeout_s=timeout_s,
                             max_body_bytes=int(max_body_mib * 2**20), workflow_priority=workflow_priority,
                             trust_client_priority=trust_client_priority, max_in_flight=limits, workflow_done_s=workflow_done_s)
        serve(config, host=host, port=port)
    finally:
        recorded = Recorded(None, 0, 0)
        if trace_store is not None:
            trace_store.close()
            recorded = Recorded(Path(store), trace_store.written, trace_store.write_errors) if store is not None else recorded
        if on_stop is not None:
            on_stop(recorded)
    return recorded




def emulator_config(model: str, gpu: str, tp: int = 1, fraction: float = 1.0, **options: Any) -> EmulatorConfig:
    """An emulated replica of a catalog `model` (or a config.json) on a catalog `gpu`, checked to run
    (tracing/emulation/emulator.py `emulator_config`: served_model_names, max_model_len, speedup,
    mean_output_tokens, prefix_caching, weights, engine_model, backend, database_version,
    personality)."""
    from scepsy.tracing.emulation.emulator import emulator_config as configure

    return configure(model, gpu, tp, fraction, **options)


def emulate(config: EmulatorConfig, *, host: str = "127.0.0.1", port: int = 8000,
            on_start: Callable[[str], None] | None = None) -> None:
    """Serve an OpenAI-compatible engine emulator whose timing follows the engine model, until
    interrupted (`scepsy emulate`); `on_start(text)` describes it."""
    from scepsy.tracing.emulation.emulator import serve

    if on_start is not None:
        on_start(f"scepsy emulate on http://{host}:{port}: {config.describe()}")
    serve(config, host=host, port=port)


def topology_document(found: NodeTopology) -> dict:
    """What `scepsy topology --json` prints."""
    return found.to_json()


def topology(node_name: str | None = None, gpu_type: str | None = None, *, replay: PathLike | None = None,
             record: PathLike | None = None, out: PathLike | None = None) -> NodeTopology:
    """This GPU node's GPUs, memory, UUIDs and NVLink domains from NVML (`scepsy topology`), or
    from NVML answers saved with `record` (`replay`); `out` writes the node's cluster-file entry."""
    import json

    from scepsy.models.output import write_text
    from scepsy.tracing.discovery.topology import RecordedNvml, discover, real_nvml
    from scepsy.tracing.discovery.topology import record as record_answers

    for path, field in ((out, "out"), (record, "record")):
        if path is not None:
            check_output(path, [replay], field)
    nvml = RecordedNvml.from_file(replay) if replay is not None else real_nvml()
    found = discover(nvml, node_name, gpu_type)
    if record is not None:
        write_text(record, json.dumps(record_answers(nvml), indent=2) + "\n", "record")
    if out is not None:
        write_text(out, found.to_yaml())
    return found
