"""Exact placeability of an allocation: can every replica's tp shards go on tp distinct GPUs of one
NVLink domain of one node, with at most the free units of each GPU used?

`check_placement` first tries a best-fit greedy; if that fails it solves the count model
(placement/feasibility/counts.py states it) with CP-SAT and decodes a placement from the counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ortools.sat.python import cp_model

from scepsy.models.instance.allocation import Allocation, Placement, ReplicaPlacement, Shard
from scepsy.models.instance.instance import Cluster, Domain
from scepsy.placement.feasibility.counts import CpsatCounts, Group, add_count_rows, add_used, count_variables, decode_counts
from scepsy.placement.feasibility.packing import Shape, free_by_gpu, shape_counts
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
    """Decide placeability exactly with the count model (counts.py, one group per replica shape, R_k
    its replicas) and decode a placement when one exists. With `gpu_cost` (price per GPU type),
    find the placement of least cost of the GPUs it uses."""
    # data
    replicas = shape_counts(allocation)
    shapes = sorted(replicas)
    model = cp_model.CpModel()
    solver_counts = CpsatCounts(model)

    # the count model's variables and constraints, and used[i] for the GPUs it uses
    counts = count_variables(solver_counts, cluster, [Group(k, *k, replicas[k]) for k in shapes])
    add_count_rows(solver_counts, counts, replicas)
    used = add_used(solver_counts, counts, cluster)

    # objective: the cost of the GPUs in use, when asked for
    if gpu_cost is not None:
        types = {n.name: n.gpu_type for n in cluster.nodes}
        model.minimize(sum(int(round(gpu_cost.get(types[node], 0.0) * 1e6)) * v for (node, _), v in used.items()))

    solver = cpsat_solver(time_limit_s)
    status = solver.solve(model)
    if status == cp_model.INFEASIBLE:
        return PlacementCheck(None, True)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return PlacementCheck(None, False)

    # decode: the counts' replicas of each shape, given to the allocation's replicas of that shape
    pending = {k: [(llm, r) for llm, r, shape in replica_list(allocation) if shape == k] for k in shapes}
    placed = []
    for spot in decode_counts(counts, solver.value):
        llm, replica = pending[spot.key].pop(0)
        placed.append(ReplicaPlacement(llm, replica, spot.node, tuple(Shard(g, spot.key[2]) for g in spot.gpus)))
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
