"""Packing arithmetic and the replica count model: what fits on the GPUs of NVLink domains.

A replica of shape (gpu_type, tp, share) is tp shards of `share` units (1/F GPU each) on tp distinct
GPUs of one NVLink domain of that type. The planner's capacity rows, its exact placement counts,
the placeability check and the placement model all rest on the arithmetic here.

The count model (docs/placement.md) works on counts instead of individual replicas:

    n[j, k]  replicas of shape k = (gpu_type, tp, share) in NVLink domain j      (integer >= 0)
    c[i, k]  shards of shape k on GPU i                                         (integer >= 0)

    sum_j n[j, k]            = R_k                  every replica placed
    sum_{i in j} c[i, k]     = tp_k * n[j, k]       a domain holds the shards of its replicas
    c[i, k]                 <= n[j(i), k]           at most one shard of a replica per GPU
    sum_k share_k * c[i, k] <= free_i               GPU capacity in units of 1/F

The counts are exact: given c[i, k] <= n, list GPU i c[i, k] times in GPU order and deal the n
replicas round-robin (replica r takes positions r, r + n, ...); a GPU's block is at most n long,
so each replica's shards land on distinct GPUs. `CountModel` holds the index sets (which domains
and GPUs may hold which shape); each solver (CP-SAT, MILP) states the constraints over them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from scepsy.models.instance.allocation import Allocation
from scepsy.models.instance.instance import Cluster, Domain

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


@dataclass(frozen=True)
class CountModel:
    """Index sets of the count model (module docstring) for some shapes on a cluster."""

    domains: list[Domain]
    shapes: list[Shape]
    eligible: dict[Shape, list[int]]  # k -> domains j of its type and at least its size
    gpus: dict[tuple[int, Shape], list[int]]  # (j, k) -> GPUs of j with room for a shard of k
    free: dict[tuple[str, int], int]  # (node, gpu) -> free units

    def holds(self, j: int, g: int, k: Shape) -> bool:
        return (j, k) in self.gpus and g in self.gpus[(j, k)]


def count_model(cluster: Cluster, shapes: list[Shape]) -> CountModel:
    domains = cluster.domains()
    free = free_by_gpu(cluster)
    eligible = {k: [j for j, d in enumerate(domains) if d.gpu_type == k[0] and d.size >= k[1]] for k in shapes}
    gpus = {
        (j, k): [g for g in domains[j].gpus if free[(domains[j].node, g)] >= k[2]]
        for k in shapes
        for j in eligible[k]
    }
    return CountModel(domains, list(shapes), eligible, gpus, free)
