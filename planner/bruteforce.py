"""Exhaustive search over every combination of unpruned options (tiny instances and tests).

Evaluates the objective of all combinations, sorts them lexicographically (objective stages, then
GPU units) and returns the first one whose placement exists. Independent of the CP-SAT model except
for the option list (built with prune=False) and the exact placeability check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scepsy.models.allocation import Allocation, LlmAllocation, Placement
from scepsy.models.instance import Instance

from .objective import LatencyObjective
from .options import Option
from .placeability import check_placement

MAX_COMBINATIONS = 5_000_000


class TooLargeError(ValueError):
    pass


@dataclass(frozen=True)
class BruteForceResult:
    allocation: Allocation
    placement: Placement
    values: tuple[float, ...]
    combinations: int
    placement_checks: int


def _allocation(f: int, chosen: list[Option]) -> Allocation:
    return Allocation(f, tuple(LlmAllocation(o.llm, o.gpu_type, o.tp, o.share, o.replicas) for o in chosen))


def solve_bruteforce(
    instance: Instance, options: dict[str, list[Option]], objective: LatencyObjective, placer=check_placement
) -> BruteForceResult | None:
    llms = list(options)
    sizes = [len(options[m]) for m in llms]
    total = int(np.prod(sizes)) if sizes else 0
    if total == 0:
        return None
    if total > MAX_COMBINATIONS:
        raise TooLargeError(f"{total} combinations exceed the brute-force limit {MAX_COMBINATIONS}; use --backend cpsat")
    index = np.indices(sizes).reshape(len(llms), -1)  # one column per combination
    latency = {m: np.array([o.latency_s for o in options[m]])[index[k]] for k, m in enumerate(llms)}
    units = sum(np.array([o.units for o in options[m]])[index[k]] for k, m in enumerate(llms))

    workflow_latency = {
        w: sum(c * latency[m] for m, c in coefs.items()) for w, coefs in objective.coefficients.items()
    }
    if objective.egalitarian:
        ratio = np.max([workflow_latency[w] / objective.references[w] for w in workflow_latency], axis=0)
        weights = objective.mean_weights()
        mean = sum(weights[w] * workflow_latency[w] for w in workflow_latency)
        stages = [ratio, mean]
    else:
        stages = [next(iter(workflow_latency.values()))]

    # cheap necessary condition first: share units per gpu type
    feasible = np.ones(total, dtype=bool)
    cluster = instance.cluster
    for gpu_type in cluster.used_gpu_types():
        free = sum(cluster.free_units(n.name, g) for n in cluster.nodes if n.gpu_type == gpu_type for g in range(n.gpus))
        used = sum(
            np.array([o.units if o.gpu_type == gpu_type else 0 for o in options[m]])[index[k]] for k, m in enumerate(llms)
        )
        feasible &= used <= free
    candidates = np.flatnonzero(feasible)
    order = candidates[np.lexsort([units[candidates]] + [s[candidates] for s in reversed(stages)])]

    checks = 0
    for combination in order:
        chosen = [options[m][index[k][combination]] for k, m in enumerate(llms)]
        allocation = _allocation(cluster.fractions_per_gpu, chosen)
        checks += 1
        check = placer(cluster, allocation)
        if check.placeable:
            values = tuple(float(s[combination]) for s in stages)
            return BruteForceResult(allocation, check.placement, values, total, checks)
    return None
