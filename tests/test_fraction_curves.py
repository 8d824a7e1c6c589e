"""Curves of unprofiled GPU fractions (models/instance/profile.py `derive_curve`, docs/model.md "Profiles"):
property tests on profiles with the engine model's shape. Latency at equal utilisation is
work / share + fixed, capacity grows with the share and the KV cache; the derived curves must be
exact on profiled points, never faster for a smaller share, and never give a smaller share more
capacity."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
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
    from scepsy.models.plan.document import prediction_sections
    from scepsy.models.plan.report import llm_table

    instance = load_instance(write_instance())  # profiles measured at fractions 0.5 and 1.0
    allocation = Allocation(10, (LlmAllocation("gen", "A6000", 1, 7, 1), LlmAllocation("ver", "A6000", 2, 5, 1)))
    prediction = predict(instance, allocation)
    llms = {entry["name"]: entry for entry in prediction_sections(prediction)["llms"]}
    assert llms["gen"]["profile_derived_from_fractions"] == [0.5, 1.0]
    assert "profile_derived_from_fractions" not in llms["ver"]  # measured: the plan format as before
    assert "gen: 0.5, 1" in str(llm_table(prediction).caption)


# -- with the engine model's shape (models/performance/fraction_shape.py) -------------------------

ENGINE_CASES = (("llama-3.1-8b", "A6000", 1), ("llama-3.1-8b", "H100-SXM", 2), ("llama-3.2-1b", "H100-SXM", 1),
                ("e5-base-v2", "A6000", 1))


def engine_model_profile(case, prompt, completion, max_batch, bend, measured):
    """A profile whose capacity and light-load latency are the engine model's own for one request
    shape on the fitting grid (latency (1 + bend u^3) times the light-load one at utilisation u), and
    the ShareModel that made it; fractions where nothing fits are left out."""
    from scepsy.models.catalog import catalog
    from scepsy.models.performance.fraction_shape import ShareModel

    name, gpu, tp = case
    model = catalog.model(name)
    truth = ShareModel(model, catalog.gpu(gpu), tp, prompt, 0 if model.encoder else completion,
                       max_batch)
    rows = []
    for f in measured:
        capacity, light = truth.at(f)
        if not capacity > 0:
            continue
        for u in POINTS + (1.3,):
            latency = light * (1 + bend * min(u, 1.0) ** 3)
            rows.append(dict(gpu_type=gpu, tp=tp, fraction=f, arrival_rate=u * capacity,
                             throughput=min(u, 1.0) * capacity, latency_mean=latency, latency_p50=0.9 * latency,
                             latency_p90=1.4 * latency, latency_p99=2.0 * latency))
    return (build_profile(pd.DataFrame(rows), "engine-model") if rows else None), truth


def engine_model_curves():
    from scepsy.models.performance.fraction_shape import BATCH_GRID, COMPLETION_GRID, PROMPT_GRID

    return st.builds(
        engine_model_profile,
        case=st.sampled_from(ENGINE_CASES),
        prompt=st.sampled_from(PROMPT_GRID),
        completion=st.sampled_from(COMPLETION_GRID),
        max_batch=st.sampled_from(BATCH_GRID),
        bend=st.floats(0.2, 5.0),
        measured=st.lists(st.sampled_from(GRID), min_size=2, max_size=6, unique=True).map(sorted),
    )


def shaped_curve(profile, truth, f):
    from scepsy.models.catalog.catalog import find_gpu, find_model
    from scepsy.models.performance.fraction_shape import share_model

    ((gpu, tp), measured), = profile.curves.items()
    shape = share_model(find_model(truth.model.name), find_gpu(gpu), tp, measured)
    return profile.curve(gpu, tp, f, truth.gpu.memory_gib, truth.model.weights_gib, shape)


@settings(max_examples=60, deadline=None)
@given(engine_model_curves(), st.sampled_from(GRID), st.sampled_from(GRID), st.floats(0.0, 1.0))
def test_engine_shaped_curves_never_make_a_smaller_share_faster(made, f1, f2, load):
    profile, truth = made
    if profile is None:
        return
    small, large = sorted((f1, f2))
    a, b = shaped_curve(profile, truth, small), shaped_curve(profile, truth, large)
    if a is None:  # no batch fits the smaller share
        return
    assert b is not None
    assert a.capacity_rps <= b.capacity_rps * (1 + 1e-9)
    rate = load * a.capacity_rps
    for metric in ("mean", "p99"):
        assert a.latency_s(rate, metric) >= b.latency_s(rate, metric) * (1 - 1e-9)


@settings(max_examples=40, deadline=None)
@given(engine_model_curves())
def test_engine_shaped_curves_are_exact_on_profiled_points(made):
    profile, truth = made
    if profile is None:
        return
    (measured,) = profile.curves.values()
    for c in measured:
        got = shaped_curve(profile, truth, c.fraction)
        assert got.measured and np.array_equal(got.latency_s(c.rates_rps), c.latencies_s["mean"])


def _rise_is_modelled(profile, truth, f, sources) -> bool:
    """Whether the derived curve's rise with the load is scaled by the engine model's simulated one (an
    encoder, or `f` or a share it is derived from KV-bound): not the synthetic (1 + bend u^3)."""
    from scepsy.models.catalog.catalog import find_gpu, find_model
    from scepsy.models.performance.fraction_shape import share_model

    ((gpu, tp), measured), = profile.curves.items()
    shape = share_model(find_model(truth.model.name), find_gpu(gpu), tp, measured)
    assert shape is not None
    return truth.model.encoder or any("memory" in (shape.regime(source), shape.regime(f)) for source in sources)


def identified(truth, measured_shares):
    """The engine model the measured shares determine: the truth's request shape with the smallest
    batch cap on the fitting grid that gives the same capacity and latency at every measured share.
    Where the KV cache caps the batch at every measured share, any larger cap fits them alike (the
    data bound it only from below), and the fit takes the smallest (fraction_shape.py `_fit`)."""
    from dataclasses import replace

    from scepsy.models.performance.fraction_shape import BATCH_GRID

    for batch in BATCH_GRID if not truth.model.encoder else ():
        candidate = replace(truth, max_batch=batch)
        if all(candidate.at(f) == truth.at(f) for f in measured_shares):
            return candidate
    return truth


@pytest.mark.exhaustive  # 200 engine-model profiles, minutes on two cores: with the matrix
@settings(max_examples=200, deadline=None)
@given(engine_model_curves(), st.sampled_from(GRID))
# found by random runs when the test held every share to the truth's own batch cap: measured shares
# all KV-bound, a larger share extrapolated 4.6% and 1.0% below a truth with a larger cap
@example(engine_model_profile(("llama-3.1-8b", "H100-SXM", 2), 1024, 256, 256, 1.0, [0.1, 0.2, 0.3]), 0.4)
@example(engine_model_profile(("llama-3.1-8b", "A6000", 1), 1024, 16, 128, 1.0, [0.4, 0.5]), 0.6)
def test_a_profile_that_follows_the_engine_model_is_derived_exactly(made, f):
    """The fit finds the request shape back (up to shapes with the same ratios), so a derived curve
    is the engine model's own: capacity T(f) and latency L(f) (1 + bend u^3), KV cliffs included;
    where the measured shares leave the batch cap open (the KV cache caps the batch at all of them),
    the smallest cap that fits them: a larger share is then never given more capacity than the
    truth's."""
    profile, truth = made
    if profile is None or len(next(iter(profile.curves.values()))) < 2:
        return
    got = shaped_curve(profile, truth, f)
    capacity, light = truth.at(f)
    if got is None:
        assert capacity == 0
        return
    # The fit recovers the shape up to shapes with the same ratios on the measured shares; such
    # shapes part slightly beyond the measured range (0.07% at f=0.6 from 0.1-0.5 for 2048-token
    # prompts on an A6000), so extrapolated shares are held to 1%, measured ranges to 1e-6.
    measured_shares = [c.fraction for c in next(iter(profile.curves.values()))]
    inside = min(measured_shares) <= f <= max(measured_shares)
    tolerance = 1e-6 if inside else 1e-2
    assert got.capacity_rps == pytest.approx(identified(truth, measured_shares).at(f)[0], rel=tolerance)
    assert got.capacity_rps <= capacity * (1 + tolerance)
    if got.measured or _rise_is_modelled(profile, truth, f, got.derived_from):
        return  # test_a_kv_regime_change_... and test_an_encoders_rise_with_the_load_...
    measured = next(iter(profile.curves.values()))[0]
    for u in (0.1, 0.4, 0.8):  # latency over the light-load latency at utilisation u: alike at every share
        ratio = got.latency_s(u * got.capacity_rps) / light
        reference = measured.latency_s(u * measured.capacity_rps) / truth.at(measured.fraction)[1]
        assert ratio == pytest.approx(reference, rel=1e-6)


