"""Capacity claims in the workflow simulator (planner/studies/claims.py; bench/capacity_holds.py
prints the table for every instance): at least 97% of the offered requests complete at the claimed
load, and up to 90% of it the mean latency is within 15% of the prediction. Seeded simulations of
200 s, so the outcome does not depend on the machine."""

from __future__ import annotations

import pytest

from scepsy.models.instance.instance import load_instance
from scepsy.planner.studies.claims import check, claims

from conftest import INSTANCES


@pytest.mark.slow
def test_the_smallest_rag_instances_claims_hold_at_and_below_its_capacity():
    instance = load_instance(INSTANCES / "rag-4xa6000.yaml")
    found = claims(instance, "rag-4xa6000", kinds=("max_throughput", "reported"))
    assert [c.kind for c in found] == ["max_throughput", "reported"]
    for claim in found:
        for load in (0.9, 1.0):
            for seed in (0, 1):
                for checked in check(instance, claim, load, seed):
                    assert checked.holds, checked.row()


@pytest.mark.slow
def test_the_smallest_beam_instances_max_throughput_claim_holds():
    """The profiles' capacities are confirmed over long windows: the claimed load completes."""
    instance = load_instance(INSTANCES / "beam-4xa6000.yaml")
    (claim,) = claims(instance, "beam-4xa6000", kinds=("max_throughput",))
    (checked,) = check(instance, claim, 1.0, 0)
    assert checked.holds, checked.row()
