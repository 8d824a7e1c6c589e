"""Exact placeability of an allocation: can every replica's tp shards go on tp distinct GPUs of one
NVLink domain of one node, with at most the free units of each GPU used?

`check_placement` first tries a best-fit greedy; if that fails it solves the count model
(placement/feasibility/packing.py states it) with CP-SAT and decodes a placement from the counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ortools.sat.python import cp_model

from scepsy.models.instance.allocation import Allocation, Placement, ReplicaPlacement, Shard
from scepsy.models.instance.instance import Cluster, Domain
from scepsy.placement.feasibility.packing import Shape, count_model, free_by_gpu, shape_counts
from scepsy.placement.feasibility.solver import cpsat_solver



@dataclass(frozen=True)
class PlacementCheck:
    placement: Placement | None
    proven: bool  # False when the exact model hit its time limit undecided

    @property
    def placeable(self) -> bool:
        return self.placement is not None


Placer = Callable[[Cluster, Allocation], PlacementCheck]  # what the allocation search gets injected


def replica_list(allocation: Allocation) -> list[tuple[str, int, Shape]]:
    """(llm, replica index, shape) of every replica, in allocation order."""
    return [(c.llm, r, c.shape) for c in allocation.llms for r in range(c.replicas)]


def greedy_placement(cluster: Cluster, allocation: Allocation) -> Placement | None:
    """Best fit, most constrained first (larger tp, then larger share); None if it gets stuck."""
    free = free_by_gpu(cluster)
    domains = cluster.domains()
    order = sorted(replica_list(allocation), key=lambda r: (-r[2][1], -r[2][2], r[0], r[1]))
    placed: list[ReplicaPlacement] = []
    for llm, replica, (gpu_type, tp, share) in order:
        best: tuple[int, int, Domain, list[int]] | None = None
        for index, domain in enumerate(domains):
            if domain.gpu_type != gpu_type or domain.size < tp:
                continue
            fitting = sorted((free[(domain.node, g)], g) for g in domain.gpus if free[(domain.node, g)] >= share)
            if len(fitting) < tp:
                continue
            chosen = fitting[:tp]
            leftover = sum(units - share for units, _ in chosen)
            if best is None or (leftover, index) < (best[0], best[1]):
                best = (leftover, index, domain, sorted(g for _, g in chosen))
        if best is None:
            return None
        _, _, domain, gpus = best
        for g in gpus:
            free[(domain.node, g)] -= share
        placed.append(ReplicaPlacement(llm, replica, domain.node, tuple(Shard(g, share) for g in gpus)))
    return Placement(cluster.fractions_per_gpu, tuple(sorted(placed, key=lambda r: (r.llm, r.replica))))


def exact_placement(
    cluster: Cluster, allocation: Allocation, time_limit_s: float = 10.0, gpu_cost: Mapping[str, float] | None = None
) -> PlacementCheck:
    """Decide placeability exactly with the count model and decode a placement when one exists.
    With `gpu_cost` (price per GPU type), find the placement of least cost of the GPUs it uses."""
    counts = shape_counts(allocation)
    shapes = sorted(counts)
    index = count_model(cluster, shapes)
    domains, free = index.domains, index.free
    model = cp_model.CpModel()

    # n[j, k]: replicas of shape k in domain j (only where the domain has the type and the size)
    n = {
        (j, k): model.new_int_var(0, counts[k], f"n[{j},{k}]")
        for j in range(len(domains))
        for k in shapes
        if (j, k) in index.gpus
    }
    # c[i, k]: shards of shape k on GPU i of domain j
    c = {(j, g, k): model.new_int_var(0, counts[k], f"c[{j},{g},{k}]") for (j, k) in n for g in index.gpus[(j, k)]}
    # every replica placed
    for k in shapes:
        model.add(sum(v for (j, kk), v in n.items() if kk == k) == counts[k])
    # a domain holds all shards of its replicas, at most one per GPU per replica
    for (j, k), v in n.items():
        model.add(sum(c[(j, g, k)] for g in domains[j].gpus if (j, g, k) in c) == k[1] * v)
        for g in domains[j].gpus:
            if (j, g, k) in c:
                model.add(c[(j, g, k)] <= v)
    # GPU capacity, and used[j, g] when the GPU hosts a shard
    used = {}
    for j, domain in enumerate(domains):
        for g in domain.gpus:
            terms = [k[2] * c[(j, g, k)] for k in shapes if (j, g, k) in c]
            if terms:
                used[(j, g)] = model.new_bool_var(f"used[{j},{g}]")
                model.add(sum(terms) <= free[(domain.node, g)] * used[(j, g)])
    if gpu_cost is not None:
        model.minimize(sum(int(round(gpu_cost[domains[j].gpu_type] * 1e6)) * v for (j, _), v in used.items()))

    solver = cpsat_solver(time_limit_s)
    status = solver.solve(model)
    if status == cp_model.INFEASIBLE:
        return PlacementCheck(None, True)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return PlacementCheck(None, False)

    # decode: deal each domain's replicas of a shape round-robin over its GPU blocks
    pending = {k: [(llm, r) for llm, r, shape in replica_list(allocation) if shape == k] for k in shapes}
    placed: list[ReplicaPlacement] = []
    for (j, k), v in sorted(n.items()):
        count = solver.value(v)
        if count == 0:
            continue
        positions = [g for g in domains[j].gpus if (j, g, k) in c for _ in range(solver.value(c[(j, g, k)]))]
        for r in range(count):
            llm, replica = pending[k].pop(0)
            gpus = sorted(positions[r + t * count] for t in range(k[1]))
            placed.append(ReplicaPlacement(llm, replica, domains[j].node, tuple(Shard(g, k[2]) for g in gpus)))
    placement = Placement(cluster.fractions_per_gpu, tuple(sorted(placed, key=lambda r: (r.llm, r.replica))))
    return PlacementCheck(placement, status == cp_model.OPTIMAL or gpu_cost is None)


def fewest_gpus_placement(cluster: Cluster, allocation: Allocation, gpu_cost: Mapping[str, float]) -> PlacementCheck:
    """A placement using GPUs of the least total cost (exact; `proven` False at the time limit)."""
    return exact_placement(cluster, allocation, gpu_cost=gpu_cost)


def check_placement(cluster: Cluster, allocation: Allocation, time_limit_s: float = 10.0) -> PlacementCheck:
    placement = greedy_placement(cluster, allocation)
    if placement is not None:
        return PlacementCheck(placement, True)
    return exact_placement(cluster, allocation, time_limit_s)


def gpus_by_type(cluster: Cluster, placement: Placement) -> dict[str, int]:
    """Physical GPUs hosting at least one shard, per GPU type."""
    types = {n.name: n.gpu_type for n in cluster.nodes}
    busy = placement.busy_gpus()
    counts = {g: 0 for g in cluster.used_gpu_types()}
    for node, _ in busy:
        counts[types[node]] += 1
    return counts