def test_a_kv_cache_cliff_of_a_shipped_profile_is_derived_from_its_neighbour():
    """Llama-3-8B on two RTX A6000 halves (instances/profiles/llama-3-8b.csv) at f = 0.2 keeps a
    2.3 GiB KV cache, a third of 0.3's: its capacity is 2.64 requests/s against 4.69. Left out, it is
    derived from 0.3 and 0.4 with the engine model's shape within 10% of its mean latency at 10-80% of its
    capacity; the rule without the engine model (a model outside the catalogue) misses by > 30%."""
    from dataclasses import replace
    from pathlib import Path

    from scepsy.models.instance.profile import load_profile
    from scepsy.models.catalog.catalog import find_gpu, find_model
    from scepsy.models.performance.fraction_shape import share_model

    profile = load_profile(Path(__file__).resolve().parent.parent / "instances" / "profiles" / "llama-3-8b.csv")
    key = ("A6000", 2)
    (truth,) = [c for c in profile.curves[key] if c.fraction == 0.2]
    kept = tuple(c for c in profile.curves[key] if c.fraction != 0.2)
    left_out = replace(profile, curves={key: kept})
    shape = share_model(find_model("meta-llama/Meta-Llama-3-8B-Instruct"), find_gpu("A6000"), 2, kept)
    rates = np.linspace(0.1, 0.8, 15) * truth.capacity_rps

    def worst_error(curve) -> float:
        return float(np.max(np.abs(curve.latency_s(rates) / truth.latency_s(rates) - 1)))

    got = left_out.curve("A6000", 2, 0.2, 48.0, 14.96, shape)
    assert got is not None and got.derived_from == (0.3, 0.4)  # the trend of the two nearest, extrapolated
    assert worst_error(got) <= 0.10
    assert worst_error(left_out.curve("A6000", 2, 0.2, 48.0, 14.96)) > 0.30


