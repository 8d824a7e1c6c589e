"""Import `vllm bench serve`, `vllm bench sweep` and `sglang.bench_serving` results as profile rows.

One result (a vLLM result JSON file, one run of a `vllm bench sweep serve` result directory, or one
line of an SGLang JSONL file) is one profile row for the (gpu_type, tp, fraction) the user names --
the files do not say on what hardware they ran. Field names follow vLLM's
vllm/benchmarks/serve.py (`result_json`: request_rate, max_concurrency, completed, duration,
request_throughput, total_output_tokens, mean_ttft_ms, mean_tpot_ms, and {mean,median,std,pN}_{metric}_ms
for the metrics of --percentile-metrics, default ttft,tpot,itl) and SGLang's
python/sglang/bench_serving.py (mean/median/p99_e2e_latency_ms, concurrency):

    arrival_rate   request_rate; a closed-loop run (request_rate "inf" with --max-concurrency N):
                   its request throughput, and the row is marked with concurrency = N
    throughput     request_throughput; request_inthroughput (vLLM <= 0.4); completed / duration
    latency_mean   mean_e2el_ms (vLLM >= 0.5); mean_e2e_latency_ms (SGLang); mean_request_latency;
                   the mean of `latencies` (below); else mean_ttft_ms + mean_tpot_ms *
                   (total_output_tokens / completed - 1) (estimate: a default `vllm bench serve`
                   result without the `latencies` list has no end-to-end latency)
    latency_p50    median_e2el_ms / p50_e2el_ms; median_e2e_latency_ms; median_request_latency
    latency_p90    p90_e2el_ms; p90_e2e_latency_ms; p90_request_latency
    latency_p99    p99_e2el_ms; p99_e2e_latency_ms; p99_request_latency

Percentiles may also come as `percentiles_e2el_ms: [[p, value_ms], ...]`. All latencies in these
fields are milliseconds and become seconds. A latency none of these fields holds is computed, as
vLLM computes its e2el metrics (the mean, numpy's linear percentile), from the per-request
`latencies` list (seconds) where the file has one: vLLM 0.32 saves that list with every result, so
its default result (--percentile-metrics ttft,tpot,itl) has measured end-to-end latencies too. The
list is used only where exactly `completed` of its entries are positive (a request that failed
before its response ended has 0; otherwise the failed requests cannot be told apart). A missing p90
is interpolated linearly between p50 and p99 by percentile rank; percentiles the file does not have
are left empty (the planner then refuses a latency_metric that needs them). Every computed,
estimated or missing value is listed in the result's `notes`, so the user knows which numbers were
not read from a field or not measured.

Closed-loop points approximate open-loop ones: a run that keeps N requests in flight has no
arrival process, so its throughput X is taken as the arrival rate with the latency L it measured
(Little's law: N = X L). Under Poisson arrivals at rate X, queueing makes latencies higher near
saturation, so a profile of closed-loop points is optimistic there (docs/tracing.md).

A `vllm bench sweep serve` directory (`-o DIR`: DIR/<experiment>/SERVE-...-BENCH-.../run=K.json,
summary.json per combination, summary.csv) is read through its run=K.json files; repeated runs of
one rate are averaged by the profile loader. A sweep that varies the `vllm serve` parameters (more
than one SERVE-... combination) describes several replicas and is refused unless one combination
directory is imported. Runs of different workloads (SGLang's dataset_name and random lengths) are
refused in one import: a profile is for one request mix.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
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


def _latency_list_ms(result: dict) -> list[float] | None:
    """The successful requests' end-to-end latencies in ms from the per-request `latencies` list (s),
    or None where the file has none or its positive entries are not `completed` of them (module doc)."""
    latencies, completed = result.get("latencies"), _number(result.get("completed"))
    if not isinstance(latencies, list) or not latencies or not completed:
        return None
    values = [number for number in (_number(value) for value in latencies) if number is not None]
    if len(values) != len(latencies):
        return None
    succeeded = [value * 1000.0 for value in values if value > 0]  # s -> ms
    return succeeded if len(succeeded) == completed else None


def _concurrency(result: dict) -> int | None:
    value = _number(result.get("max_concurrency"))
    return int(value) if value is not None and value >= 1 else None


def _is_inf(rate) -> bool:
    return rate in ("inf", "Infinity") or (isinstance(rate, float) and math.isinf(rate))


def result_row(result: dict, where: str, notes: list[str]) -> dict | None:
    """One profile row (without gpu_type/tp/fraction) from one result object; None to skip it
    (a peak-throughput run: request_rate inf without a concurrency limit)."""
    rate = result.get("request_rate")
    rate_value = _number(rate)
    concurrency = _concurrency(result)
    if rate_value is None and not (_is_inf(rate) and concurrency is not None):
        if _is_inf(rate):
            return None
        raise InputError(where, "request_rate", f"missing or not a number ({rate!r})", "import results of runs with a finite --request-rate or a --max-concurrency")
    if rate_value is not None and rate_value <= 0:
        raise InputError(where, "request_rate", f"request_rate {rate_value} <= 0", "import results of runs with a positive rate")
    throughput = _first(result, _THROUGHPUT)
    if throughput is None:
        completed, duration = _number(result.get("completed")), _number(result.get("duration"))
        if completed is None or not duration:
            raise InputError(where, "request_throughput", "no request_throughput, nor completed and duration", "import a complete result file")
        throughput = completed / duration
    marked = math.nan  # open loop
    if rate_value is None and concurrency is not None:
        rate_value, marked = throughput, float(concurrency)  # closed loop: what arrives is what completes (module doc)
        notes.append(f"{where}: closed-loop run at concurrency {concurrency}: arrival_rate = its throughput {throughput:.4g} req/s")
    latencies = _latencies(result, where, notes)
    _check_row(where, throughput, latencies)
    return {"arrival_rate": rate_value, "throughput": throughput, **latencies, "concurrency": marked}


def _check_row(where: str, throughput: float, latencies_s: dict[str, float]) -> None:
    """A result a benchmark cannot have produced is refused rather than planned with (percentiles
    the file lacks are NaN and not compared)."""
    if throughput < 0:
        raise InputError(where, "request_throughput", f"negative throughput {throughput:g}", "import an intact result file")
    for name, value in latencies_s.items():
        if not math.isnan(value) and value <= 0:
            raise InputError(where, name, f"latency {value * 1000:g} ms is not positive", "import an intact result file")
    ordered = [v for v in (latencies_s["latency_p50"], latencies_s["latency_p90"], latencies_s["latency_p99"]) if not math.isnan(v)]
    if ordered != sorted(ordered):
        raise InputError(where, "p50/p90/p99", "the latency percentiles are not in increasing order (p50 <= p90 <= p99)",
                         "import an intact result file")


def _latencies(result: dict, where: str, notes: list[str]) -> dict:
    p50 = _first(result, _P50) if _first(result, _P50) is not None else _percentile_list(result, 50)
    p90 = _first(result, _P90) if _first(result, _P90) is not None else _percentile_list(result, 90)
    p99 = _first(result, _P99) if _first(result, _P99) is not None else _percentile_list(result, 99)
    mean = _first(result, _MEAN)
    listed = _latency_list_ms(result) if None in (mean, p50, p90, p99) else None
    if listed is not None:
        computed = [name for name, value in (("mean", mean), ("p50", p50), ("p90", p90), ("p99", p99)) if value is None]
        mean = float(np.mean(listed)) if mean is None else mean
        p50, p90, p99 = (float(np.percentile(listed, rank)) if value is None else value
                         for rank, value in ((50, p50), (90, p90), (99, p99)))
        notes.append(f"{where}: latency {', '.join(computed)} computed from the file's {len(listed)} per-request latencies "
                     "(its latencies list)")
    if mean is None:
        ttft, tpot = _number(result.get("mean_ttft_ms")), _number(result.get("mean_tpot_ms"))
        completed, output = _number(result.get("completed")), _number(result.get("total_output_tokens"))
        if ttft is None or tpot is None or not completed or output is None:
            raise InputError(where, "mean_e2el_ms", "no end-to-end latency (mean_e2el_ms, mean_e2e_latency_ms) and no TTFT/TPOT to estimate it",
                             "import a complete result file (it needs mean_ttft_ms, mean_tpot_ms, completed and total_output_tokens)")
        mean = ttft + tpot * max(output / completed - 1, 0)
        notes.append(f"{where}: latency_mean estimated as mean TTFT + mean TPOT x (mean output tokens - 1)")
    if p90 is None and p50 is not None and p99 is not None:
        p90 = p50 + (p99 - p50) * (90 - 50) / (99 - 50)
        notes.append(f"{where}: latency_p90 interpolated between p50 and p99")
    missing = [name for name, value in (("p50", p50), ("p90", p90), ("p99", p99)) if value is None]
    if missing:
        notes.append(f"{where}: no end-to-end {', '.join(missing)} latency in the file: left empty "
                     "(rerun with --percentile-metrics e2el --metric-percentiles 50,90,99 for percentile objectives)")
    seconds = {name: (math.nan if value is None else value / 1000.0) for name, value in (("p50", p50), ("p90", p90), ("p99", p99))}
    return {"latency_mean": mean / 1000.0, "latency_p50": seconds["p50"], "latency_p90": seconds["p90"], "latency_p99": seconds["p99"]}


def _read_text(path: Path) -> str:
    """The file's text: a regular file of at most the input bound (models/inputs.py)."""
    return read_text(path, "pass a benchmark result file or a vllm bench sweep directory")


