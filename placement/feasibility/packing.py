"""Packing arithmetic: what fits on the GPUs of NVLink domains.

A replica of shape (gpu_type, tp, share) is tp shards of `share` units (1/F GPU each) on tp distinct
GPUs of one NVLink domain of that type. The planner's capacity rows, its option bounds, the count
model (placement/feasibility/counts.py), the placeability check and the placement model all rest
on the arithmetic here: `fit_in_domain` is exact for one domain (fill GPUs in blocks, deal replicas
round robin), and the bin-packing weights give valid inequalities for many.
"""

from __future__ import annotations

from collections import Counter

from scepsy.models.instance.allocation import Allocation
from scepsy.models.instance.instance import Cluster

Shape = tuple[str, int, int]  # (gpu_type, tp, share units per shard)


def shape_counts(allocation: Allocation) -> dict[Shape, int]:
    """R_k: replicas of each shape in an allocation."""
    counts: dict[Shape, int] = {}
    for choice in allocation.llms:
        counts[choice.shape] = counts.get(choice.shape, 0) + choice.replicas
    return counts


def free_by_gpu(cluster: Cluster) -> dict[tuple[str, int], int]:
    """(node, gpu) -> free units."""
    return {(n.name, g): cluster.free_units(n.name, g) for n in cluster.nodes for g in range(n.gpus)}


def fit_in_domain(slots: list[int], tp: int) -> int:
    """Most replicas of tp shards on distinct GPUs of a domain whose GPUs hold `slots` shards each:
    n fit iff sum_i min(slots_i, n) >= n tp (fill GPUs in blocks, deal replicas round-robin)."""
    n = sum(slots) // tp
    while n > 0 and sum(min(s, n) for s in slots) < n * tp:
        n -= 1
    return n


DomainKinds = list[tuple[str, tuple[int, ...], int]]


def domain_kinds(cluster: Cluster) -> DomainKinds:
    """The NVLink domains grouped by (gpu_type, free units of each GPU), with their counts: a
    cluster of a million GPUs has a handful of kinds, so counting per kind keeps option building
    independent of the cluster's size."""
    return [(gpu_type, free, count) for (gpu_type, free), count in sorted(cluster.domain_counts.items())]


def max_replicas(cluster: Cluster, gpu_type: str, tp: int, share: int, kinds: DomainKinds | None = None) -> int:
    """Most replicas of one shape that fit the cluster alone (exact per NVLink domain); `kinds`:
    domain_kinds(cluster), when the caller asks for many shapes."""
    return sum(
        fit_in_domain([units // share for units in free], tp) * count
        for kind_type, free, count in (domain_kinds(cluster) if kinds is None else kinds)
        if kind_type == gpu_type and len(free) >= tp
    )


def free_in_domains(cluster: Cluster, gpu_type: str, tp: int) -> Counter[int]:
    """Free units -> GPUs of `gpu_type` with that many free, over the NVLink domains of size >= tp
    (counted per domain kind: linear in the kinds, not in the GPUs)."""
    free: Counter[int] = Counter()
    for kind_type, units, count in domain_kinds(cluster):
        if kind_type == gpu_type and len(units) >= tp:
            for u in units:
                free[u] += count
    return free


def packing_weights(f: int) -> list[tuple[int, ...]]:
    """Weight functions w(s), s = 0..F, of the bin-packing inequalities (dual feasible functions):
    w(s) = [s >= b] + (floor(F/b) - 1) [s >= a] for a + b > F, a >= b. A GPU with a shard >= a has
    room for no other shard >= b, so no GPU carries more than floor(F/b) weight."""
    weights = set()
    for b in range(1, f + 1):
        for a in range(max(b, f - b + 1), f + 1):
            weights.add(tuple(int(s >= b) + (f // b - 1) * int(s >= a) for s in range(f + 1)))
    return sorted(weights)


def gpu_weight_capacity(weight: tuple[int, ...], free: int) -> int:
    """W(c): the most weight of shards that fit in c free units (unbounded knapsack, c <= F)."""
    best = [0] * (free + 1)
    for c in range(1, free + 1):
        best[c] = max([best[c - 1]] + [best[c - s] + weight[s] for s in range(1, c + 1)])
    return best[free]