# -- measured capacities that fall with the share (models/instance/profile.py capacity_inversions) --


@settings(max_examples=100, deadline=None)
@given(profiles)
def test_profiles_whose_capacity_grows_with_the_share_are_not_flagged(profile):
    from scepsy.models.instance.profile import capacity_inversions

    assert capacity_inversions(profile) == []


@settings(max_examples=100, deadline=None)
@given(st.floats(1.0, 50.0), st.floats(0.3, 1.5), st.sampled_from(GRID[:-1]))
def test_a_larger_share_measured_slower_than_a_smaller_one_is_flagged(rate_rps, speed, small):
    """Two shares of one engine, the larger one's capacity `speed` times the smaller's: flagged
    exactly when it is more than 2% below it, naming both."""
    from scepsy.models.instance.profile import capacity_inversions

    rows = []
    for f, capacity in ((small, rate_rps), (1.0, speed * rate_rps)):
        for u in POINTS:
            rows.append(dict(gpu_type="G", tp=1, fraction=f, arrival_rate=u * capacity, throughput=u * capacity,
                             latency_mean=1 + u, latency_p50=1 + u, latency_p90=1 + u, latency_p99=1 + u))
    found = capacity_inversions(build_profile(pd.DataFrame(rows), "two shares"))
    assert bool(found) == (speed < 0.98)
    for inversion in found:
        assert (inversion.smaller_fraction, inversion.larger_fraction) == (small, 1.0)
        assert "fraction 1 is below" in inversion.message()


