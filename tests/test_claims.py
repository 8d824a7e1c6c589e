"""Capacity claims in the workflow simulator (planner/studies/claims.py; bench/capacity_holds.py
prints the table for every instance): at least 97% of the offered requests complete at the claimed
load, and up to 90% of it the mean latency is within 15% of the prediction. Seeded simulations of
200 s or longer (the window is sized to the predicted latency and the rate:
planner/studies/claims.py `measured_window`), so the outcome does not depend on the machine."""

from __future__ import annotations

import pytest

from scepsy.models.instance.instance import load_instance
from scepsy.models.performance.alp import predict
from scepsy.planner.studies.claims import (
    LATENCY_LOAD,
    LATENCY_TOLERANCE,
    WARMUP_LATENCIES,
    WINDOW_LATENCIES,
    WHATIF_POINTS,
    WINDOW_REQUESTS,
    check,
    check_recovery,
    claims,
    measured_window,
    whatif_capacity,
)
from scepsy.planner.allocation.search import PlanSettings
from scepsy.planner.studies.whatif import run_grid

from conftest import INSTANCES

SMALLER = ("rag-4xa6000", "beam-4xa6000", "ensemble-4xa6000")
# Beam search's mean latency is over-predicted by more than the tolerance at 90% of some claims
# (docs/evidence.md section 9: its verifier's profile replays each traced call after the prefix it
# extends, while in the workflow the verifier's identical sibling prompts also hit each other's
# KV). Its claims are held to their capacity and to the promise side of the latency (never above
# the prediction by more than the tolerance); that the gap stays is asserted, so closing it
# updates this set and the docs.
OVER_PREDICTED = {"beam-4xa6000"}
SEEDS = (0, 1)  # bench/capacity_holds.py --seeds 0,1,2 gives docs/evidence.md its third


@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.parametrize("name, seed", [(name, seed) for name in SMALLER for seed in SEEDS])
def test_every_claim_of_the_smaller_instances_holds_at_and_below_its_capacity(name, seed):
    """The max_throughput plan, the reported capacity, the min_gpus plan and the what-if study's
    capacity, at 90% and 100% of their load, with two seeds (in the exhaustive run)."""
    instance = load_instance(INSTANCES / f"{name}.yaml")
    found = claims(instance, name)
    assert {c.kind for c in found} == {"max_throughput", "reported", "min_gpus", "whatif"}  # no prices: no min_cost
    # claims of one allocation at the same rates are one seeded simulation (rag: reported and whatif): checked once
    distinct = {(c.allocation, tuple(sorted(c.rates_rps.items()))): c for c in reversed(found)}
    over = []
    for claim in distinct.values():
        for load in (0.9, 1.0):
            for checked in check(instance, claim, load, seed):
                if name not in OVER_PREDICTED:
                    assert checked.holds, checked.row()
                    continue
                assert checked.sustained, checked.row()
                if checked.load <= LATENCY_LOAD + 1e-9:  # the latency promised is never exceeded by more than the tolerance
                    assert checked.latency_error >= -LATENCY_TOLERANCE, checked.row()
                    over.append(checked.latency_error > LATENCY_TOLERANCE)
    assert name not in OVER_PREDICTED or any(over), (
        f"{name}'s latency is predicted within {LATENCY_TOLERANCE:.0%} now: drop it from OVER_PREDICTED and the docs' note")


@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.parametrize("name", SMALLER)
def test_every_claim_recovers_from_the_recovery_limit_it_prints(name):
    """Each claim's allocation at the recovery limit it prints, after two minutes at 150% of its
    `max_throughput_rps`: served and at its steady latency again within five minutes
    (tests/test_bursts.py holds the same for every shipped instance's own plan)."""
    instance = load_instance(INSTANCES / f"{name}.yaml")
    for claim in claims(instance, name):
        for result in check_recovery(instance, claim):
            assert result.recovered and result.recovery_s is not None, (claim.kind, result)


@pytest.mark.parametrize("name", ["beam-4xa6000", "combined-8xh100"])
def test_the_whatif_claim_is_the_capacity_the_study_prints(name):
    """The whatif claim loads the study's plan at its middle rate to the capacity the what-if table
    prints for that point (one workflow: `workflow_max_throughput_rps`; several: scaled together
    until the first reaches its limit), above the rate it was planned for and below the
    max_throughput plan's."""
    instance = load_instance(INSTANCES / f"{name}.yaml")
    allocation, rates = whatif_capacity(instance)
    (top,) = claims(instance, name, kinds=("max_throughput",))
    top_rps = sum(top.rates_rps.values())
    planned_rps = top_rps * (WHATIF_POINTS // 2) / WHATIF_POINTS
    frame = run_grid(instance, [planned_rps], [sum(n.gpus for n in instance.cluster.nodes)], PlanSettings())
    per_gpu = instance.cluster.fractions_per_gpu
    rows = zip(frame["llm"], frame["gpu_type"], frame["tp"], frame["fraction"], frame["replicas"])
    assert {(llm, gpu_type, tp, round(float(fraction) * per_gpu), replicas) for llm, gpu_type, tp, fraction, replicas in rows} == {
        (c.llm, c.gpu_type, c.tp, c.share, c.replicas) for c in allocation.llms}
    claimed = predict(instance.with_arrival_rates(rates), allocation)
    assert max(w.arrival_rate_rps / w.max_throughput_rps for w in claimed.workflows) == pytest.approx(1.0)
    if len(rates) == 1:
        assert sum(rates.values()) == pytest.approx(frame["workflow_max_throughput_rps"].iloc[0])
    assert planned_rps < sum(rates.values()) < top_rps * (1 + 1e-9)


@pytest.mark.parametrize("name, kind", [("ensemble-4xa6000", "max_throughput"), ("rag-4xa6000", "min_gpus")])
def test_the_measured_window_is_the_steady_state_of_the_claims_load(name, kind):
    """Slow requests open the window WARMUP_LATENCIES mean latencies after the empty start and keep
    it WINDOW_LATENCIES long (the judge ensemble's 22 s requests at 13 req/s), a light rate keeps
    it open for WINDOW_REQUESTS arrivals (RAG's 8 req/s); a long duration asked for is kept (a
    tenth of it warm-up)."""
    instance = load_instance(INSTANCES / f"{name}.yaml")
    (claim,) = claims(instance, name, kinds=(kind,))
    prediction = predict(instance.with_arrival_rates(claim.rates_rps), claim.allocation)
    (workflow,) = prediction.workflows
    latency_s, rate_rps = workflow.latency_s, workflow.arrival_rate_rps
    assert latency_s > 5.0  # long completions
    settings = measured_window(prediction, 200.0, 3)
    assert settings.warmup_s is not None and settings.warmup_s == pytest.approx(WARMUP_LATENCIES * latency_s)
    window_s = settings.duration_s - settings.warmup_s
    expected = {"ensemble-4xa6000": WINDOW_LATENCIES * latency_s, "rag-4xa6000": WINDOW_REQUESTS / rate_rps}[name]
    assert window_s == pytest.approx(expected)
    assert window_s == pytest.approx(max(WINDOW_LATENCIES * latency_s, WINDOW_REQUESTS / rate_rps, 180.0))
    assert settings.seed == 3
    long = measured_window(prediction, 100_000.0, 0)
    assert (long.duration_s, long.warmup_s) == (100_000.0, 10_000.0)
