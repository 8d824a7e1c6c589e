"""The built-in engine model against AIConfigurator (models/performance/engine_comparison.py); the calibration in
models/catalog/catalog.py (CALIBRATION) and models/performance/engine.py (MOE_EFFICIENCY) is the one this grid fits."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("aiconfigurator_core")

from scepsy.models.catalog.catalog import CALIBRATION, model  # noqa: E402
from scepsy.models.performance.engine import MOE_EFFICIENCY  # noqa: E402
from scepsy.models.performance.engine_comparison import (  # noqa: E402
    BY_MODEL_FIT, SPLITS, Calibration, calibrated_errors, compare, default_models, fit_calibration, grid_points,
    training_points,
)
from scepsy.models.catalog.model_config import card_from_config  # noqa: E402

CONFIGS = Path(__file__).parent / "fixtures" / "model_configs"


@pytest.fixture(scope="module")
def b200():
    cards = [model("llama-3.1-8b"), card_from_config(CONFIGS / "Qwen--Qwen3-30B-A3B")]
    comparisons, skipped = compare(grid_points(cards, gpus=("B200",), tps=(1, 2)))
    assert not skipped
    return {c.name: c for c in cards}, comparisons


def test_the_split_is_stratified_and_deterministic(b200):
    _, comparisons = b200
    training = training_points(comparisons)
    assert training == training_points(list(reversed(comparisons)))
    for phase in ("decode", "prefill"):
        group = [c.point for c in comparisons if c.point.phase == phase and c.point.model == "llama-3.1-8b"]
        assert 0 < sum(p in training for p in group) < len(group)


def test_no_calibration_reproduces_the_uncalibrated_times(b200):
    cards, comparisons = b200
    same = calibrated_errors(cards, comparisons, Calibration({}, 1.0))
    assert [c.builtin_s for c in same] == [c.builtin_s for c in comparisons]


def test_the_shipped_calibration_lowers_the_error_on_b200(b200):
    cards, comparisons = b200
    before = sum(abs(c.error) for c in comparisons) / len(comparisons)
    shipped = Calibration({"B200": CALIBRATION["B200"]}, MOE_EFFICIENCY)
    after = calibrated_errors(cards, comparisons, shipped)
    assert sum(abs(c.error) for c in after) / len(after) < 0.8 * before
    fitted = fit_calibration(cards, comparisons, keep=("H100-SXM",))
    assert set(fitted.gpus) <= {"B200"}
    training_error = [sum(abs(c.error) for c in calibrated_errors(cards, comparisons, calibration, training=True))
                      for calibration in (Calibration({}, 1.0), fitted)]
    assert training_error[1] < training_error[0]


@pytest.fixture(scope="module")
def full_grid():
    cards = default_models(CONFIGS)
    comparisons, _ = compare(grid_points(cards))
    return {c.name: c for c in cards}, comparisons


def _held_out_groups(comparisons) -> dict[tuple[str, str], float]:
    groups: dict[tuple[str, str], list[float]] = {}
    for c in comparisons:
        groups.setdefault((c.point.gpu, c.point.phase), []).append(abs(c.error))
    return {k: sum(v) / len(v) for k, v in groups.items()}


def test_the_shipped_calibration_is_the_fit_on_the_fit_half(full_grid):
    cards, comparisons = full_grid
    fitted = fit_calibration(cards, comparisons, keep=("H100-SXM",))
    assert fitted.moe_efficiency == MOE_EFFICIENCY
    assert {name: dict(fields) for name, fields in fitted.gpus.items()} == CALIBRATION


def test_held_out_errors_stay_within_the_stated_bounds(full_grid):
    """docs/engine-model.md: every (GPU, phase) group of the held-out half within 15% mean absolute
    error (measured: largest H100-SXM decode 12.4%, B200 prefill 9.8% with the large-message
    all-reduce); all held-out points 9.0% (bound 10%)."""
    cards, comparisons = full_grid
    shipped = Calibration(CALIBRATION, MOE_EFFICIENCY)
    held_out = calibrated_errors(cards, comparisons, shipped, training=False)
    before = _held_out_groups([c for c in comparisons if c.point not in training_points(comparisons)])
    after = _held_out_groups(held_out)
    for key, error in after.items():
        assert error <= 0.15, (key, error)
    assert sum(abs(c.error) for c in held_out) / len(held_out) <= 0.10
    assert after[("B200", "prefill")] < 0.6 * before[("B200", "prefill")]  # the large-message all-reduce
    assert after[("L40S", "prefill")] < 0.2 * before[("L40S", "prefill")]  # the host path of a 4-GPU ring


def test_the_splits_divide_the_grid_as_documented(full_grid):
    _, comparisons = full_grid
    every = {c.point for c in comparisons}
    halves = {split: training_points(comparisons, split) for split in SPLITS}
    assert halves["complement"] == every - halves["stated"]
    assert {p.model for p in every - halves["by-model"]}.isdisjoint(BY_MODEL_FIT)
    held_prefills = {p for p in every - halves["tp-first"] if p.phase == "prefill"}
    assert all(p.length == 2048 for p in held_prefills)  # sorted by TP first: no long prefill to fit on
    assert any(p.length == 2048 and p.phase == "prefill" for p in halves["stated"])
    with pytest.raises(ValueError):
        training_points(comparisons, "random")


@pytest.mark.parametrize("split", SPLITS[1:])
def test_the_held_out_bound_holds_on_every_split(full_grid, split):
    """The same fit on the other fixed splits (docs/engine-model.md, "Is the split lucky?"): every
    held-out (GPU, phase) group within 15% (measured, B200 prefill: complement 12.4%, tp-first
    12.1%, by-model 5.7%; largest group H100-SXM decode, 12.5-13.6%), all held-out points within 10.5%."""
    cards, comparisons = full_grid
    calibration = fit_calibration(cards, comparisons, keep=("H100-SXM",), split=split)
    held_out = calibrated_errors(cards, comparisons, calibration, training=False, split=split)
    for key, error in _held_out_groups(held_out).items():
        assert error <= 0.15, (split, key, error)
    assert sum(abs(c.error) for c in held_out) / len(held_out) <= 0.105


def test_the_fitted_bulk_all_reduce_matches_aiconfigurators_measured_table():
    """Not fitted to it: AIConfigurator's measured vLLM all-reduce on B200
    (aiconfigurator-core 0.12.0, systems/data/b200_sxm/comm/vllm/0.24.0/custom_allreduce_perf.parquet,
    CUDA-graph rows) at the messages of a 2,048-token prefill (16.8 MB for hidden 4096, 33.6 MB for
    8192) within 15% on 2 and 4 GPUs (measured: +3%, -4%, +5%, -10%); the single algorithm fitted
    before (4 us, link scale 0.35) was 40-95% slow there."""
    from scepsy.models.catalog.catalog import gpu
    from scepsy.models.performance.aiconfigurator import measured_allreduce_ms
    from scepsy.models.performance.engine import Engine

    measured = measured_allreduce_ms("b200_sxm")
    for tp in (2, 4):
        engine = Engine(model("llama-3.1-8b"), gpu("B200"), tp)
        for elements in (2048 * 4096, 2048 * 8192):
            ours_ms = engine._allreduce_s(2 * elements) * 1e3
            assert abs(ours_ms / measured[tp, elements] - 1) < 0.15, (tp, elements, ours_ms, measured[tp, elements])


@pytest.mark.parametrize("gpu_name", ["A100-80G", "H200", "L40S"])
def test_elementwise_kernels_match_aiconfigurators_measured_ones(gpu_name):
    """The elementwise term (norms with residual adds, gate activation) against AIConfigurator's
    measured add_norm and act_gate kernels of a 2,048-token Llama-3.1-8B prefill, within 15%
    (measured: -4.5% A100, -10% H200, -8.8% L40S; no constant of it is fitted)."""
    from scepsy.models.catalog.catalog import gpu
    from scepsy.models.performance.aiconfigurator import AiconfiguratorTimer
    from scepsy.models.performance.engine import Engine

    card = model("llama-3.1-8b")
    timer = AiconfiguratorTimer(card, gpu(gpu_name))
    context, _ = timer._handle.run_static_per_op(batch_size=1, isl=2048, osl=2)
    measured_ms = sum(ms for name, ms, _, _ in context if "add_norm" in name or "act_gate" in name)
    point = grid_points([card], gpus=(gpu_name,), tps=(1,))[-1][1]
    assert point.phase == "prefill" and point.length == 2048
    ours_ms = Engine(card, gpu(gpu_name)).breakdown(point.work).elementwise_s * 1e3
    assert abs(ours_ms / measured_ms - 1) < 0.15, (ours_ms, measured_ms)
