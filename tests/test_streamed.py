"""Streamed statistics (models/instance/streamed.py): the quantile sketch against exact numpy
percentiles on random samples, its determinism, and running moments against exact ones."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy.models.instance.streamed import MIN_POSITIVE, QuantileSketch, RunningMoments

# Latencies and times as the simulator sees them: 0 and positive values over many decades.
values = st.one_of(
    st.just(0.0),
    st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False),
)
samples = st.lists(values, min_size=1, max_size=400)
percentile_points = st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=1, max_size=6)
alphas = st.sampled_from([0.001, 0.005, 0.01, 0.05])


def _sketch(xs, alpha=0.001) -> QuantileSketch:
    sketch = QuantileSketch(alpha)
    for x in xs:
        sketch.add(x)
    return sketch


def _within(estimate: float, exact: float, alpha: float) -> bool:
    # alpha is the stated bound; the 1e-9 absorbs the rounding of log() at a bucket's edge
    return abs(estimate - exact) <= alpha * (1 + 1e-9) * abs(exact) + 1e-12


@given(samples, percentile_points, alphas)
@settings(max_examples=300, deadline=None)
def test_sketch_percentiles_are_within_alpha_of_numpy(xs, qs, alpha):
    sketch = _sketch(xs, alpha)
    for q, estimate in zip(qs, sketch.percentiles(qs)):
        exact = float(np.percentile(np.array(xs), q))
        assert _within(estimate, exact, alpha), (q, estimate, exact)


@given(samples, alphas, st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_sketch_is_independent_of_insertion_order(xs, alpha, rng):
    shuffled = list(xs)
    rng.shuffle(shuffled)
    qs = [0, 1, 50, 90, 99, 99.9, 100]
    first, second = _sketch(xs, alpha), _sketch(shuffled, alpha)
    assert first.buckets == second.buckets
    assert first.percentiles(qs) == second.percentiles(qs)


@given(samples, samples)
@settings(max_examples=100, deadline=None)
def test_a_merged_sketch_is_the_sketch_of_all_values(first, second):
    merged = _sketch(first)
    merged.merge(_sketch(second))
    whole = _sketch(first + second)
    assert (merged.buckets, merged.count, merged.zeros) == (whole.buckets, whole.count, whole.zeros)
    assert merged.percentiles([50, 99]) == whole.percentiles([50, 99])


def test_the_sketch_is_deterministic_and_exact_at_its_ends():
    rng = np.random.default_rng(7)
    xs = rng.lognormal(0.0, 1.5, 5000).tolist()
    assert _sketch(xs).percentiles([50, 90, 99]) == _sketch(xs).percentiles([50, 90, 99])
    assert _sketch(xs).percentile(0) == min(xs) and _sketch(xs).percentile(100) == max(xs)


def test_sketch_memory_is_bounded_by_the_value_range_not_the_count():
    """ln(max/min)/ln(gamma) + 2 buckets, however many values: 1,000 or 1,000,000 values spread over
    [1, 100] occupy the same buckets."""
    rng = np.random.default_rng(1)
    small, large = _sketch(rng.uniform(1, 100, 1_000)), _sketch(rng.uniform(1, 100, 1_000_000))
    gamma = (1 + small.alpha) / (1 - small.alpha)
    bound = math.log(100 / 1) / math.log(gamma) + 2
    assert len(small.buckets) <= len(large.buckets) <= bound
    assert large.count == 1_000_000


def test_an_empty_sketch_answers_nan_and_bad_values_are_refused():
    sketch = QuantileSketch()
    assert math.isnan(sketch.percentile(50))
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            sketch.add(bad)
    with pytest.raises(ValueError):
        QuantileSketch(alpha=0.0)
    sketch.add(MIN_POSITIVE / 2)
    assert sketch.zeros == 1 and sketch.percentile(50) == MIN_POSITIVE / 2  # clamped to the exact min


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1, max_size=300))
@settings(max_examples=200, deadline=None)
def test_running_moments_equal_the_exact_ones(xs):
    moments = RunningMoments()
    for x in xs:
        moments.add(x)
    summary = moments.summary()
    exact = np.array(xs)
    scale = max(float(np.abs(exact).max()), 1.0)
    assert summary.count == len(xs)
    assert summary.mean == pytest.approx(float(exact.mean()), rel=1e-9, abs=1e-9 * scale)
    assert summary.std == pytest.approx(float(exact.std()), rel=1e-6, abs=1e-6 * scale)
    assert (summary.minimum, summary.maximum) == (float(exact.min()), float(exact.max()))


def test_empty_moments_are_nan():
    summary = RunningMoments().summary()
    assert summary.count == 0 and math.isnan(summary.mean) and math.isnan(summary.cv)
