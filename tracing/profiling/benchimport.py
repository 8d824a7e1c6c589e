"""Import `vllm bench serve` and `sglang.bench_serving` results as profile rows.

One result (a vLLM result JSON file, or one line of an SGLang JSONL file) is one profile row for the
(gpu_type, tp, fraction) the user names -- the files do not say on what hardware they ran.

Fields read, in order of preference (names differ across versions):

    arrival_rate   request_rate (a number; runs at "inf" measure only peak throughput and are skipped)
    throughput     request_throughput; request_inthroughput (vLLM <= 0.4); completed / duration
    latency_mean   mean_e2el_ms (vLLM >= 0.5); mean_e2e_latency_ms (SGLang); mean_request_latency;
                   else mean_ttft_ms + mean_tpot_ms * (total_output_tokens / completed - 1) (estimate)
    latency_p50    median_e2el_ms / p50_e2el_ms; median_e2e_latency_ms; median_request_latency
    latency_p90    p90_e2el_ms; p90_e2e_latency_ms; p90_request_latency
    latency_p99    p99_e2el_ms; p99_e2e_latency_ms; p99_request_latency

Percentiles may also come as `percentiles_e2el_ms: [[p, value_ms], ...]`. All latencies in these
files are milliseconds and become seconds. A missing p90 is interpolated linearly between p50 and
p99 by percentile rank, and a missing mean estimated as above; every estimated value is listed in the
result's `notes`, so the user knows which numbers were not measured.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import pandas as pd

from scepsy.models.errors import InputError
from scepsy.models.inputs import read_text
from scepsy.models.instance.profile import PROFILE_COLUMNS

_MEAN = ("mean_e2el_ms", "mean_e2e_latency_ms", "mean_request_latency")
_P50 = ("median_e2el_ms", "p50_e2el_ms", "median_e2e_latency_ms", "p50_e2e_latency_ms", "median_request_latency")
_P90 = ("p90_e2el_ms", "p90_e2e_latency_ms", "p90_request_latency")
_P99 = ("p99_e2el_ms", "p99_e2e_latency_ms", "p99_request_latency")
_THROUGHPUT = ("request_throughput", "request_inthroughput")


@dataclass
class ImportResult:
    rows: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _number(value) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _first(result: dict, keys: Iterable[str]) -> float | None:
    for key in keys:
        value = _number(result.get(key))
        if value is not None:
            return value
    return None


def _percentile_list(result: dict, rank: float) -> float | None:
    pairs = result.get("percentiles_e2el_ms")
    if isinstance(pairs, list):
        for pair in pairs:
            if isinstance(pair, (list, tuple)) and len(pair) == 2 and _number(pair[0]) == rank:
                return _number(pair[1])
    return None


def _check_row(where: str, throughput: float, latencies_ms: dict[str, float]) -> None:
    """A result a benchmark cannot have produced is refused rather than planned with."""
    if throughput < 0:
        raise InputError(where, "request_throughput", f"negative throughput {throughput:g}", "import an intact result file")
    for name, value in latencies_ms.items():
        if value <= 0:
            raise InputError(where, f"latency {name}", f"latency {value:g} ms is not positive", "import an intact result file")
    ordered = [latencies_ms[k] for k in ("p50", "p90", "p99")]
    if ordered != sorted(ordered):
        raise InputError(where, "p50/p90/p99", "the latency percentiles are not in increasing order (p50 <= p90 <= p99)",
                         "import an intact result file")


def result_row(result: dict, where: str, notes: list[str]) -> dict | None:
    """One profile row (without gpu_type/tp/fraction) from one result object; None to skip it."""
    rate = result.get("request_rate")
    rate_value = _number(rate)
    if rate_value is None:
        if rate in ("inf", "Infinity") or (isinstance(rate, float) and math.isinf(rate)):
            return None
        raise InputError(where, "request_rate", f"missing or not a number ({rate!r})", "import results of runs with a finite --request-rate")
    if rate_value <= 0:
        raise InputError(where, "request_rate", f"request_rate {rate_value} <= 0", "import results of runs with a positive rate")
    throughput = _first(result, _THROUGHPUT)
    if throughput is None:
        completed, duration = _number(result.get("completed")), _number(result.get("duration"))
        if completed is None or not duration:
            raise InputError(where, "request_throughput", "no request_throughput, nor completed and duration", "import a complete result file")
        throughput = completed / duration
    p50 = _first(result, _P50) if _first(result, _P50) is not None else _percentile_list(result, 50)
    p90 = _first(result, _P90) if _first(result, _P90) is not None else _percentile_list(result, 90)
    p99 = _first(result, _P99) if _first(result, _P99) is not None else _percentile_list(result, 99)
    mean = _first(result, _MEAN)
    if mean is None:
        ttft, tpot = _number(result.get("mean_ttft_ms")), _number(result.get("mean_tpot_ms"))
        completed, output = _number(result.get("completed")), _number(result.get("total_output_tokens"))
        if ttft is None or tpot is None or not completed or output is None:
            raise InputError(where, "mean_e2el_ms", "no end-to-end latency (mean_e2el_ms, mean_e2e_latency_ms) and no TTFT/TPOT to estimate it",
                             "rerun the benchmark with a version that reports end-to-end latency")
        mean = ttft + tpot * max(output / completed - 1, 0)
        notes.append(f"{where}: latency_mean estimated as mean TTFT + mean TPOT x (mean output tokens - 1)")
    if p50 is None:
        raise InputError(where, "median_e2el_ms", "no median end-to-end latency", "rerun with --percentile-metrics e2el --metric-percentiles 50,90,99")
    if p99 is None:
        raise InputError(where, "p99_e2el_ms", "no p99 end-to-end latency", "rerun with --percentile-metrics e2el --metric-percentiles 50,90,99")
    if p90 is None:
        p90 = p50 + (p99 - p50) * (90 - 50) / (99 - 50)
        notes.append(f"{where}: latency_p90 interpolated between p50 and p99")
    _check_row(where, throughput, {"mean": mean, "p50": p50, "p90": p90, "p99": p99})
    return {
        "arrival_rate": rate_value,
        "throughput": throughput,
        "latency_mean": mean / 1000.0,
        "latency_p50": p50 / 1000.0,
        "latency_p90": p90 / 1000.0,
        "latency_p99": p99 / 1000.0,
    }


def _results_in(path: Path) -> list[tuple[str, dict]]:
    text = read_text(path, "pass a benchmark result file")
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, dict):
        return [(str(path), whole)]
    if isinstance(whole, list):
        return [(f"{path}[{i}]", item) for i, item in enumerate(whole) if isinstance(item, dict)]
    results = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise InputError(str(path), f"line {number}", "not JSON", "pass vLLM result JSON files or SGLang JSONL files") from None
        if isinstance(item, dict):
            results.append((f"{path}:{number}", item))
    return results


def import_bench_results(paths: Iterable[Path | str], gpu_type: str, tp: int, fraction: float) -> ImportResult:
    """Profile rows from benchmark result files, labelled with one (gpu_type, tp, fraction)."""
    rows: list[dict] = []
    notes: list[str] = []
    skipped: list[str] = []
    for path in map(Path, paths):
        for where, result in _results_in(path):
            row = result_row(result, where, notes)
            if row is None:
                skipped.append(f"{where}: request_rate inf (a peak-throughput run has no arrival rate to profile)")
                continue
            rows.append({"gpu_type": gpu_type, "tp": tp, "fraction": fraction, **row})
    if not rows:
        raise InputError(None, "FILES", "no importable result (every run had request_rate inf, or no file had results)",
                         "import runs made with finite --request-rate values")
    frame = pd.DataFrame(rows, columns=list(PROFILE_COLUMNS))
    return ImportResult(frame, notes, skipped)