def _results_in(path: Path) -> list[tuple[str, dict]]:
    text = _read_text(path)
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


def sweep_runs(directory: Path) -> list[Path]:
    """The run=K.json files of a `vllm bench sweep serve` result directory (module doc)."""
    runs = sorted(p for p in directory.rglob("run=*.json") if not p.name.endswith(".failure.json"))
    if not runs:
        raise InputError(str(directory), None, "no run=K.json files (not a vllm bench sweep serve result directory)",
                         "pass the sweep's output directory (-o), one of its combinations, or result files")
    serve = sorted({p.parent.name.split("-BENCH-")[0] for p in runs if p.parent.name.startswith("SERVE-")})
    if len(serve) > 1:
        raise InputError(str(directory), None, f"the sweep varies the vllm serve parameters ({', '.join(serve)}): "
                         "each combination is a different replica", "import one SERVE-... combination directory at a time")
    return runs


def _workload(result: dict) -> tuple | None:
    """SGLang's description of the request mix (None when the file does not say)."""
    name = result.get("dataset_name")
    if name is None:
        return None
    if name == "random":
        return (name, result.get("random_input_len"), result.get("random_output_len"), result.get("random_range_ratio"))
    return (name,)


def _expand(paths: Iterable[Path | str]) -> list[Path]:
    files: list[Path] = []
    for path in map(Path, paths):
        files.extend(sweep_runs(path) if path.is_dir() else [path])
    return files


