"""Per-replica latency/throughput profiles and their semantics (docs/model.md, "Profiles").

A profile CSV has one row per measured (gpu_type, tp, fraction, arrival_rate) point of ONE replica:

    gpu_type,tp,fraction,arrival_rate,throughput,latency_mean,latency_p50,latency_p90,latency_p99

Rates are requests/s, latencies seconds. A row is *stable* when throughput >= 0.95 * arrival_rate.
The percentile cells (latency_p50, latency_p90, latency_p99) may be empty: a benchmark that did not
measure them (`vllm bench serve` without `--percentile-metrics e2el`); an instance whose
latency_metric needs a missing percentile is refused when it is loaded. An optional `concurrency`
column marks closed-loop points (a benchmark run at a fixed number of requests in flight, see
tracing/profiling/benchimport.py).
The capacity T of a (gpu_type, tp, fraction) curve is its largest stable arrival rate; the latency
curve is the stable rows sorted by rate, piecewise linear, clamped to the first point below it.
A fraction without its own rows gets a curve derived from the measured fractions around it with
the engine model's shape (`derive_curve`): with the model and GPU in the catalogue, the neighbours'
curves scaled by the engine model's capacity and light-load latency ratios between the shares
(models/performance/fraction_shape.py: request shape fitted to the measured fractions, KV-cache
batch limit, prefix-cache misses); otherwise capacity linear in the share between them (outside
them, a power law through the two nearest, bounded by the KV cache ratio kv(f)/kv(f0),
kv(x) = tp * x * memory_gib - weights_gib), latency at each utilisation linear in 1/share. Never
faster than the next larger measured share (docs/model.md, "Profiles").
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
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
OPTIONAL_NUMBER_COLUMNS = ("latency_p50", "latency_p90", "latency_p99")  # empty cell: not measured
OPTIONAL_COLUMNS = ("concurrency",)  # closed-loop points: requests kept in flight (empty: open loop)
STABLE_THROUGHPUT_RATIO = 0.95
FRACTION_MATCH_TOLERANCE = 1e-6


def _frozen(values: np.ndarray) -> np.ndarray:
    values = np.ascontiguousarray(values, dtype=float)
    values.setflags(write=False)
    return values


@dataclass(frozen=True, eq=False)
class ProfileCurve:
    """The stable part of one (gpu_type, tp, fraction) curve of one replica: measured, or derived
    from the measured curves of neighbouring fractions (`derived_from` names them)."""

    gpu_type: str
    tp: int
    fraction: float
    rates_rps: np.ndarray
    latencies_s: Mapping[str, np.ndarray]
    derived_from: tuple[float, ...] = ()

    @property
    def capacity_rps(self) -> float:
        return float(self.rates_rps[-1])

    @property
    def measured(self) -> bool:
        return not self.derived_from

    def latency_s(self, rate_rps, metric: str = "mean"):
        """Latency at `rate_rps` (scalar or array): linear between points, clamped below the first."""
        return np.interp(rate_rps, self.rates_rps, self.latencies_s[metric])


@dataclass(frozen=True, eq=False)
class LlmProfile:
    """All measured curves of one LLM, keyed by (gpu_type, tp) and sorted by fraction."""

    source: str
    curves: Mapping[tuple[str, int], tuple[ProfileCurve, ...]]
    _derived: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # curve() cache

    def missing_metrics(self) -> list[str]:
        """Latency metrics some stable row lacks (an empty percentile cell)."""
        return [m for m in LATENCY_METRICS
                if any(np.isnan(c.latencies_s[m]).any() for group in self.curves.values() for c in group)]

    def configurations(self) -> list[tuple[str, int]]:
        return sorted(self.curves)

    def has(self, gpu_type: str, tp: int) -> bool:
        return (gpu_type, tp) in self.curves

    def measures(self, gpu_type: str, tp: int, fraction: float) -> bool:
        """Whether `fraction` of (gpu_type, tp) has its own measured curve."""
        return any(abs(c.fraction - fraction) <= FRACTION_MATCH_TOLERANCE for c in self.curves.get((gpu_type, tp), ()))

    def curve(
        self, gpu_type: str, tp: int, fraction: float, memory_gib: float, weights_gib: float, shape=None
    ) -> ProfileCurve | None:
        """The curve of one replica with `tp` shards of `fraction` GPU each; None if not profiled
        (or if the fraction leaves no KV cache). Unprofiled fractions: `derive_curve` (with the
        engine model's `shape` of this (gpu_type, tp) when given); derived curves are cached."""
        measured = self.curves.get((gpu_type, tp))
        if not measured:
            return None
        for curve in measured:
            if abs(curve.fraction - fraction) <= FRACTION_MATCH_TOLERANCE:
                return curve
        if tp * fraction * memory_gib - weights_gib <= 0:
            return None
        key = (gpu_type, tp, fraction, memory_gib, weights_gib, shape)
        if key not in self._derived:
            kv = lambda f: tp * f * memory_gib - weights_gib  # noqa: E731
            self._derived[key] = derive_curve(measured, fraction, kv, shape)
        return self._derived[key]


# ---------------------------------------------------------------------------------------------
# Curves of unprofiled fractions (docs/model.md, "Profiles")


def _weight_on_larger(fraction: float, smaller: float, larger: float) -> float:
    """Where 1/fraction lies between 1/smaller (0) and 1/larger (1); outside [0, 1] extrapolates.
    The engine model's iteration time is work / share + fixed costs (models/performance/engine.py), so at an
    equal utilisation a curve's latency is linear in 1/share."""
    return (1 / smaller - 1 / fraction) / (1 / smaller - 1 / larger)


def _capacity_rps(measured: tuple[ProfileCurve, ...], fraction: float, kv) -> float:
    """Capacity: linear in the share between measured neighbours; outside them, a power law
    T = T0 (f / f0)^k through the two nearest measured shares (k in [0, 4]: below a share the KV
    cache shrinks faster than the compute, so capacity may fall faster than the share; a KV cache
    ratio below (f / f0)^4 bounds it further), or with one measured share T0 scaled by the smaller
    of the compute and KV-cache ratios."""
    smaller = [c for c in measured if c.fraction < fraction]
    larger = [c for c in measured if c.fraction > fraction]
    if smaller and larger:
        lo, hi = smaller[-1], larger[0]
        t = (fraction - lo.fraction) / (hi.fraction - lo.fraction)
        return lo.capacity_rps + t * (hi.capacity_rps - lo.capacity_rps)
    if len(measured) >= 2:
        near, other = (larger[0], larger[1]) if larger else (smaller[-1], smaller[-2])
        slope = math.log(other.capacity_rps / near.capacity_rps) / math.log(other.fraction / near.fraction)
        ratio = (fraction / near.fraction) ** min(max(slope, 0.0), MAX_CAPACITY_SLOPE)
        if fraction < near.fraction:  # a KV cache that all but vanishes bounds it further
            ratio = min(ratio, _kv_ratio(kv, fraction, near.fraction))
        return near.capacity_rps * ratio
    if not measured:
        raise ValueError("a profile curve needs at least one measured share")
    (near,) = measured
    return near.capacity_rps * min(fraction / near.fraction, _kv_ratio(kv, fraction, near.fraction))


MAX_CAPACITY_SLOPE = 4.0


def _kv_ratio(kv, fraction: float, near: float) -> float:
    kv_near = kv(near)
    return kv(fraction) / kv_near if kv_near > 0 else fraction / near


def _neighbours(measured: tuple[ProfileCurve, ...], fraction: float) -> tuple[ProfileCurve, ...]:
    """The measured curves a fraction's curve is derived from: the nearest on each side, else the
    two nearest on its one side, else the only one."""
    smaller = [c for c in measured if c.fraction < fraction]
    larger = [c for c in measured if c.fraction > fraction]
    if smaller and larger:
        return (smaller[-1], larger[0])
    if len(measured) >= 2:
        return (larger[0], larger[1]) if larger else (smaller[-2], smaller[-1])
    return tuple(measured)


def _latency_at_load(measured, fraction: float, utilisation: np.ndarray, metric: str) -> np.ndarray:
    """Latency at the utilisations `utilisation` (rate / capacity): linear in 1/share through the
    two measured curves around `fraction` (or the two nearest on one side), kept within what
    latency = work / share + fixed allows, and the only curve scaled when just one exists. At an
    equal utilisation the engine's queue is alike and the speed of an iteration changes with the
    share (models/performance/engine.py). (An equal rate per unit of share instead fits the interior slightly
    better but misleads where capacity is far from proportional to the share, e.g. tp 8: see
    docs/evidence.md.)"""
    def at(curve: ProfileCurve) -> np.ndarray:
        return curve.latency_s(utilisation * curve.capacity_rps, metric)

    smaller = [c for c in measured if c.fraction < fraction]
    larger = [c for c in measured if c.fraction > fraction]
    pair = _neighbours(measured, fraction)
    if len(pair) == 1:
        (only,) = pair
        # one measured share: below it all of the latency scales as work (an upper bound);
        # above it none does (no speed-up is assumed without a second point)
        return at(only) * max(only.fraction / fraction, 1.0)
    lo, hi = pair
    weight = _weight_on_larger(fraction, lo.fraction, hi.fraction)
    latency = at(lo) + weight * (at(hi) - at(lo))
    # latency = work / share + fixed (>= 0) lies between the nearest smaller share's latency scaled
    # as pure work (f0 / f of it, f0 < f) and the nearest larger share's scaled so (f1 / f, f1 > f)
    if smaller:
        latency = np.maximum(latency, at(smaller[-1]) * smaller[-1].fraction / fraction)
    if larger:
        latency = np.minimum(latency, at(larger[0]) * larger[0].fraction / fraction)
    return latency


# a measured share whose capacity falls short of the engine model's by more than this factor beyond
# the profile's median departure is in a regime the model does not describe (a KV cache so small
# that the replica thrashes: the 8B verifier on two A6000 halves at f = 0.2 measures 13.5
# requests/s where the fitted model says 18.5, while 0.3-1.0 are within 5% of it; on one H100 at
# f = 0.3, 74.7 where it says 90.1, which pulled the derived 0.4 7% low). Only a shortfall: a
# thrashing cache loses capacity, it never adds any. Leave one fraction out passes every shipped
# case from 1.12 to 1.18, and misses the H100 one from 1.2 (docs/evidence.md, section 4)
OUTLIER_CAPACITY_FACTOR = 1.15
MIN_SHARES_FOR_OUTLIERS = 4  # the median departure needs a few measured shares


def _capacity_outliers(measured: tuple[ProfileCurve, ...], shape) -> set[float]:
    """Measured shares whose capacity falls short of the engine model's by more than
    OUTLIER_CAPACITY_FACTOR beyond the profile's median departure (log ratios of measured to
    modelled capacity)."""
    if len(measured) < MIN_SHARES_FOR_OUTLIERS:
        return set()
    residual = {c.fraction: math.log(c.capacity_rps / shape.at(c.fraction)[0]) for c in measured}
    centre = float(np.median(list(residual.values())))
    return {f for f, r in residual.items() if centre - r > math.log(OUTLIER_CAPACITY_FACTOR)}


def _shape_weights(measured: tuple[ProfileCurve, ...], fraction: float, shape) -> list[tuple[ProfileCurve, float]]:
    """The measured curves an engine-model-scaled curve is built from and their weights: the two
    neighbours, weighted linearly in the share (so the result is exact on each); beyond the
    measured shares the two nearest, extrapolated linearly in the share, else the nearest;
    a neighbour in another regime of the engine model than `fraction` (`shape.regime`: the KV
    cache caps the batch, or not), or one whose capacity falls far shorter of the model's than the
    rest (`_capacity_outliers`), is left out while the other one is not."""
    smaller = [c for c in measured if c.fraction < fraction]
    larger = [c for c in measured if c.fraction > fraction]
    if smaller and larger:
        lo, hi = smaller[-1], larger[0]
        outliers = _capacity_outliers(measured, shape)  # first: the model's regimes do not hold there
        if (lo.fraction in outliers) != (hi.fraction in outliers):
            return [(hi if lo.fraction in outliers else lo, 1.0)]
        regime = shape.regime(fraction)
        same_lo, same_hi = shape.regime(lo.fraction) == regime, shape.regime(hi.fraction) == regime
        if same_lo != same_hi:
            return [(lo if same_lo else hi, 1.0)]
        t = (fraction - lo.fraction) / (hi.fraction - lo.fraction)
        return [(lo, 1.0 - t), (hi, t)]
    # beyond the measured shares: the trend of the two nearest carries on (the rise with the load
    # steepens as the share shrinks), where both are typical and in the target's regime
    near, *far = larger[:2] if larger else smaller[-2:][::-1]
    if far and _alike(shape, fraction, (near, far[0]), _capacity_outliers(measured, shape)):
        t = (fraction - near.fraction) / (far[0].fraction - near.fraction)
        return [(near, 1.0 - t), (far[0], t)]
    return [(near, 1.0)]


def _alike(shape, fraction: float, curves: tuple[ProfileCurve, ...], outliers: set[float]) -> bool:
    """Whether `curves` are typical (no capacity outlier) and in the engine model's regime of `fraction`."""
    regime = shape.regime(fraction)
    return all(c.fraction not in outliers and shape.regime(c.fraction) == regime for c in curves)


def _scaled_by_shape(measured, fraction: float, shape):
    """Capacity and latency-at-utilisation of `fraction` from the engine model's ratios: each
    neighbour's measured capacity times T(f) / T(f0) (combined geometrically) and its latency at an
    equal utilisation times L(f) / L(f0) (combined linearly); `shape.at(f)` = (T, L) modelled.
    Where the rise with the load changes between the shares (`shape.rise_changes`: a share whose
    KV cache caps the batch, or an encoder's lumps), the neighbour's excess latency over its
    light-load latency at utilisation u is scaled by (g_f(u) - 1 + e) / (g_f0(u) - 1 + e), the
    engine model's simulated load shapes' excesses (`shape.excess_change`).
    Returns (capacity, latency(utilisation, metric), the curves used), or None where the engine
    model fits no batch at `fraction`."""
    weighted = _shape_weights(measured, fraction, shape)
    capacity_f, latency_f = shape.at(fraction)
    if not (capacity_f > 0 and math.isfinite(latency_f)):
        return None
    log_capacity = 0.0
    ratios = []
    for curve, weight in weighted:
        capacity_0, latency_0 = shape.at(curve.fraction)
        log_capacity += weight * math.log(curve.capacity_rps * capacity_f / capacity_0)
        ratios.append((curve, weight, latency_f / latency_0))
    capacity = math.exp(log_capacity)

    def term(curve: ProfileCurve, utilisation: np.ndarray, metric: str) -> np.ndarray:
        # latency never falls with the load (a measured curve's wiggles are not carried over)
        measured_latency = np.maximum.accumulate(curve.latency_s(utilisation * curve.capacity_rps, metric))
        if not shape.rise_changes(curve.fraction, fraction):
            return measured_latency
        # the neighbour's rise with the load is not this share's: its excess over its light-load
        # latency is scaled by the engine model's excess at both shares (simulated load shapes)
        light = curve.latency_s(np.array([shape.light_load * curve.capacity_rps]), metric)[0]
        change = shape.excess_change(curve.fraction, fraction, utilisation)
        return np.maximum.accumulate(light + (measured_latency - light) * change)

    def latency(utilisation: np.ndarray, metric: str) -> np.ndarray:
        start = np.zeros(np.shape(utilisation))  # sum()'s 0 as an array: same values, typed
        if all(w >= 0 for _, w, _ in ratios):
            return sum((w * r * term(c, utilisation, metric) for c, w, r in ratios), start)
        # beyond the measured shares: extrapolated in the logarithm, so that it stays positive
        return np.exp(sum((w * np.log(r * term(c, utilisation, metric)) for c, w, r in ratios), start))

    return capacity, latency, tuple(c for c, _ in weighted)


def derive_curve(measured: tuple[ProfileCurve, ...], fraction: float, kv, shape=None) -> ProfileCurve | None:
    """The curve of an unprofiled `fraction` from the measured curves of the same (gpu_type, tp).

    With the engine model's `shape` (models/performance/fraction_shape.py): `_scaled_by_shape`.
    Without one (a model or GPU outside the catalogue): capacity as in `_capacity_rps`, latency at
    each utilisation as in `_latency_at_load`. Either on the union of the neighbours' measured
    utilisations. A smaller share is never faster: the curve is raised to the next larger measured
    share's latency at the same rate, and its capacity kept at or below that share's (with the
    engine model's shape, also never slower nor smaller than the next smaller measured share)."""
    scaled = _scaled_by_shape(measured, fraction, shape) if shape is not None else None
    if shape is not None and scaled is None:
        return None  # the engine model fits no batch at this share (vLLM keeps 10% of the memory back)
    if scaled is not None:
        capacity, latency_at, near = scaled
    else:
        capacity = _capacity_rps(measured, fraction, kv)
        near = _neighbours(measured, fraction)
        latency_at = lambda u, metric: _latency_at_load(measured, fraction, u, metric)  # noqa: E731
    larger = [c for c in measured if c.fraction > fraction]
    smaller = [c for c in measured if c.fraction < fraction] if scaled is not None else []
    if smaller:  # nor slower than the next smaller measured share (the engine model's fit is no bound)
        capacity = max(capacity, smaller[-1].capacity_rps)
    if larger:
        capacity = min(capacity, larger[0].capacity_rps)
    if not capacity > 0:
        return None
    points = np.concatenate([c.rates_rps / c.capacity_rps for c in near])
    for bound in (smaller[-1:] + larger[:1]):  # the bounds' own points, so that the clamps are exact between points
        points = np.concatenate([points, bound.rates_rps / capacity])
    utilisation = np.unique(np.append(points[(points > 0) & (points < 1.0)], 1.0))
    rates = utilisation * capacity
    latencies = {}
    for metric in LATENCY_METRICS:
        latency = latency_at(utilisation, metric)
        if smaller:
            within = rates <= smaller[-1].capacity_rps
            latency = np.where(within, np.minimum(latency, smaller[-1].latency_s(rates, metric)), latency)
        if larger:
            latency = np.maximum(latency, larger[0].latency_s(rates, metric))
        latencies[metric] = _frozen(latency)
    sources = tuple(c.fraction for c in near)
    return ProfileCurve(measured[0].gpu_type, measured[0].tp, fraction, _frozen(rates), latencies, derived_from=sources)


CAPACITY_INVERSION_TOLERANCE = 0.02  # a larger share measured this much slower is flagged


@dataclass(frozen=True)
class CapacityInversion:
    """A larger GPU share of one (gpu_type, tp) measured with less capacity than a smaller one:
    the same engine with more compute and KV cache is not slower, so the measurement is suspect
    (too few requests per rate point, a sweep that stopped short of saturation)."""

    gpu_type: str
    tp: int
    smaller_fraction: float
    smaller_capacity_rps: float
    larger_fraction: float
    larger_capacity_rps: float

    def message(self) -> str:
        return (f"{self.gpu_type} tp{self.tp}: capacity_rps {self.larger_capacity_rps:.4g} at fraction "
                f"{self.larger_fraction:g} is below {self.smaller_capacity_rps:.4g} at {self.smaller_fraction:g}; "
                "a larger share is not slower: re-measure both with more requests per rate point "
                "and rates past saturation")


def capacity_inversions(profile: LlmProfile, tolerance: float = CAPACITY_INVERSION_TOLERANCE) -> list[CapacityInversion]:
    """Measured fractions whose capacity is below a smaller measured fraction's (by more than
    `tolerance`), per (gpu_type, tp); each larger fraction named once, against the smaller
    fraction of the largest capacity."""
    found = []
    for (gpu_type, tp), curves in sorted(profile.curves.items()):
        for index, larger in enumerate(curves[1:], start=1):
            fastest = max(curves[:index], key=lambda c: c.capacity_rps)
            if larger.capacity_rps < fastest.capacity_rps * (1 - tolerance):
                found.append(CapacityInversion(gpu_type, tp, fastest.fraction, fastest.capacity_rps,
                                               larger.fraction, larger.capacity_rps))
    return found


def _bad_row(source: str, column: str, row: int, problem: str, fix: str) -> InputError:
    return InputError(source, f"row {row + 2}, column {column}", problem, fix)


def _number_column(raw: list[str], column: str, source: str, optional: bool = False) -> np.ndarray:
    values = np.empty(len(raw))
    for row, text in enumerate(raw):
        if optional and text == "":
            values[row] = np.nan
            continue
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
        optional = column in OPTIONAL_NUMBER_COLUMNS
        table[column] = _number_column([cells[index[column]].strip() for cells in body], column, source, optional)
    for column in OPTIONAL_COLUMNS:
        if column in header:
            at = header.index(column)
            table[column] = _number_column([cells[at].strip() for cells in body], column, source, optional=True)
    row = _first((table["tp"] < 1) | (table["tp"] != np.round(table["tp"])))
    if row is not None:
        raise _bad_row(source, "tp", row, "tp must be a positive integer", "use 1, 2, 4 or 8")
    row = _first((table["fraction"] <= 0) | (table["fraction"] > 1 + FRACTION_MATCH_TOLERANCE))
    if row is not None:
        raise _bad_row(source, "fraction", row, "fraction must lie in (0, 1]", "write the GPU share per shard")
    row = _first(table["arrival_rate"] <= 0)
    if row is not None:
        raise _bad_row(source, "arrival_rate", row, "arrival_rate must be > 0", "drop rows at zero load")
    _check_latencies(table, source)
    table["tp"] = table["tp"].astype(int)
    return table


def _check_latencies(table: dict[str, np.ndarray], source: str) -> None:
    """Latencies no measurement produces: zero, or percentiles that fall (p50 <= p90 <= p99)."""
    for metric in LATENCY_METRICS:
        row = _first(table[f"latency_{metric}"] <= 0)
        if row is not None:
            raise _bad_row(source, f"latency_{metric}", row, "a latency of 0 s", "write the measured latency in seconds")
    for lower, upper in (("p50", "p90"), ("p90", "p99")):
        row = _first(table[f"latency_{upper}"] < table[f"latency_{lower}"] * (1 - 1e-9))
        if row is not None:
            raise _bad_row(
                source, f"latency_{upper}", row, f"latency_{upper} is below latency_{lower}",
                "percentiles must not fall: check that the columns are not swapped",
            )


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


FLOAT_FORMAT = "%.6g"


def as_written(value: float) -> float:
    """`value` as `write_profile` writes it and the loader reads it back, so that a writer can
    judge a row's stability on the numbers the loader will see."""
    return float(FLOAT_FORMAT % value)


def write_profile(rows, path: Path | str) -> None:
    """Write profile rows (a pandas DataFrame) in the canonical column order, sorted, with stable
    float formatting."""
    columns = list(PROFILE_COLUMNS) + [c for c in OPTIONAL_COLUMNS if c in rows and rows[c].notna().any()]
    frame = rows.loc[:, columns].sort_values(["gpu_type", "tp", "fraction", "arrival_rate"])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False, float_format=FLOAT_FORMAT, lineterminator="\n")


def units_for_memory(need_gib: float, tp: int, memory_gib: float, fractions_per_gpu: int) -> int:
    """Least share units per shard s with tp * (s/F) * memory_gib >= need_gib (may exceed F)."""
    per_shard = need_gib / (tp * memory_gib) * fractions_per_gpu
    units = math.ceil(per_shard - 1e-9)
    return max(units, 1)
