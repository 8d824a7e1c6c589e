"""The placement objective, evaluated the same way for every method, and replica numbering.

    free_domains   NVLink domains whose GPUs are all free whole GPUs (no reservation, no shard)
    free_gpus      GPUs with no reservation and no shard
    shared_gpus    GPUs holding shards of two or more different LLMs
    moved_shards   (re-planning) placement/current.py
    occupied_units (re-planning) placement/current.py: units of new replicas beyond what is free now

Lexicographic order (PlacementObjective.key, smaller is better): fewest moved shards, then fewest
occupied units (both re-planning only), most free domains, most free GPUs, fewest shared GPUs. Reservations count as taken: a
domain or GPU with a reservation is never free, whatever the placement does.
"""

from __future__ import annotations

from dataclasses import dataclass

from scepsy.models.instance.allocation import Allocation, Placement, ReplicaPlacement, Shard
from scepsy.models.instance.instance import Cluster
from scepsy.models.plan.fragmentation import domain_counts_after
from scepsy.models.plan.plan import PlacementObjective

from scepsy.placement.current import free_now, keep_candidates, movable_replicas


def evaluate(cluster: Cluster, allocation: Allocation, placement: Placement, current: Placement | None = None) -> PlacementObjective:
    """The objective of a (valid) placement; re-planning terms when `current` is given."""
    f = cluster.fractions_per_gpu
    taken: dict[tuple[str, int], set[str]] = {}
    for rp in placement.replicas:
        for shard in rp.shards:
            taken.setdefault((rp.node, shard.gpu), set()).add(rp.llm)
    # a GPU is free when all its units are: no reservation and no shard (shards have units)
    kinds = domain_counts_after(cluster, placement)
    free_gpus = sum(sum(u == f for u in free) * count for (_, free), count in kinds.items())
    free_domains = sum(count for (_, free), count in kinds.items() if all(u == f for u in free))
    shared = sum(len(llms) > 1 for llms in taken.values())
    if current is None:
        return PlacementObjective(free_domains, free_gpus, shared)
    matched = _kept_spots(cluster, allocation, placement, current)
    kept = _per_llm(matched)
    tp = {c.llm: c.tp for c in allocation.llms}
    movable = movable_replicas(cluster, allocation, current)
    moved = sum(tp[m] * (movable[m] - kept.get(m, 0)) for m in movable)
    return PlacementObjective(free_domains, free_gpus, shared, moved, sum(kept.values()),
                              occupied_units(cluster, allocation, placement, current, matched))


def kept_replicas(cluster: Cluster, allocation: Allocation, placement: Placement, current: Placement) -> dict[str, int]:
    """Per LLM, how many keep candidates the placement keeps (each new replica keeps at most one)."""
    return _per_llm(_kept_spots(cluster, allocation, placement, current))


def _per_llm(matched: dict[tuple[str, str, tuple[int, ...]], int]) -> dict[str, int]:
    kept: dict[str, int] = {}
    for (llm, _, _), count in matched.items():
        kept[llm] = kept.get(llm, 0) + count
    return kept


def occupied_units(cluster: Cluster, allocation: Allocation, placement: Placement, current: Placement,
                   matched: dict[tuple[str, str, tuple[int, ...]], int] | None = None) -> int:
    """sum_i max(0, N_i - c_i^now) (placement/current.py): N_i the units on GPU i of the
    placement's replicas that keep no candidate."""
    if matched is None:
        matched = _kept_spots(cluster, allocation, placement, current)
    left = dict(matched)  # kept replicas still to be taken out, per spot
    new: dict[tuple[str, int], int] = {}
    for rp in placement.replicas:
        key = (rp.llm, rp.node, tuple(sorted(s.gpu for s in rp.shards)))
        if left.get(key, 0) > 0:
            left[key] -= 1
            continue
        for s in rp.shards:
            new[(rp.node, s.gpu)] = new.get((rp.node, s.gpu), 0) + s.units
    now = free_now(cluster, current)
    return sum(max(0, units - now[i]) for i, units in new.items() if i in now)


def _kept_spots(cluster: Cluster, allocation: Allocation, placement: Placement,
                current: Placement) -> dict[tuple[str, str, tuple[int, ...]], int]:
    """Per spot (llm, node, sorted GPUs), how many of the placement's replicas there keep a
    candidate: as many as the spot has replicas and candidates (each replica keeps at most one)."""
    spots: dict[tuple[str, str, tuple[int, ...]], int] = {}
    for rp in placement.replicas:
        key = (rp.llm, rp.node, tuple(sorted(s.gpu for s in rp.shards)))
        spots[key] = spots.get(key, 0) + 1
    matched: dict[tuple[str, str, tuple[int, ...]], int] = {}
    for candidate in keep_candidates(cluster, allocation, current):
        key = (candidate.llm, candidate.node, candidate.gpus)
        if spots.get(key, 0) > matched.get(key, 0):
            matched[key] = matched.get(key, 0) + 1
    return matched


@dataclass(frozen=True)
class Spot:
    """Where one replica goes, before replica numbers are given (`old_index`: a kept candidate's)."""

    llm: str
    node: str
    gpus: tuple[int, ...]
    share: int
    old_index: int | None = None


def number_replicas(cluster: Cluster, spots: list[Spot]) -> Placement:
    """Give every LLM's replicas the numbers 0..d-1: kept replicas keep their old number where it is
    below d; the others take the free numbers in (node order, GPUs) order. Deterministic."""
    order = {n.name: i for i, n in enumerate(cluster.nodes)}
    by_llm: dict[str, list[Spot]] = {}
    for spot in spots:
        by_llm.setdefault(spot.llm, []).append(spot)
    placed: list[ReplicaPlacement] = []
    for llm, group in by_llm.items():
        group.sort(key=lambda s: (order[s.node], s.gpus, s.old_index is None, s.old_index or 0))
        count = len(group)
        numbers: dict[int, int] = {}  # position in group -> replica number
        used: set[int] = set()
        for k, spot in enumerate(group):
            if spot.old_index is not None and spot.old_index < count and spot.old_index not in used:
                numbers[k] = spot.old_index
                used.add(spot.old_index)
        free = iter(r for r in range(count) if r not in used)
        for k, spot in enumerate(group):
            number = numbers[k] if k in numbers else next(free)
            placed.append(ReplicaPlacement(llm, number, spot.node, tuple(Shard(g, spot.share) for g in spot.gpus)))
    placed.sort(key=lambda r: (r.llm, r.replica))
    return Placement(cluster.fractions_per_gpu, tuple(placed))
