"""Exhaustive search over every combination of unpruned options (tiny instances and tests).

Evaluates the objective of all combinations and scans them in lexicographic order of the stages.
Latency stages and share units (min_units' first stage, the others' last) are exact per
combination; a GPU stage (min_gpus, min_cost) is bounded below by ceil(units_g / F) per GPU type
and made exact for a candidate by the placement of fewest GPUs, so the scan stops once a
candidate's lower bound is no better than the best exact value found. Independent of the CP-SAT model except for the option list (built with prune=False)
and the exact placement check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scepsy.models.errors import InputError
from scepsy.models.instance.allocation import Allocation, Placement
from scepsy.models.instance.instance import Instance

from scepsy.planner.allocation.objective import SLO_TOLERANCE, GpuCount, LatencySum, MaxLatencySum, Objective, Usage
from scepsy.planner.allocation.options import Option, options_allocation
from scepsy.placement.feasibility.placeability import check_placement, fewest_gpus_placement, gpus_by_type

MAX_COMBINATIONS = 5_000_000


class TooLargeError(InputError):
    """More combinations than the brute force walks through (bad input for this backend: exit 2)."""

    def __init__(self, combinations: int):
        super().__init__(None, "backend", f"{combinations} combinations exceed the brute-force limit {MAX_COMBINATIONS}",
                         "use `backend` cpsat")


@dataclass(frozen=True)
class BruteForceResult:
    allocation: Allocation
    placement: Placement
    values: tuple[float, ...]
    combinations: int
    placement_checks: int


def solve_bruteforce(
    instance: Instance, options: dict[str, list[Option]], objective: Objective, placer=check_placement
) -> BruteForceResult | None:
    llms = list(options)
    sizes = [len(options[m]) for m in llms]
    total = int(np.prod(sizes)) if sizes else 0
    if total == 0:
        return None
    if total > MAX_COMBINATIONS:
        raise TooLargeError(total)
    cluster = instance.cluster
    f = cluster.fractions_per_gpu
    index = np.indices(sizes).reshape(len(llms), -1)  # one column per combination

    def column(attribute) -> dict[str, np.ndarray]:
        return {m: np.array([attribute(o) for o in options[m]])[index[k]] for k, m in enumerate(llms)}

    latency = column(lambda o: o.latency_s)
    units = np.asarray(sum(column(lambda o: o.units).values()))
    units_by_type = {
        g: sum(column(lambda o, g=g: o.units if o.gpu_type == g else 0).values()) for g in cluster.used_gpu_types()
    }
    lower_gpus = {g: np.ceil(u / f) for g, u in units_by_type.items()}

    def latency_sum(weights) -> np.ndarray:
        start = np.zeros(index.shape[1])  # sum()'s 0 as an array (one entry per combination): same values, typed
        return sum((w * latency[m] for m, w in weights.items()), start)

    stages: list[np.ndarray] = []  # per stage: exact values or lower bounds
    for stage in objective.stages:
        if isinstance(stage, LatencySum):
            stages.append(latency_sum(stage.weights))
        elif isinstance(stage, MaxLatencySum):
            stages.append(np.max([latency_sum(row) for row in stage.weights.values()], axis=0))
        elif isinstance(stage, GpuCount):
            stages.append(np.asarray(sum(stage.cost[g] * lower_gpus[g] for g in lower_gpus)))
        else:
            stages.append(units.astype(float))

    # necessary conditions first: free units per gpu type, latency limits
    feasible = np.ones(total, dtype=bool)
    for gpu_type, used in units_by_type.items():
        free = sum(cluster.free_units(n.name, g) for n in cluster.nodes if n.gpu_type == gpu_type for g in range(n.gpus))
        feasible &= used <= free
    for workflow, limit in objective.latency_limits.items():
        feasible &= latency_sum(objective.coefficients[workflow]) <= limit * (1 + SLO_TOLERANCE)
    candidates = np.flatnonzero(feasible)
    order = candidates[np.lexsort([s[candidates] for s in reversed(stages)])]

    gpu_stage = next((s for s in objective.stages if isinstance(s, GpuCount)), None)
    best: BruteForceResult | None = None
    checks = 0
    for combination in order:
        bound = tuple(float(s[combination]) for s in stages)
        if best is not None and bound >= best.values:
            break
        chosen = [options[m][index[k][combination]] for k, m in enumerate(llms)]
        allocation = options_allocation(f, chosen)
        checks += 1
        check = fewest_gpus_placement(cluster, allocation, gpu_stage.cost) if gpu_stage else placer(cluster, allocation)
        placement = check.placement
        if placement is None:
            continue
        latencies = {m: o.latency_s for m, o in zip(llms, chosen)}
        usage = Usage(allocation.units, gpus_by_type(cluster, placement))
        values = objective.values(latencies, usage)
        if best is None or values < best.values:
            best = BruteForceResult(allocation, placement, values, total, checks)
        if gpu_stage is None:
            break  # exact values in sorted order: the first placeable one is optimal
    return None if best is None else BruteForceResult(best.allocation, best.placement, best.values, total, checks)
