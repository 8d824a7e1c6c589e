"""Profiles (`scepsy profiles synthesize`, `profiles import`, `profile`): rows synthesized by the
engine model, imported from benchmark results, or measured by replaying traced calls."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

from scepsy.api.plan import PathLike
from scepsy.models.arguments import check_fraction, check_gpu_type
from scepsy.models.catalog import catalog
from scepsy.models.catalog.catalog import GpuCard, ModelCard
from scepsy.models.catalog.model_config import describe, resolve_model
from scepsy.models.errors import InputError
from scepsy.models.inputs import kind_of
from scepsy.models.instance.profile import build_profile, capacity_inversions, load_profile, read_profile_frame, write_profile
from scepsy.models.output import check_output, writing
from scepsy.models.performance.aiconfigurator import make_timer
from scepsy.models.performance.engine import IterationTimer
from scepsy.models.profiles.synthesize import RequestSource, Skipped, SynthesisSettings, load_request_source, stable_capacity_rps
from scepsy.models.profiles.synthesize import synthesize as synthesize_rows

if TYPE_CHECKING:  # the tracing extra (aiohttp, pyarrow) is imported where it is used
    import pandas as pd
    from rich.console import RenderableType

    from scepsy.tracing.profiling.replay import PointResult, SweepSettings


def _inversion_notes(out: PathLike) -> tuple[str, ...]:
    """A line per measured fraction of the profile at `out` with less capacity than a smaller share
    of the same (gpu_type, tp) (models/instance/profile.py `capacity_inversions`)."""
    return tuple(i.message() for i in capacity_inversions(load_profile(out)))


@dataclass(frozen=True)
class SynthesizedProfile:
    """A profile synthesized by the engine model (`scepsy profiles synthesize`): its rows (merged
    with those kept from an earlier file) and what they were made from."""

    frame: pd.DataFrame  # profile rows (models/instance/profile.py)
    model: ModelCard
    gpu: GpuCard
    gpu_type: str  # the label of the rows
    requests: RequestSource
    timers: Mapping[int, IterationTimer | None]  # per TP degree; None: the built-in roofline
    skipped: tuple[Skipped, ...]
    replications: int = 1  # independent draws pooled at every rate (SynthesisSettings.replications)

    def capacities_rps(self) -> dict[str, float]:
        """The largest stable arrival rate of each (tp, fraction) curve of `gpu_type`, req/s."""
        curves = self.frame.groupby(["gpu_type", "tp", "fraction"])
        return {f"tp{t}/f{fr:g}": round(stable_capacity_rps(g), 6) for (gt, t, fr), g in curves if gt == self.gpu_type}

    def capacity_inversions(self) -> list[str]:
        """A line per measured fraction of the rows with less capacity than a smaller share of the
        same (gpu_type, tp) (models/instance/profile.py `capacity_inversions`)."""
        return [i.message() for i in capacity_inversions(build_profile(self.frame, "synthesized rows"))]


def synthesis_document(result: SynthesizedProfile, out: Path | str) -> dict:
    """What `scepsy profiles synthesize --json` prints."""
    return {
        "out": str(out),
        "model": result.model.name,
        "gpu": result.gpu.name,
        "gpu_type": result.gpu_type,
        "requests": result.requests.name,
        "model_card": describe(result.model),
        "engine_model": {f"tp{t}": timer.describe() for t, timer in result.timers.items() if timer} or "builtin",
        "mean_prompt_tokens": round(result.requests.mean_prompt_tokens, 1),
        "mean_completion_tokens": round(result.requests.mean_completion_tokens, 1),
        "replications": result.replications,
        "rows": int(len(result.frame)),
        "capacity_rps": result.capacities_rps(),
        "capacity_inversions": result.capacity_inversions(),
        "skipped": [{"tp": s.tp, "fraction": s.fraction, "reason": s.reason} for s in result.skipped],
    }


def synthesize_profile(
    model: str,
    gpu: str,
    tps: Sequence[int],
    fractions: Sequence[float],
    requests: str = "azure:conv",
    *,
    llm: str | None = None,
    gpu_type: str | None = None,
    min_kv_gib: float = 0.0,
    settings: SynthesisSettings = SynthesisSettings(),
    weights: str | None = None,
    engine_model: str = "builtin",
    backend: str = "vllm",
    database_version: str = "current",
    merge_into: Path | str | None = None,
    out: Path | str | None = None,
    progress: Callable[[str], None] | None = None,
) -> SynthesizedProfile:
    """Synthesize a profile: one replica of a catalog `model` (or a config.json) on a catalog `gpu`
    under Poisson load, light to saturation, per TP degree and GPU fraction. `gpu_type` labels the
    rows (default: `gpu`); with `merge_into`, the rows of other (gpu_type, tp, fraction)
    configurations of that profile CSV are kept (`write_profile_rows`' rule); `out` writes the rows there (models/instance/profile.py `write_profile`)."""
    from scepsy.tracing.profiling.replay import merge_profile_rows

    for fraction in fractions:
        check_fraction(fraction, "fractions")
    if gpu_type is not None:
        check_gpu_type(gpu_type)
    if out is not None:
        check_output(out, [requests] if kind_of(requests) != "missing" else [])
    card, gpu_card = resolve_model(model, weights), catalog.gpu(gpu)
    source = load_request_source(requests, llm)
    label = gpu_type or gpu
    timers = {t: make_timer(engine_model, card, gpu_card, t, backend, database_version) for t in tps}
    frame, skipped = synthesize_rows(card, gpu_card, tps, fractions, source, settings, label, min_kv_gib,
                                     progress=progress, timer_for=timers.get)
    if frame.empty:
        raise InputError(None, "fractions", "no (tp, fraction) fits the model", "use larger fractions or TP degrees")
    if merge_into is not None and kind_of(merge_into) != "missing":
        frame = merge_profile_rows(read_profile_frame(merge_into), frame)
    if out is not None:
        with writing(out):
            write_profile(frame, out)
    return SynthesizedProfile(frame, card, gpu_card, label, source, timers, tuple(skipped), settings.replications)


def write_profile_rows(rows: pd.DataFrame, out: Path | str) -> None:
    """Write measured profile rows to the CSV `out`, keeping its rows of other (gpu_type, tp,
    fraction) configurations."""
    from scepsy.tracing.profiling.replay import merge_profile_rows

    existing = read_profile_frame(out) if kind_of(out) != "missing" else None
    with writing(out):
        write_profile(merge_profile_rows(existing, rows), out)


@dataclass(frozen=True)
class ImportedProfile:
    """Benchmark results imported as profile rows (`scepsy profiles import`)."""

    rows: pd.DataFrame
    notes: tuple[str, ...]  # what the import read around (missing percentiles, ...)
    skipped: tuple[str, ...]  # runs without an arrival rate
    inversions: tuple[str, ...] = ()  # of the profile written (_inversion_notes)


def import_profile(files: Iterable[PathLike], gpu_type: str, out: PathLike, tp: int = 1,
                   fraction: float = 1.0) -> ImportedProfile:
    """Import `vllm bench serve` result JSON, `vllm bench sweep` result directories and
    `sglang.bench_serving` JSONL files as profile rows of one (gpu_type, tp, fraction), merged into
    the profile CSV `out` (its rows of other configurations are kept)."""
    from scepsy.tracing.profiling.benchimport import import_bench_results

    check_fraction(fraction)
    check_gpu_type(gpu_type)
    paths = list(files)
    check_output(out, paths)
    result = import_bench_results(paths, gpu_type, tp, fraction)
    write_profile_rows(result.rows, out)
    return ImportedProfile(result.rows, tuple(result.notes), tuple(result.skipped), _inversion_notes(out))


@dataclass(frozen=True)
class ReplayProfile:
    """An LLM's traced calls replayed against an engine at a sweep of rates (`scepsy profile`)."""

    llm: str
    points: tuple[PointResult, ...]
    rows: pd.DataFrame  # the points as profile rows, of one (gpu_type, tp, fraction)
    gpu_type: str
    tp: int
    fraction: float
    inversions: tuple[str, ...] = ()  # of the profile written (_inversion_notes)

    def point_records(self) -> list[dict]:
        """One record per rate point (seconds and req/s in the names)."""
        return [{"target_rate_rps": p.target_rate_rps, "arrival_rate_rps": p.arrival_rate_rps, "throughput_rps": p.throughput_rps,
                 "calls": p.calls, "failed": p.failed, "latency_mean_s": p.latency_s["mean"], "latency_p99_s": p.latency_s["p99"],
                 "saturated": p.saturated} for p in self.points]


def replay_document(result: ReplayProfile, out: Path | str) -> dict:
    """What `scepsy profile --json` prints."""
    return {"llm": result.llm, "out": str(out), "points": result.point_records()}


def replay_view(result: ReplayProfile, out: Path | str) -> RenderableType:
    """The rate points as a readable table (rich)."""
    from rich.table import Table

    table = Table(title=f"Replay profile of {result.llm} ({result.gpu_type}, tp={result.tp}, fraction={result.fraction:g}) -> {out}")
    for column in ("arrival_rate_rps", "throughput_rps", "calls", "failed", "latency_mean_s", "latency_p99_s", "saturated"):
        table.add_column(column, justify="right")
    for p in sorted(result.point_records(), key=lambda p: p["arrival_rate_rps"]):
        table.add_row(f"{p['arrival_rate_rps']:.3f}", f"{p['throughput_rps']:.3f}", str(p["calls"]), str(p["failed"]),
                      f"{p['latency_mean_s']:.3f}", f"{p['latency_p99_s']:.3f}", "yes" if p["saturated"] else "no")
    return table


def replay_settings(rates_rps: Sequence[float] | None = None, duration_s: float = 60.0, min_requests: int = 5,
                    seed: int = 0, timeout_s: float = 600.0, model: str | None = None,
                    arrivals: str = "poisson") -> SweepSettings:
    """Settings of `replay_profile`, checked: `rates_rps` calls/s (None: auto), `duration_s` per rate
    point, `arrivals` poisson or uniform (tracing/profiling/replay.py SweepSettings)."""
    from scepsy.tracing.profiling.replay import SweepSettings

    return SweepSettings(rates_rps=None if rates_rps is None else tuple(rates_rps), duration_s=duration_s,
                         min_requests=min_requests, seed=seed, timeout_s=timeout_s, model=model, arrivals=arrivals)


def replay_profile(
    traces: Iterable[Path | str],
    llm: str,
    endpoint: str,
    gpu_type: str,
    tp: int = 1,
    fraction: float = 1.0,
    settings: SweepSettings | None = None,
    on_point: Callable[[float, int], None] | None = None,
    on_call: Callable[[], None] | None = None,
    out: PathLike | None = None,
) -> ReplayProfile:
    """Replay `llm`'s traced calls against the engine at `endpoint` at a sweep of arrival rates
    (`settings.rates_rps`, or auto: light load found by a probe, doubling to saturation, then
    bisecting); `on_point(rate, expected calls)` and `on_call()` report progress; `out` merges the
    rows into that profile CSV (its rows of other configurations are kept)."""
    from scepsy.tracing.capture.traces import load_traces
    from scepsy.tracing.profiling.replay import SweepSettings, profile_rows, replay_sweep

    check_fraction(fraction)
    check_gpu_type(gpu_type)
    paths = list(traces)
    if out is not None:
        check_output(out, paths)
    settings = settings or SweepSettings()
    points = replay_sweep(load_traces(paths), llm, endpoint, settings, on_point, on_call)
    rows = profile_rows(points, gpu_type, tp, fraction)
    if out is None:
        return ReplayProfile(llm, tuple(points), rows, gpu_type, tp, fraction)
    write_profile_rows(rows, out)
    return ReplayProfile(llm, tuple(points), rows, gpu_type, tp, fraction, _inversion_notes(out))