def test_shipped_profiles_have_no_capacity_that_falls_with_the_share():
    """The shipped profiles are synthesized with the capacity located on each curve's stability
    boundary (models/profiles/synthesize.py `sweep`), so a larger share is never measured slower."""
    from pathlib import Path

    from scepsy.models.instance.profile import capacity_inversions, load_profile

    for path in sorted((Path(__file__).resolve().parent.parent / "instances" / "profiles").glob("*.csv")):
        assert [i.message() for i in capacity_inversions(load_profile(path))] == [], path.name


def test_a_neighbour_the_engine_model_cannot_describe_is_not_interpolated_from():
    """The 8B verifier on two A6000 halves (instances/profiles/llama-3.1-8b-prm.csv) at f = 0.2
    thrashes its 2.3 GiB KV cache: 12.7 requests/s where the engine model fitted to the other
    shares says about 17.8, while they are within 4% of it. Left out, f = 0.3 is derived from 0.4
    alone (interpolating 0.2's capacity in put it 13% low and its latency at 80% of capacity 87%
    off) and is within 10% of its measured mean latency at 10-80% of its capacity."""
    from dataclasses import replace
    from pathlib import Path

    from scepsy.models.instance.profile import _capacity_outliers, load_profile
    from scepsy.models.catalog.catalog import find_gpu, find_model
    from scepsy.models.performance.fraction_shape import share_model

    profile = load_profile(Path(__file__).resolve().parent.parent / "instances" / "profiles" / "llama-3.1-8b-prm.csv")
    key = ("A6000", 2)
    (truth,) = [c for c in profile.curves[key] if c.fraction == 0.3]
    kept = tuple(c for c in profile.curves[key] if c.fraction != 0.3)
    shape = share_model(find_model("llama-3.1-8b"), find_gpu("A6000"), 2, kept)
    assert _capacity_outliers(kept, shape) == {0.2}
    got = replace(profile, curves={key: kept}).curve("A6000", 2, 0.3, 48.0, 14.96, shape)
    assert got is not None and got.derived_from == (0.4,)
    rates = np.linspace(0.1, 0.8, 15) * truth.capacity_rps
    assert float(np.max(np.abs(got.latency_s(rates) / truth.latency_s(rates) - 1))) <= 0.10


def test_a_share_its_kv_cache_starves_is_left_out_and_a_fast_one_is_not(monkeypatch):
    """The verifier on one H100 (instances/profiles/llama-3.1-8b-prm.csv): at f = 0.3 its KV cache
    first bites and its capacity falls below what the fitted model says, while 0.5-1.0 follow it.
    Left out, 0.4 is derived from 0.5 alone, within 10% at 10-80% of its capacity; interpolated
    with 0.3 as well (the rule at 1.28), more than 5% off. A share measured faster than the model
    is not an outlier: a thrashing cache only loses capacity."""
    from dataclasses import replace
    from pathlib import Path

    import scepsy.models.instance.profile as profiles
    from scepsy.models.catalog.catalog import find_gpu, find_model
    from scepsy.models.performance.fraction_shape import share_model

    profile = profiles.load_profile(Path(__file__).resolve().parent.parent / "instances" / "profiles" / "llama-3.1-8b-prm.csv")
    key = ("H100", 1)
    (truth,) = [c for c in profile.curves[key] if c.fraction == 0.4]
    kept = tuple(c for c in profile.curves[key] if c.fraction != 0.4)
    shape = share_model(find_model("llama-3.1-8b"), find_gpu(key[0]), key[1], kept)
    rates = np.linspace(0.1, 0.8, 15) * truth.capacity_rps

    def derived():
        got = replace(profile, curves={key: kept}).curve(*key, 0.4, 80.0, 14.96, shape)
        assert got is not None
        return got.derived_from, float(np.max(np.abs(got.latency_s(rates) / truth.latency_s(rates) - 1)))

    assert profiles._capacity_outliers(kept, shape) == {0.3}
    sources, error = derived()
    assert sources == (0.5,) and error <= 0.10
    monkeypatch.setattr(profiles, "OUTLIER_CAPACITY_FACTOR", 1.28)
    sources, error = derived()
    assert sources == (0.3, 0.5) and error > 0.05
    monkeypatch.undo()
    fast = tuple(replace(c, rates_rps=c.rates_rps * 1.5) if c.fraction == 0.3 else c for c in kept)
    assert profiles._capacity_outliers(fast, shape) == set()


