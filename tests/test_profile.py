"""Profile semantics (docs/model.md, "Profiles"): stable rows, capacity, interpolation, clamping,
fraction scaling, and the validation of profile files."""

from __future__ import annotations

import pandas as pd
import pytest

from scepsy.models.errors import InputError
from scepsy.models.instance.profile import PROFILE_COLUMNS, build_profile, load_profile, read_profile_frame

from conftest import profile_rows


@pytest.fixture
def profile():
    return build_profile(profile_rows(light_s=1.0, capacity_rps=20.0), "test")


def test_capacity_is_largest_stable_rate(profile):
    curve = profile.curve("A6000", 1, 1.0, memory_gib=48, weights_gib=2.5)
    # rows at 5, 10, 20 rps are stable; 30 rps delivers 20 < 0.95 * 30 and is dropped
    assert curve.capacity_rps == pytest.approx(20.0)
    assert list(curve.rates_rps) == [5.0, 10.0, 20.0]


def test_latency_is_piecewise_linear_and_clamped_below(profile):
    curve = profile.curve("A6000", 1, 1.0, memory_gib=48, weights_gib=2.5)
    assert curve.latency_s(7.5) == pytest.approx(1.375)  # halfway between 1.25 (5 rps) and 1.5 (10 rps)
    assert curve.latency_s(1.0) == pytest.approx(1.25)  # clamped to the first point
    assert curve.latency_s(20.0, "p99") == pytest.approx(4.0)


def test_unprofiled_fraction_between_two_measured_ones(profile):
    # f = 0.7 between 0.5 and 1.0: capacity linear in the share (10 -> 20 rps: 14), latency at
    # equal utilisation linear in 1/share (weight on 1.0: (1/0.5 - 1/0.7)/(1/0.5 - 1/1.0) = 0.5714)
    curve = profile.curve("A6000", 1, 0.7, memory_gib=48, weights_gib=2.5)
    assert curve.derived_from == (0.5, 1.0) and not curve.measured
    assert curve.capacity_rps == pytest.approx(14.0)
    weight = (2 - 1 / 0.7) / 1.0
    # both measured curves are 1 + u at utilisation u (light latency 1 s for every fraction here)
    assert curve.latency_s(0.5 * 14.0) == pytest.approx(1.5)
    assert curve.latency_s(14.0, "p99") == pytest.approx(4.0)
    assert 0 < weight < 1


def test_smaller_share_is_never_faster(profile):
    # a profile whose smaller share is much slower at light load
    frame = profile_rows(fractions=(0.5, 1.0))
    frame.loc[frame["fraction"] == 0.5, "latency_mean"] *= 2
    slow_half = build_profile(frame, "slow half")
    half = slow_half.curve("A6000", 1, 0.5, 48, 2.5)
    whole = slow_half.curve("A6000", 1, 1.0, 48, 2.5)
    assert half is not None and whole is not None
    for f in (0.3, 0.6, 0.7, 0.9):
        curve = slow_half.curve("A6000", 1, f, 48, 2.5)
        assert curve is not None
        rates = [0.1 * k * curve.capacity_rps for k in range(1, 11)]
        assert all(curve.latency_s(r) >= whole.latency_s(r) - 1e-12 for r in rates)
        if f > 0.5:
            assert curve.capacity_rps >= half.capacity_rps
            assert all(curve.latency_s(r) <= half.latency_s(r) + 1e-12 for r in rates if r <= half.capacity_rps)


def test_kv_memory_binds_below_the_smallest_measured_fraction(profile):
    # f = 0.3 below 0.5: capacity 10 rps x min(0.6, KV ratio (14.4-0.5)/(24-0.5) = 0.5915)
    curve = profile.curve("A6000", 1, 0.3, memory_gib=48, weights_gib=0.5)
    assert curve.derived_from == (0.5, 1.0)
    assert curve.capacity_rps == pytest.approx(10.0 * 13.9 / 23.5)


def test_fraction_above_all_profiles_is_no_faster(profile):
    only_half = build_profile(profile_rows(fractions=(0.5,)), "half")
    curve = only_half.curve("A6000", 1, 0.8, memory_gib=48, weights_gib=2.5)
    assert curve is not None
    assert curve.derived_from == (0.5,)
    # above the only measured share the compute ratio 1.6 (KV ratio 35.9/21.5 = 1.67) scales the
    # capacity; without a second share no speed-up at equal utilisation is assumed
    assert curve.capacity_rps == pytest.approx(5.0 * 1.6)
    assert curve.latency_s(4.0) == pytest.approx(1.5)


def test_missing_configuration_is_unavailable(profile):
    assert profile.curve("A6000", 4, 1.0, memory_gib=48, weights_gib=2.5) is None
    assert profile.curve("H100", 1, 1.0, memory_gib=80, weights_gib=2.5) is None


def test_repeated_rates_are_averaged():
    frame = pd.concat([profile_rows(tps=(1,), fractions=(1.0,))] * 2)
    frame.iloc[0, list(frame.columns).index("latency_mean")] = 2.25  # 1.25 and 2.25 average to 1.75
    curve = build_profile(frame, "dup").curve("A6000", 1, 1.0, 48, 2.5)
    assert curve is not None
    assert list(curve.rates_rps) == [2.5, 5.0, 10.0]
    assert curve.latency_s(2.5) == pytest.approx(1.75)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda f: f.drop(columns=["latency_p90"]), "column latency_p90"),
        (lambda f: f.assign(arrival_rate=f["arrival_rate"].astype(object).where(f.index != 2, "fast")), "row 4, column arrival_rate"),
        (lambda f: f.assign(throughput=-f["throughput"]), "column throughput"),
        (lambda f: f.assign(tp=0), "column tp"),
        (lambda f: f.assign(fraction=1.5), "column fraction"),
        (lambda f: f.iloc[0:0], None),
    ],
)
def test_bad_profile_files_name_the_column(tmp_path, mutate, field):
    path = tmp_path / "p.csv"
    mutate(profile_rows()).to_csv(path, index=False)
    with pytest.raises(InputError) as err:
        read_profile_frame(path)
    assert err.value.file == str(path)
    if field:
        assert field in err.value.field
    assert "fix:" in err.value.line()


def test_header_order_is_free_and_extra_columns_are_ignored(tmp_path):
    frame = profile_rows()
    frame["notes"] = "x"
    path = tmp_path / "p.csv"
    frame[list(reversed(frame.columns))].to_csv(path, index=False)
    profile = load_profile(path)
    assert profile.configurations() == [("A6000", 1), ("A6000", 2)]
    assert set(PROFILE_COLUMNS) <= set(pd.read_csv(path).columns)
