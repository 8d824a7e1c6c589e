"""Capacity claims in the workflow simulator (planner/studies/claims.py; bench/capacity_holds.py
prints the table for every instance): at least 97% of the offered requests complete at the claimed
load, and up to 90% of it the mean latency is within 15% of the prediction. Seeded simulations of
200 s or longer (the window is sized to the predicted latency), so the outcome does not depend on
the machine."""

from __future__ import annotations

import pytest

from scepsy.models.instance.instance import load_instance
from scepsy.models.performance.alp import predict
from scepsy.planner.studies.claims import WARMUP_LATENCIES, WINDOW_LATENCIES, check, claims, measured_window

from conftest import INSTANCES

SMALLER = ("rag-4xa6000", "ensemble-4xa6000")


@pytest.mark.slow
@pytest.mark.parametrize("name", SMALLER)
def test_every_claim_of_the_smaller_instances_holds_at_and_below_its_capacity(name):
    """The max_throughput plan, the reported capacity and the min_gpus plan, at 90% and 100% of
    their load, with three seeds."""
    instance = load_instance(INSTANCES / f"{name}.yaml")
    found = claims(instance, name)
    assert {c.kind for c in found} == {"max_throughput", "reported", "min_gpus"}  # no prices: no min_cost
    for claim in found:
        for load in (0.9, 1.0):
            for seed in (0, 1, 2):
                for checked in check(instance, claim, load, seed):
                    assert checked.holds, checked.row()


@pytest.mark.slow
def test_the_smallest_beam_instances_max_throughput_claim_holds():
    """The profiles' capacities are confirmed over long windows: the claimed load completes."""
    instance = load_instance(INSTANCES / "beam-4xa6000.yaml")
    (claim,) = claims(instance, "beam-4xa6000", kinds=("max_throughput",))
    (checked,) = check(instance, claim, 1.0, 0)
    assert checked.holds, checked.row()


def test_the_measured_window_is_the_steady_state_of_the_claims_load():
    """Light requests keep the plain window (a tenth of the duration of warm-up); slow ones open it
    WARMUP_LATENCIES mean latencies after the empty start and keep it WINDOW_LATENCIES long."""
    instance = load_instance(INSTANCES / "rag-4xa6000.yaml")
    (claim,) = claims(instance, "rag-4xa6000", kinds=("min_gpus",))
    prediction = predict(instance, claim.allocation)
    latency_s = prediction.workflows[0].latency_s
    assert latency_s > 5.0  # the generator's long completions
    settings = measured_window(prediction, 200.0, 3)
    assert settings.warmup_s == pytest.approx(WARMUP_LATENCIES * latency_s)
    assert settings.duration_s - settings.warmup_s == pytest.approx(WINDOW_LATENCIES * latency_s)
    assert settings.seed == 3
    light = measured_window(prediction, 100_000.0, 0)
    assert (light.duration_s, light.warmup_s) == (100_000.0, 10_000.0)