def test_a_kv_regime_change_is_derived_with_the_engine_models_load_shape():
    """Qwen2.5-7B on two H100 halves at f = 0.1 (profile synthesized here, 512/128-token requests,
    0.3 and 1.0 measured too, as bench/fraction_accuracy.py does): its KV cache holds a few sequences, so the replica acts as
    that many servers and latency stays nearly flat until the batch is full, while at 0.2 and 0.3 a
    fuller batch slows every iteration. Left out, 0.1 is derived from 0.2 with the load shapes the
    engine model simulates at both shares (fraction_shape.py `excess_change`): within 10% of its measured
    mean latency at 10-80% of its capacity; 0.2's own rise with the load, scaled by the light-load
    ratio, misses by more than 20%."""
    from dataclasses import replace

    from scepsy.models.catalog import catalog
    from scepsy.models.instance.profile import build_profile
    from scepsy.models.catalog.catalog import find_gpu, find_model
    from scepsy.models.performance.fraction_shape import share_model
    from scepsy.models.profiles.request_sources import load_request_source
    from scepsy.models.profiles.synthesize import SynthesisSettings, synthesize

    model, gpu = catalog.model("qwen2.5-7b"), catalog.gpu("H100-SXM")
    frame, _ = synthesize(model, gpu, [2], [0.1, 0.2, 0.3, 1.0], load_request_source("fixed:512,128"),
                          SynthesisSettings(seed=0))
    profile = build_profile(frame, "qwen2.5-7b H100-SXM")
    key = ("H100-SXM", 2)
    truth, near, _, _ = profile.curves[key]
    kept = profile.curves[key][1:]
    shape = share_model(find_model(model.name), find_gpu(key[0]), key[1], kept)
    assert shape is not None
    assert shape.regime(0.1) == "memory" and shape.regime(0.2) == "compute"  # (the fit finds 512 + 128 tokens back)
    got = replace(profile, curves={key: kept}).curve(*key, 0.1, gpu.memory_gib, model.weights_gib, shape)
    assert got is not None and got.derived_from == (0.2,)
    derived_error, borrowed_error = _derived_and_borrowed_errors(truth, near, got, shape.at(0.1)[1] / shape.at(0.2)[1])
    assert derived_error <= 0.10
    assert borrowed_error > 0.20


