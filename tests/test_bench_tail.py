"""bench/tail_accuracy.py compares two tail estimators; the `sum` one must not read the
latency_ratios the shipped instances carry (else both columns are the ratio estimator)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scepsy.models.instance.instance import load_instance

from conftest import load_script

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    return load_script("tail_accuracy", ROOT / "bench" / "tail_accuracy.py")


def test_the_sum_estimator_reads_per_call_percentiles_and_the_ratio_one_the_traced_ratios():
    instance = load_instance(ROOT / "instances" / "beam-4xa6000.yaml")
    (workflow,) = instance.workflows
    assert workflow.latency_ratios  # shipped: what `sum` must not see
    traced = {"beam": {"p50": 0.9, "p90": 1.5, "p99": 2.5}}
    by_sum, by_ratio = _bench().estimator_instances(instance, traced)
    for q in ("p90", "p99"):
        summed, ratioed = replace(by_sum, latency_metric=q), replace(by_ratio, latency_metric=q)
        assert summed.call_latency_metric == q and summed.latency_factor(summed.workflows[0]) == 1.0
        assert ratioed.call_latency_metric == "mean"
        assert ratioed.latency_factor(ratioed.workflows[0]) == pytest.approx(traced["beam"][q])
