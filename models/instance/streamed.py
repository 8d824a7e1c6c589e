"""Streamed statistics: summaries of a stream of numbers kept in memory that does not grow with the
stream's length (the simulator's workflow latencies and per-request LLM times; docs/simulation.md).

`RunningMoments` keeps count, sum, min, max and Welford's sum of squared deviations: the mean
(sum / count), standard deviation and range of every value added, exact up to float rounding.

`QuantileSketch` answers percentiles of nonnegative values within a relative error `alpha`, with
DDSketch's log-bucket histogram (Masson, Rim and Lee, "DDSketch: a fast and fully-mergeable quantile
sketch with relative-error guarantees", PVLDB 12(12), 2019):

    gamma = (1 + alpha) / (1 - alpha)
    a value x > MIN_POSITIVE falls in bucket k = ceil(log_gamma x), which covers (gamma^(k-1), gamma^k];
    the bucket's representative 2 gamma^k / (gamma + 1) is within relative error alpha of every
    value in it; values <= MIN_POSITIVE are counted as 0.

The percentile q is numpy's default ("linear") one: with the n values sorted x_0 <= ... <= x_(n-1)
and h = q/100 (n - 1), it is x_floor(h) + (h - floor(h)) (x_ceil(h) - x_floor(h)). The sketch finds
the two order statistics' buckets by their cumulative counts and interpolates the representatives;
each is within alpha of its order statistic and all are nonnegative, so the interpolation is within
alpha of numpy's percentile. The smallest and largest values are kept exactly (so p0 and p100 are
exact), and estimates are clamped to [min, max], which only moves them closer.

Memory: one counter per occupied bucket, at most ln(max / min) / ln(gamma) + 2 of them for values
in [min, max] (1 ms to 1 day at alpha = 0.1%: 9,140 buckets at most; a 1e5-second simulation's
latencies occupy 1,721), whatever the number of values.
Determinism: the bucket counts do not depend on the order in which values arrive, so neither do
the percentiles; a merged sketch equals the sketch of all the values.

Why not the `ddsketch` package (DataDog/sketches-py, ddsketch/ddsketch.py): its get_quantile_value
answers the lower order statistic x_floor(h), not the interpolated percentile the simulator has
always reported, and its empty-sketch answer uses `np.NaN`, which NumPy 2 removed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Relative error of the simulator's latency percentiles.
DEFAULT_ALPHA = 0.001

# Values at most this (s, for latencies) are counted as exactly 0: a log bucket needs x > 0.
MIN_POSITIVE = 1e-12


@dataclass(frozen=True)
class Moments:
    """A frozen summary of a RunningMoments (NaN where no value was added)."""

    count: int
    mean: float
    std: float  # population standard deviation (numpy's default, ddof=0)
    minimum: float
    maximum: float

    @property
    def cv(self) -> float:
        """Coefficient of variation, std / mean (NaN without a positive mean)."""
        return self.std / self.mean if self.count and self.mean > 0 else math.nan


@dataclass
class RunningMoments:
    """Count, sum, min, max and variance of a stream, one value at a time (Welford's update)."""

    count: int = 0
    total: float = 0.0
    minimum: float = math.inf
    maximum: float = -math.inf
    _mean: float = 0.0  # Welford's running mean, for the squared deviations only
    _squares: float = 0.0  # sum of squared deviations from the mean

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)
        delta = value - self._mean
        self._mean += delta / self.count
        self._squares += delta * (value - self._mean)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    @property
    def std(self) -> float:
        return math.sqrt(max(self._squares, 0.0) / self.count) if self.count else math.nan

    def summary(self) -> Moments:
        if not self.count:
            return Moments(0, math.nan, math.nan, math.nan, math.nan)
        return Moments(self.count, self.mean, self.std, self.minimum, self.maximum)


@dataclass
class QuantileSketch:
    """Percentiles of nonnegative values within relative error `alpha` (see the module docstring)."""

    alpha: float = DEFAULT_ALPHA
    count: int = 0
    zeros: int = 0
    minimum: float = math.inf
    maximum: float = -math.inf
    buckets: dict[int, int] = field(default_factory=dict)  # bucket index k -> values in it

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must lie in (0, 1), got {self.alpha!r}")
        self._gamma = (1 + self.alpha) / (1 - self.alpha)
        self._log_gamma = math.log(self._gamma)

    def add(self, value: float) -> None:
        if not value >= 0 or math.isinf(value):
            raise ValueError(f"a quantile sketch holds finite nonnegative values, got {value!r}")
        self.count += 1
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)
        if value <= MIN_POSITIVE:
            self.zeros += 1
            return
        key = math.ceil(math.log(value) / self._log_gamma)
        self.buckets[key] = self.buckets.get(key, 0) + 1

    def merge(self, other: QuantileSketch) -> None:
        """Add every value of `other` (same alpha)."""
        if other.alpha != self.alpha:
            raise ValueError(f"cannot merge sketches of alpha {self.alpha} and {other.alpha}")
        self.count += other.count
        self.zeros += other.zeros
        self.minimum = min(self.minimum, other.minimum)
        self.maximum = max(self.maximum, other.maximum)
        for key, n in other.buckets.items():
            self.buckets[key] = self.buckets.get(key, 0) + n

    def percentile(self, q: float) -> float:
        """numpy.percentile(values, q) within relative error alpha (NaN when empty)."""
        return self.percentiles([q])[0]

    def percentiles(self, qs: list[float]) -> list[float]:
        if not self.count:
            return [math.nan for _ in qs]
        ranks = []
        for q in qs:
            if not 0 <= q <= 100:
                raise ValueError(f"a percentile lies in [0, 100], got {q!r}")
            h = q / 100 * (self.count - 1)
            ranks += [math.floor(h), math.ceil(h)]
        values = self._order_statistics(ranks)
        out = []
        for i, q in enumerate(qs):
            h = q / 100 * (self.count - 1)
            low, high = values[2 * i], values[2 * i + 1]
            estimate = low + (h - math.floor(h)) * (high - low)
            out.append(min(max(estimate, self.minimum), self.maximum))
        return out

    def _order_statistics(self, ranks: list[int]) -> list[float]:
        """The estimated x_r (0-based rank r) for each rank, from the buckets' cumulative counts."""
        wanted = sorted(set(ranks))
        found: dict[int, float] = {}
        seen, position = self.zeros, 0
        while position < len(wanted) and wanted[position] < seen:
            found[wanted[position]] = 0.0
            position += 1
        for key in sorted(self.buckets):
            seen += self.buckets[key]
            while position < len(wanted) and wanted[position] < seen:
                found[wanted[position]] = self._representative(key)
                position += 1
        found[0], found[self.count - 1] = self.minimum, self.maximum  # the smallest and largest are kept exactly
        return [found[r] for r in ranks]

    def _representative(self, key: int) -> float:
        return 2 * self._gamma**key / (self._gamma + 1)
