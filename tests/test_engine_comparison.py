"""The built-in engine model against AIConfigurator (models/performance/engine_comparison.py); the calibration in
models/catalog/catalog.py (CALIBRATION) and models/performance/engine.py (MOE_EFFICIENCY) is the one this grid fits."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("aiconfigurator_core")

from scepsy.models.catalog.catalog import CALIBRATION, model  # noqa: E402
from scepsy.models.performance.engine import MOE_EFFICIENCY  # noqa: E402
from scepsy.models.performance.engine_comparison import (  # noqa: E402
    Calibration, calibrated_errors, compare, fit_calibration, grid_points, training_points,
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
    assert set(fitted.scales) <= {"B200"}
    training_error = [sum(abs(c.error) for c in calibrated_errors(cards, comparisons, calibration, training=True))
                      for calibration in (Calibration({}, 1.0), fitted)]
    assert training_error[1] < training_error[0]
