"""Profiles: `scepsy profiles synthesize`, `profiles import` and `profile` (replay against an engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from scepsy.cli.app import app, profiles_app
from scepsy.cli.common import (
    DatabaseVersionOpt,
    EngineBackendOpt,
    EngineModelOpt,
    FractionOpt,
    GpuTypeOpt,
    JsonOpt,
    SeedOpt,
    TpOpt,
    WeightsOpt,
    emit_json,
    errors,
    number_list,
    progress,
    stderr,
    stdout,
    tp_list,
)


@profiles_app.command("synthesize")
def profiles_synthesize(
    model: Annotated[str, typer.Option("--model", help="Catalog model (short name or Hugging Face id, see models/catalog/catalog.py), or a local config.json or model directory.")],
    gpu: Annotated[str, typer.Option("--gpu", help="Catalog GPU (A6000, A100-80G, H100, H200, B200, L40S, L4, ...); also the profile's gpu_type unless --gpu-type-name.")],
    out: Annotated[Path, typer.Option("--out", help="Profile CSV to write.")],
    tp: Annotated[str, typer.Option("--tp", help="Tensor-parallel degrees, comma-separated.")] = "1",
    fractions: Annotated[str, typer.Option("--fractions", help="GPU fractions per shard, comma-separated.")] = "0.2,0.5,1.0",
    requests: Annotated[str, typer.Option("--requests", help="Request lengths: fixed:P,C | azure:conv | azure:code | trace.csv | calls.jsonl.")] = "azure:conv",
    llm: Annotated[Optional[str], typer.Option("--llm", help="With a calls JSONL: use only this LLM's calls.")] = None,
    gpu_type_name: Annotated[Optional[str], typer.Option("--gpu-type-name", help="gpu_type label in the CSV (default: --gpu as given).")] = None,
    min_kv_gib: Annotated[float, typer.Option("--min-kv-gib", min=0.0, help="Skip fractions whose KV cache is smaller.")] = 0.0,
    requests_per_point: Annotated[Optional[int], typer.Option("--requests-per-point", min=50, help="Simulated requests per rate point (default: 400, more for prefill-only calls whose completions come in batches).")] = None,
    replications: Annotated[int, typer.Option("--replications", min=1, max=16, help="Independent draws of requests and arrival gaps measured at every rate and pooled (latency noise falls about as 1/sqrt(R); the time grows R-fold).")] = 1,
    confirm_window_s: Annotated[float, typer.Option("--confirm-window-s", min=0.0, help="Confirm each curve's capacity over long windows: the largest rate at which three draws of this many seconds (at least 4,000 and at most 250,000 calls) each complete 99% of their arrivals, and the rows from half that capacity up to it measured again in steady state, over three draws of 50 times their calls in flight (docs/model.md, Capacity that holds; 200 for plans whose capacity must hold; 0: the short rows alone). Costs 2 to 80 times the sweep's time.")] = 0.0,
    merge: Annotated[bool, typer.Option("--merge", help="Keep the rows of other (gpu_type, tp, fraction) configurations already in --out.")] = False,
    weights: WeightsOpt = None,
    engine_model: EngineModelOpt = "builtin",
    backend: EngineBackendOpt = "vllm",
    database_version: DatabaseVersionOpt = "current",
    seed: SeedOpt = 0,
    json_output: JsonOpt = False,
) -> None:
    """Synthesize a profile: simulate one replica under Poisson load from light load to saturation."""
    from scepsy import api

    with errors():
        tps = tp_list(tp)
        fracs = number_list(fractions, "fractions", "0.2,0.5,1.0")
        settings = api.SynthesisSettings(requests_per_point=requests_per_point, seed=seed, replications=replications,
                                         confirm_window_s=confirm_window_s)
        with progress(f"synthesizing {model} on {gpu_type_name or gpu}", len(tps) * len(fracs)) as advance:
            result = api.synthesize_profile(
                model, gpu, tps, fracs, requests, llm=llm, gpu_type=gpu_type_name, min_kv_gib=min_kv_gib, settings=settings,
                weights=weights, engine_model=engine_model, backend=backend, database_version=database_version,
                merge_into=out if merge else None, out=out, progress=lambda text: advance(None, text),
            )
        summary = api.synthesis_document(result, out)
        for message in [] if json_output else summary["capacity_inversions"]:
            stderr.print(f"note: {out}: {message}", markup=False, highlight=False)
        emit_json(summary, None, json_output)
        if not json_output:
            stdout.print(f"wrote {out}: {summary['rows']} rows ({summary['model']} on {summary['gpu_type']}, requests {summary['requests']})")
            for timer in (t for t in result.timers.values() if t):
                stdout.print(f"  engine model: {timer.describe()}", markup=False, highlight=False)
            for key, capacity in summary["capacity_rps"].items():
                stdout.print(f"  {key}: capacity_rps {capacity:.4g}")
            for s in result.skipped:
                stdout.print(f"  skipped tp{s.tp}/f{s.fraction:g}: {s.reason}")


def _notes(out: Path, inversions: tuple[str, ...]) -> None:
    """One stderr note per capacity inversion of the profile written to `out`."""
    for message in inversions:
        stderr.print(f"note: {out}: {message}", markup=False, highlight=False)


@app.command()
def profile(
    traces: Annotated[list[Path], typer.Option("--traces", help="Trace files with request bodies (repeat for several).")],
    llm: Annotated[str, typer.Option("--llm", help="The LLM whose calls are replayed.")],
    endpoint: Annotated[str, typer.Option("--endpoint", help="Base URL of the engine to profile, e.g. http://127.0.0.1:8001.")],
    gpu_type: GpuTypeOpt,
    out: Annotated[Path, typer.Option("--out", help="Profile CSV; rows of other (gpu_type, tp, fraction) already in it are kept.")],
    tp: TpOpt = 1,
    fraction: FractionOpt = 1.0,
    rates: Annotated[str, typer.Option("--rates", help="auto (light load, doubling to saturation, then bisecting) or a list of calls/s, e.g. 0.5,1,2.")] = "auto",
    duration_s: Annotated[float, typer.Option("--duration-s", min=0.1, help="Nominal length of each rate point.")] = 60.0,
    min_requests: Annotated[int, typer.Option("--min-requests", min=1, help="At least this many workflow requests per rate point.")] = 5,
    model: Annotated[Optional[str], typer.Option("--model", help="Replace the `model` field of replayed requests (the engine's served name).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the arrival process and request order.")] = 0,
    arrivals: Annotated[str, typer.Option("--arrivals", help="Workflow request arrivals: poisson, or uniform (1 / rate apart).")] = "poisson",
    timeout_s: Annotated[float, typer.Option("--timeout-s", min=0.1, help="Per-call timeout.")] = 600.0,
    json_output: JsonOpt = False,
) -> None:
    """Replay an LLM's traced calls at a sweep of arrival rates and write its profile rows."""
    from scepsy import api

    with errors():
        fixed = None if rates.strip() == "auto" else tuple(number_list(rates, "rates", "auto or 0.5,1,2,4"))
        settings = api.replay_settings(rates_rps=fixed, duration_s=duration_s, min_requests=min_requests,
                                       seed=seed, timeout_s=timeout_s, model=model, arrivals=arrivals)
        with progress(f"replaying {llm}", 1) as advance:

            def on_point(rate: float, expected: int) -> None:
                advance(0, f"{rate:.3g} calls/s", total=expected)

            result = api.replay_profile(traces, llm, endpoint, gpu_type, tp, fraction, settings, on_point, advance, out=out)
        _notes(out, result.inversions)
        if json_output:
            emit_json(api.replay_document(result, out), None, True)
        else:
            stdout.print(api.replay_view(result, out))


@profiles_app.command("import")
def profiles_import(
    files: Annotated[list[Path], typer.Argument(help="vllm bench serve result JSON files, vllm bench sweep serve result directories and/or sglang.bench_serving JSONL files.", show_default=False)],
    gpu_type: GpuTypeOpt,
    out: Annotated[Path, typer.Option("--out", help="Profile CSV; rows of other (gpu_type, tp, fraction) already in it are kept.")],
    tp: TpOpt = 1,
    fraction: FractionOpt = 1.0,
) -> None:
    """Import benchmark results (one row per run; --max-concurrency runs as closed-loop points) into the profile CSV format."""
    from scepsy import api

    with errors():
        result = api.import_profile(files, gpu_type, out, tp, fraction)
        _notes(out, result.inversions)
        for line in result.notes + tuple(f"skipped {s}" for s in result.skipped):
            stderr.print(f"note: {line}", markup=False, highlight=False)
        stderr.print(f"wrote {len(result.rows)} rows for {gpu_type} tp={tp} fraction={fraction:g} to {out}", markup=False)
