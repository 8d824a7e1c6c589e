"""The exact placeability check against a naive exhaustive search, and the independent checker."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from scepsy.models.instance.allocation import Allocation, LlmAllocation, Placement, ReplicaPlacement, Shard
from support.synthetic import synthetic_cluster
from scepsy.models.instance.placement_check import validate_placement
from scepsy.placement.feasibility.placeability import check_placement, exact_placement, greedy_placement


def naive_placeable(cluster, allocation) -> bool:
    """Depth-first over replicas: every choice of tp distinct GPUs inside one domain."""
    free = {(n.name, g): cluster.free_units(n.name, g) for n in cluster.nodes for g in range(n.gpus)}
    replicas = sorted(((c.tp, c.share) for c in allocation.llms for _ in range(c.replicas)), reverse=True)
    domains = cluster.domains()

    def place(i: int) -> bool:
        if i == len(replicas):
            return True
        tp, share = replicas[i]
        for domain in domains:
            for gpus in itertools.combinations(domain.gpus, tp):
                keys = [(domain.node, g) for g in gpus]
                if all(free[k] >= share for k in keys):
                    for k in keys:
                        free[k] -= share
                    ok = place(i + 1)
                    for k in keys:
                        free[k] += share
                    if ok:
                        return True
        return False

    return place(0)


def random_case(seed: int):
    rng = np.random.default_rng(seed)
    domains = [[[0, 1], [2, 3]], [[0, 1, 2, 3]], [], [[0, 1, 2]]][seed % 4]
    cluster = synthetic_cluster(int(rng.integers(1, 3)), 4, domains, fractions_per_gpu=4)
    largest = max((len(d) for d in domains), default=1)
    choices = []
    for m in range(int(rng.integers(1, 4))):
        tp = int(rng.choice([t for t in (1, 2, 4) if t <= largest]))
        choices.append(LlmAllocation(f"m{m}", "G", tp, int(rng.integers(1, 5)), int(rng.integers(1, 4))))
    return cluster, Allocation(4, tuple(choices))


@pytest.mark.parametrize("seed", range(150))
def test_exact_check_agrees_with_naive_search(seed):
    cluster, allocation = random_case(seed)
    expected = naive_placeable(cluster, allocation)
    result = exact_placement(cluster, allocation)
    assert result.proven
    assert result.placeable == expected
    if result.placeable:
        assert result.placement is not None
        assert validate_placement(cluster, allocation, result.placement) == []
    greedy = greedy_placement(cluster, allocation)
    if greedy is not None:  # greedy may give up, but never returns an invalid placement
        assert expected and validate_placement(cluster, allocation, greedy) == []
    assert check_placement(cluster, allocation).placeable == expected


def test_tp_needs_distinct_gpus_of_one_domain():
    cluster = synthetic_cluster(1, 4, [[0, 1], [2, 3]], fractions_per_gpu=10)
    # three tp-2 replicas of half a GPU fit (two on one pair, one on the other) ...
    assert check_placement(cluster, Allocation(10, (LlmAllocation("a", "G", 2, 5, 3),))).placeable
    # ... but a tp-4 replica does not: no domain has four GPUs
    assert not check_placement(cluster, Allocation(10, (LlmAllocation("a", "G", 4, 1, 1),))).placeable


def test_checker_reports_every_kind_of_problem():
    cluster = synthetic_cluster(1, 4, [[0, 1], [2, 3]], fractions_per_gpu=10)
    allocation = Allocation(10, (LlmAllocation("a", "G", 2, 6, 2),))
    bad = Placement(10, (
        ReplicaPlacement("a", 0, "node-0", (Shard(1, 6), Shard(2, 6))),  # spans two domains
        ReplicaPlacement("a", 1, "node-0", (Shard(1, 6), Shard(1, 6))),  # same GPU twice, GPU 1 overfull
    ))
    problems = validate_placement(cluster, allocation, bad)
    assert any("spans NVLink domains" in p for p in problems)
    assert any("distinct GPUs" in p for p in problems)
    assert any("holds 18 units" in p for p in problems)
