"""Per-replica latency/throughput profiles and their semantics (docs/model.md, "Profiles").

A profile CSV has one row per measured (gpu_type, tp, fraction, arrival_rate) point of ONE replica:

    gpu_type,tp,fraction,arrival_rate,throughput,latency_mean,latency_p50,latency_p90,latency_p99

Rates are requests/s, latencies seconds. A row is *stable* when throughput >= 0.95 * arrival_rate.
The capacity T of a (gpu_type, tp, fraction) curve is its largest stable arrival rate; the latency
curve is the stable rows sorted by rate, piecewise linear, clamped to the first point below it.
A fraction without its own rows borrows the curve of the nearest profiled fraction f0 (the smallest
one >= f, else the largest) with its rate axis scaled by kappa = min(f/f0, kv(f)/kv(f0)),
kv(x) = tp * x * memory_gib - weights_gib.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from scepsy.models.errors import InputError
from scepsy.models.inputs import read_text

PROFILE_COLUMNS = (
    "gpu_type",
    "tp",
    "fraction",
    "arrival_rate",
    "throughput",
    "latency_mean",
    "latency_p50",
    "latency_p90",
    "latency_p99",
)
LATENCY_METRICS = ("mean", "p50", "p90", "p99")
STABLE_THROUGHPUT_RATIO = 0.95
FRACTION_MATCH_TOLERANCE = 1e-6


def _frozen(values: np.ndarray) -> np.ndarray:
    values = np.ascontiguousarray(values, dtype=float)
    values.setflags(write=False)
    return values


@dataclass(frozen=True, eq=False)
class ProfileCurve:
    """The stable part of one measured (gpu_type, tp, fraction) curve of one replica."""

    gpu_type: str
    tp: int
    fraction: float
    rates_rps: np.ndarray
    latencies_s: Mapping[str, np.ndarray]

    @property
    def capacity_rps(self) -> float:
        return float(self.rates_rps[-1])

    def latency_s(self, rate_rps, metric: str = "mean"):
        """Latency at `rate_rps` (scalar or array): linear between points, clamped below the first."""
        return np.interp(rate_rps, self.rates_rps, self.latencies_s[metric])


@dataclass(frozen=True, eq=False)
class ScaledCurve:
    """A measured curve, possibly borrowed from another fraction with its rate axis scaled by kappa."""

    base: ProfileCurve
    fraction: float
    kappa: float

    @property
    def capacity_rps(self) -> float:
        return self.kappa * self.base.capacity_rps

    @property
    def measured(self) -> bool:
        return self.kappa == 1.0 and abs(self.fraction - self.base.fraction) <= FRACTION_MATCH_TOLERANCE

    def latency_s(self, rate_rps, metric: str = "mean"):
        return self.base.latency_s(np.asarray(rate_rps, dtype=float) / self.kappa, metric)


@dataclass(frozen=True, eq=False)
class LlmProfile:
    """All measured curves of one LLM, keyed by (gpu_type, tp) and sorted by fraction."""

    source: str
    curves: Mapping[tuple[str, int], tuple[ProfileCurve, ...]]

    def configurations(self) -> list[tuple[str, int]]:
        return sorted(self.curves)

    def has(self, gpu_type: str, tp: int) -> bool:
        return (gpu_type, tp) in self.curves

    def curve(
        self, gpu_type: str, tp: int, fraction: float, memory_gib: float, weights_gib: float
    ) -> ScaledCurve | None:
        """The curve of one replica with `tp` shards of `fraction` GPU each; None if not profiled."""
        measured = self.curves.get((gpu_type, tp))
        if not measured:
            return None
        for curve in measured:
            if abs(curve.fraction - fraction) <= FRACTION_MATCH_TOLERANCE:
                return ScaledCurve(curve, fraction, 1.0)
        larger = [c for c in measured if c.fraction >= fraction]
        base = larger[0] if larger else measured[-1]
        kv_base = tp * base.fraction * memory_gib - weights_gib
        kv_here = tp * fraction * memory_gib - weights_gib
        if kv_base <= 0 or kv_here <= 0:
            return None
        kappa = min(fraction / base.fraction, kv_here / kv_base)
        return ScaledCurve(base, fraction, kappa)


def _bad_row(source: str, column: str, row: int, problem: str, fix: str) -> InputError:
    return InputError(source, f"row {row + 2}, column {column}", problem, fix)


def _number_column(raw: list[str], column: str, source: str) -> np.ndarray:
    values = np.empty(len(raw))
    for row, text in enumerate(raw):
        try:
            values[row] = float(text)
        except ValueError:
            raise _bad_row(source, column, row, f"{text!r} is not a number", "write a finite decimal number") from None
        if not math.isfinite(values[row]):
            raise _bad_row(source, column, row, f"{text!r} is not a number", "write a finite decimal number")
        if values[row] < 0:
            raise _bad_row(source, column, row, f"negative value {values[row]:g}", "use a value >= 0")
    return values


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def read_profile_table(path: Path | str) -> dict[str, np.ndarray]:
    """Read and validate a profile CSV into canonical columns (numpy arrays; `gpu_type` as str).

    Plain `csv` + numpy: loading instances stays fast (no pandas import on the planning path)."""
    source = str(path)
    text = read_text(path, "check the llm's `profile:` path")
    try:
        rows = [row for row in csv.reader(io.StringIO(text), skipinitialspace=True) if any(cell.strip() for cell in row)]
    except csv.Error as exc:
        raise InputError(source, None, f"not a readable CSV ({exc})", "write a CSV with a header row") from None
    if not rows:
        raise InputError(source, None, "not a readable CSV (empty file)", "write a CSV with a header row")
    header = [cell.strip() for cell in rows[0]]
    missing = [c for c in PROFILE_COLUMNS if c not in header]
    if missing:
        raise InputError(
            source,
            f"column {missing[0]}",
            f"missing profile column{'s' if len(missing) > 1 else ''} {', '.join(missing)}",
            "the header must be " + ",".join(PROFILE_COLUMNS),
        )
    body = rows[1:]
    if not body:
        raise InputError(source, None, "profile has no rows", "add at least one measured row")
    for number, cells in enumerate(body):
        if len(cells) != len(header):
            raise InputError(source, f"row {number + 2}", f"{len(cells)} cells for {len(header)} columns", "write one cell per column")
    index = {name: header.index(name) for name in PROFILE_COLUMNS}
    table: dict[str, np.ndarray] = {"gpu_type": np.array([cells[index["gpu_type"]].strip() for cells in body])}
    for column in PROFILE_COLUMNS[1:]:
        table[column] = _number_column([cells[index[column]].strip() for cells in body], column, source)
    row = _first((table["tp"] < 1) | (table["tp"] != np.round(table["tp"])))
    if row is not None:
        raise _bad_row(source, "tp", row, "tp must be a positive integer", "use 1, 2, 4 or 8")
    row = _first((table["fraction"] <= 0) | (table["fraction"] > 1 + FRACTION_MATCH_TOLERANCE))
    if row is not None:
        raise _bad_row(source, "fraction", row, "fraction must lie in (0, 1]", "write the GPU share per shard")
    row = _first(table["arrival_rate"] <= 0)
    if row is not None:
        raise _bad_row(source, "arrival_rate", row, "arrival_rate must be > 0", "drop rows at zero load")
    table["tp"] = table["tp"].astype(int)
    return table


def read_profile_frame(path: Path | str):
    """`read_profile_table` as a pandas DataFrame (for analysis code; pandas is imported here)."""
    import pandas as pd

    return pd.DataFrame(read_profile_table(path))


def build_profile(table, source: str) -> LlmProfile:
    """Keep the stable rows of each (gpu_type, tp, fraction) group; repeated rates are averaged.

    `table` maps the profile columns to sequences (a dict of arrays or a pandas DataFrame)."""
    columns = {c: np.asarray(table[c]) for c in PROFILE_COLUMNS}
    rate = columns["arrival_rate"].astype(float)
    stable = columns["throughput"].astype(float) >= STABLE_THROUGHPUT_RATIO * rate
    points: dict[tuple[str, int, float], dict[float, list[np.ndarray]]] = {}
    for row in np.flatnonzero(stable):
        key = (str(columns["gpu_type"][row]), int(columns["tp"][row]), float(columns["fraction"][row]))
        latencies = np.array([float(columns[f"latency_{m}"][row]) for m in LATENCY_METRICS])
        points.setdefault(key, {}).setdefault(float(rate[row]), []).append(latencies)
    grouped: dict[tuple[str, int], list[ProfileCurve]] = {}
    for (gpu_type, tp, fraction), by_rate in sorted(points.items()):
        rates = sorted(by_rate)
        means = np.array([np.mean(by_rate[r], axis=0) for r in rates])
        curve = ProfileCurve(
            gpu_type=gpu_type,
            tp=tp,
            fraction=fraction,
            rates_rps=_frozen(np.array(rates)),
            latencies_s={m: _frozen(means[:, k]) for k, m in enumerate(LATENCY_METRICS)},
        )
        grouped.setdefault((gpu_type, tp), []).append(curve)
    curves = {key: tuple(sorted(value, key=lambda c: c.fraction)) for key, value in grouped.items()}
    return LlmProfile(source=source, curves=curves)


def load_profile(path: Path | str) -> LlmProfile:
    return build_profile(read_profile_table(path), str(path))


def write_profile(rows, path: Path | str) -> None:
    """Write profile rows (a pandas DataFrame) in the canonical column order, sorted, with stable
    float formatting."""
    frame = rows.loc[:, list(PROFILE_COLUMNS)].sort_values(["gpu_type", "tp", "fraction", "arrival_rate"])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False, float_format="%.6g", lineterminator="\n")


def units_for_memory(need_gib: float, tp: int, memory_gib: float, fractions_per_gpu: int) -> int:
    """Least share units per shard s with tp * (s/F) * memory_gib >= need_gib (may exceed F)."""
    per_shard = need_gib / (tp * memory_gib) * fractions_per_gpu
    units = math.ceil(per_shard - 1e-9)
    return max(units, 1)