def test_an_encoders_rise_with_the_load_is_the_engine_models_at_each_share():
    """e5-base-v2 on one RTX A6000 (instances/profiles/e5-base-v2.csv): one iteration finishes 64 of
    its 32-token queries, and how the queue of those lumps grows with the load changes with the share
    (an iteration is work / share + fixed). Left out, f = 0.1 is derived from 0.2 and 0.3 with the
    load shapes the engine model simulates at the shares: within 10% of its measured mean latency at 10-80% of
    its capacity; 0.2's own rise with the load, scaled by the light-load ratio, misses by more than
    15% (its capacity is derived within 1%, so the miss is the rise)."""
    from dataclasses import replace
    from pathlib import Path

    from scepsy.models.instance.profile import load_profile
    from scepsy.models.catalog.catalog import find_gpu, find_model
    from scepsy.models.performance.fraction_shape import share_model

    profile = load_profile(Path(__file__).resolve().parent.parent / "instances" / "profiles" / "e5-base-v2.csv")
    key = ("A6000", 1)
    truth, near = profile.curves[key][:2]
    kept = profile.curves[key][1:]
    shape = share_model(find_model("intfloat/e5-base-v2"), find_gpu(key[0]), key[1], kept)
    assert shape is not None
    got = replace(profile, curves={key: kept}).curve(*key, 0.1, 48.0, 0.21, shape)
    assert got is not None and got.derived_from == (0.2, 0.3)
    assert got.capacity_rps == pytest.approx(truth.capacity_rps, rel=0.01)
    derived_error, borrowed_error = _derived_and_borrowed_errors(truth, near, got, shape.at(0.1)[1] / shape.at(0.2)[1])
    assert derived_error <= 0.10
    assert borrowed_error > 0.15


def test_a_kv_bound_shares_rise_is_scaled_by_the_engine_models_at_each_share():
    """The ensemble's Llama-3.1-8B on one RTX A6000 (instances/profiles/ensemble-llama-3.1-8b.csv):
    at f = 0.4 and 0.5 the KV cache caps the batch, so the replica acts as as many servers as
    sequences fit, a number the share sets: its mean latency rises 1.8x from 5% to 80% of the
    capacity at 0.4 and 2.6x at 0.5 (measured in steady state). Left out, 0.5 is derived from 0.4
    (0.6 is compute-bound) with the excess latency scaled by the engine model's load shapes
    (fraction_shape.py `excess_change`): within 10% at 10-80% of its capacity; 0.4's own rise
    carried over, scaled by the light-load ratio, misses by more than 25%."""
    from dataclasses import replace
    from pathlib import Path

    from scepsy.models.instance.profile import load_profile
    from scepsy.models.catalog.catalog import find_gpu, find_model
    from scepsy.models.performance.fraction_shape import share_model

    profile = load_profile(Path(__file__).resolve().parent.parent / "instances" / "profiles" / "ensemble-llama-3.1-8b.csv")
    key = ("A6000", 1)
    near, truth = profile.curves[key][:2]
    assert (near.fraction, truth.fraction) == (0.4, 0.5)
    kept = tuple(c for c in profile.curves[key] if c.fraction != 0.5)
    shape = share_model(find_model("meta-llama/Llama-3.1-8B-Instruct"), find_gpu(key[0]), key[1], kept)
    assert shape is not None
    assert (shape.regime(0.4), shape.regime(0.5), shape.regime(0.6)) == ("memory", "memory", "compute")
    got = replace(profile, curves={key: kept}).curve(*key, 0.5, 48.0, 14.96, shape)
    assert got is not None and got.derived_from == (0.4,)
    derived_error, borrowed_error = _derived_and_borrowed_errors(truth, near, got, shape.at(0.5)[1] / shape.at(0.4)[1])
    assert derived_error <= 0.10
    assert borrowed_error > 0.25


def _derived_and_borrowed_errors(truth, near, derived, light_ratio: float) -> tuple[float, float]:
    """Worst relative error against the measured curve `truth` at 10-80% of its capacity: of the
    derived curve, and of the neighbour `near`'s own rise with the load scaled by the engine
    model's light-load ratio (the rate axis scaled to the derived capacity)."""
    rates = np.linspace(0.1, 0.8, 15) * truth.capacity_rps
    measured = truth.latency_s(rates)
    borrowed = near.latency_s(rates / derived.capacity_rps * near.capacity_rps) * light_ratio
    return (float(np.max(np.abs(derived.latency_s(rates) / measured - 1))),
            float(np.max(np.abs(borrowed / measured - 1))))