def import_bench_results(paths: Iterable[Path | str], gpu_type: str, tp: int, fraction: float) -> ImportResult:
    """Profile rows from benchmark result files and sweep directories, labelled with one
    (gpu_type, tp, fraction)."""
    rows: list[dict] = []
    notes: list[str] = []
    skipped: list[str] = []
    workloads: dict[tuple, str] = {}
    for path in _expand(paths):
        for where, result in _results_in(path):
            row = result_row(result, where, notes)
            if row is None:
                skipped.append(f"{where}: request_rate inf without --max-concurrency (a peak-throughput run has no arrival rate to profile)")
                continue
            workload = _workload(result)
            if workload is not None:
                workloads.setdefault(workload, where)
            rows.append({"gpu_type": gpu_type, "tp": tp, "fraction": fraction, **row})
    if len(workloads) > 1:
        first, second = list(workloads.items())[:2]
        raise InputError(second[1], "dataset_name", f"a different workload {second[0]} than {first[1]} {first[0]}",
                         "import the runs of one request mix per profile")
    if not rows:
        raise InputError(None, "files", "no importable result (every run had request_rate inf without --max-concurrency, or no file had results)",
                         "import runs made with finite --request-rate values or with --max-concurrency")
    frame = pd.DataFrame(rows, columns=[*PROFILE_COLUMNS, "concurrency"])
    return ImportResult(frame, notes, skipped)
