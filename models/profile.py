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

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from .errors import InputError

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


def _number_column(frame: pd.DataFrame, column: str, source: str) -> pd.Series:
    values = pd.to_numeric(frame[column], errors="coerce")
    bad = values.isna() | ~np.isfinite(values.to_numpy(dtype=float, na_value=np.nan))
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        raise InputError(
            source,
            f"row {row + 2}, column {column}",
            f"{frame[column].iloc[row]!r} is not a number",
            "write a finite decimal number",
        )
    if (values < 0).any():
        row = int((values < 0).to_numpy().nonzero()[0][0])
        raise InputError(
            source, f"row {row + 2}, column {column}", f"negative value {values.iloc[row]}", "use a value >= 0"
        )
    return values.astype(float)


def read_profile_frame(path: Path | str) -> pd.DataFrame:
    """Read and validate a profile CSV into a frame with the canonical columns and dtypes."""
    source = str(path)
    try:
        frame = pd.read_csv(path, skipinitialspace=True)
    except FileNotFoundError:
        raise InputError(source, None, "profile file not found", "check the llm's `profile:` path") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InputError(source, None, f"not a readable CSV ({exc})", "write a CSV with a header row") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    missing = [c for c in PROFILE_COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(
            source,
            f"column {missing[0]}",
            f"missing profile column{'s' if len(missing) > 1 else ''} {', '.join(missing)}",
            "the header must be " + ",".join(PROFILE_COLUMNS),
        )
    if frame.empty:
        raise InputError(source, None, "profile has no rows", "add at least one measured row")
    out = pd.DataFrame({"gpu_type": frame["gpu_type"].astype(str).str.strip()})
    for column in PROFILE_COLUMNS[1:]:
        out[column] = _number_column(frame, column, source)
    tp_bad = (out["tp"] < 1) | (out["tp"] != out["tp"].round())
    if tp_bad.any():
        row = int(tp_bad.to_numpy().nonzero()[0][0])
        raise InputError(source, f"row {row + 2}, column tp", "tp must be a positive integer", "use 1, 2, 4 or 8")
    frac_bad = (out["fraction"] <= 0) | (out["fraction"] > 1 + FRACTION_MATCH_TOLERANCE)
    if frac_bad.any():
        row = int(frac_bad.to_numpy().nonzero()[0][0])
        raise InputError(
            source, f"row {row + 2}, column fraction", "fraction must lie in (0, 1]", "write the GPU share per shard"
        )
    rate_bad = out["arrival_rate"] <= 0
    if rate_bad.any():
        row = int(rate_bad.to_numpy().nonzero()[0][0])
        raise InputError(
            source, f"row {row + 2}, column arrival_rate", "arrival_rate must be > 0", "drop rows at zero load"
        )
    out["tp"] = out["tp"].astype(int)
    return out


def build_profile(frame: pd.DataFrame, source: str) -> LlmProfile:
    """Keep the stable rows of each (gpu_type, tp, fraction) group; repeated rates are averaged."""
    stable = frame[frame["throughput"] >= STABLE_THROUGHPUT_RATIO * frame["arrival_rate"]]
    latency_columns = [f"latency_{m}" for m in LATENCY_METRICS]
    grouped: dict[tuple[str, int], list[ProfileCurve]] = {}
    for (gpu_type, tp, fraction), rows in stable.groupby(["gpu_type", "tp", "fraction"], sort=True):
        points = rows.groupby("arrival_rate", sort=True)[latency_columns].mean()
        curve = ProfileCurve(
            gpu_type=str(gpu_type),
            tp=int(tp),
            fraction=float(fraction),
            rates_rps=_frozen(points.index.to_numpy()),
            latencies_s={m: _frozen(points[f"latency_{m}"].to_numpy()) for m in LATENCY_METRICS},
        )
        grouped.setdefault((str(gpu_type), int(tp)), []).append(curve)
    curves = {key: tuple(sorted(value, key=lambda c: c.fraction)) for key, value in grouped.items()}
    return LlmProfile(source=source, curves=curves)


def load_profile(path: Path | str) -> LlmProfile:
    return build_profile(read_profile_frame(path), str(path))


def write_profile(rows: pd.DataFrame, path: Path | str) -> None:
    """Write profile rows in the canonical column order, sorted, with stable float formatting."""
    frame = rows.loc[:, list(PROFILE_COLUMNS)].sort_values(["gpu_type", "tp", "fraction", "arrival_rate"])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False, float_format="%.6g", lineterminator="\n")


def units_for_memory(need_gib: float, tp: int, memory_gib: float, fractions_per_gpu: int) -> int:
    """Least share units per shard s with tp * (s/F) * memory_gib >= need_gib (may exceed F)."""
    per_shard = need_gib / (tp * memory_gib) * fractions_per_gpu
    units = math.ceil(per_shard - 1e-9)
    return max(units, 1)
