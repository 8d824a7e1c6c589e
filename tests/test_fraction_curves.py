"""Curves of unprofiled GPU fractions (models/profile.py `derive_curve`, docs/model.md "Profiles"):
property tests on profiles with the engine model's shape. Latency at equal utilisation is
work / share + fixed, capacity grows with the share and the KV cache; the derived curves must be
exact on profiled points, never faster for a smaller share, and never give a smaller share more
capacity."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy.models.instance.profile import build_profile

GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
POINTS = (0.05, 0.2, 0.4, 0.6, 0.8, 0.9, 1.0)
MEMORY_GIB, WEIGHTS_GIB = 48.0, 3.0


def engine_shaped_profile(work_s: float, fixed_s: float, rate_rps: float, bend: float, measured) -> object:
    """L(f, u) = (work/f + fixed) * (1 + bend * u^3) at utilisation u; capacity rate * f * kv share."""
    rows = []
    for f in measured:
        kv = min(1.0, (f * MEMORY_GIB - WEIGHTS_GIB) / (0.3 * MEMORY_GIB))
        capacity = rate_rps * f * kv
        for u in POINTS + (1.3,):
            latency = (work_s / f + fixed_s) * (1 + bend * min(u, 1.0) ** 3)
            rows.append(dict(gpu_type="G", tp=1, fraction=f, arrival_rate=u * capacity, throughput=min(u, 1.0) * capacity,
                             latency_mean=latency, latency_p50=0.9 * latency, latency_p90=1.4 * latency,
                             latency_p99=2.0 * latency))
    return build_profile(pd.DataFrame(rows), "engine-shaped")


profiles = st.builds(
    engine_shaped_profile,
    work_s=st.floats(0.05, 3.0),
    fixed_s=st.floats(0.0, 1.0),
    rate_rps=st.floats(1.0, 50.0),
    bend=st.floats(0.2, 5.0),
    measured=st.lists(st.sampled_from(GRID), min_size=1, max_size=6, unique=True).map(sorted),
)


def curve(profile, f):
    return profile.curve("G", 1, f, MEMORY_GIB, WEIGHTS_GIB)


@settings(max_examples=200, deadline=None)
@given(profiles, st.sampled_from(GRID), st.sampled_from(GRID), st.floats(0.0, 1.0))
def test_a_smaller_share_is_never_faster_nor_larger(profile, f1, f2, load):
    small, large = sorted((f1, f2))
    a, b = curve(profile, small), curve(profile, large)
    assert a.capacity_rps <= b.capacity_rps * (1 + 1e-9)
    rate = load * a.capacity_rps
    for metric in ("mean", "p99"):
        assert a.latency_s(rate, metric) >= b.latency_s(rate, metric) * (1 - 1e-9)


@settings(max_examples=100, deadline=None)
@given(profiles)
def test_profiled_fractions_are_exact(profile):
    (measured,) = profile.curves.values()
    for c in measured:
        got = curve(profile, c.fraction)
        assert got.measured and got.derived_from == ()
        assert np.array_equal(got.rates_rps, c.rates_rps)
        assert np.array_equal(got.latency_s(c.rates_rps), c.latencies_s["mean"])


@settings(max_examples=100, deadline=None)
@given(profiles, st.sampled_from(GRID))
def test_derived_curves_name_their_sources_and_rise_with_load(profile, f):
    got = curve(profile, f)
    measured = {c.fraction for c in next(iter(profile.curves.values()))}
    if f in measured:
        return
    assert got.derived_from and set(got.derived_from) <= measured
    assert np.all(np.diff(got.latencies_s["mean"]) >= -1e-12)


def test_plan_output_marks_derived_curves(write_instance):
    from scepsy.models.instance.allocation import Allocation, LlmAllocation
    from scepsy.models.performance.alp import predict
    from scepsy.models.instance.instance import load_instance
    from scepsy.models.plan.plan import prediction_to_json
    from scepsy.models.plan.report import llm_table

    instance = load_instance(write_instance())  # profiles measured at fractions 0.5 and 1.0
    allocation = Allocation(10, (LlmAllocation("gen", "A6000", 1, 7, 1), LlmAllocation("ver", "A6000", 2, 5, 1)))
    prediction = predict(instance, allocation)
    llms = {entry["name"]: entry for entry in prediction_to_json(prediction)["llms"]}
    assert llms["gen"]["profile_derived_from_fractions"] == [0.5, 1.0]
    assert "profile_derived_from_fractions" not in llms["ver"]  # measured: the plan format as before
    assert "gen: 0.5, 1" in llm_table(prediction).caption
