"""Per-LLM candidate configurations (gpu_type, tp, share, replicas) with their predicted latency.

Every choice the planner can make for one LLM is an `Option`. Because an LLM's latency depends only
on its own configuration (its per-replica rate is its offered load over its replicas), the latency of
each option is computed once, exactly, from the profile curve: the solver never interpolates.

Dominance pruning (exact): option (s, d) of a (gpu_type, tp) is dropped when another option
(s', d') with s' <= s and d' <= d has latency <= its latency. Fewer or smaller shards of the same
shape are never harder to place and use no more GPU, so some optimal plan avoids dominated options.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from scepsy.models.errors import past_deadline, too_large_for_limit
from scepsy.models.performance.alp import replica_curve
from scepsy.models.instance.allocation import Allocation, LlmAllocation
from scepsy.models.instance.instance import Cluster, Instance, Llm
from scepsy.placement.feasibility.packing import DomainKinds, domain_kinds, max_replicas

LATENCY_TOLERANCE = 1e-12


@dataclass(frozen=True)
class SearchSpace:
    """Restrictions of the configuration space (ablations and baselines)."""

    whole_gpus_only: bool = False
    tp_one_only: bool = False
    gpu_types: tuple[str, ...] | None = None  # None: every gpu type of the cluster


@dataclass(frozen=True)
class Option:
    llm: str
    gpu_type: str
    tp: int
    share: int
    replicas: int
    latency_s: float
    capacity_rps: float

    @property
    def units(self) -> int:
        return self.tp * self.share * self.replicas

    @property
    def shape(self) -> tuple[str, int, int]:
        return (self.gpu_type, self.tp, self.share)


def configuration(choice: Option | LlmAllocation) -> tuple[str, int, int, int]:
    """(gpu_type, tp, share, replicas): what an option is, and what an allocation gives its LLM."""
    return (choice.gpu_type, choice.tp, choice.share, choice.replicas)


def options_allocation(fractions_per_gpu: int, chosen: Iterable[Option]) -> Allocation:
    """The allocation of one chosen option per LLM."""
    return Allocation(fractions_per_gpu, tuple(LlmAllocation(o.llm, o.gpu_type, o.tp, o.share, o.replicas) for o in chosen))


def shares_for(cluster: Cluster, space: SearchSpace) -> range:
    f = cluster.fractions_per_gpu
    return range(f, f + 1) if space.whole_gpus_only else range(1, f + 1)


def tp_degrees_for(instance: Instance, llm: Llm, gpu_type: str, space: SearchSpace) -> list[int]:
    largest = instance.cluster.largest_domain(gpu_type)
    return [
        t
        for t in llm.tp_degrees
        if t <= largest and llm.profile.has(gpu_type, t) and (t == 1 or not space.tp_one_only)
    ]


def gpu_types_for(instance: Instance, space: SearchSpace) -> list[str]:
    types = instance.cluster.used_gpu_types()
    return [g for g in types if space.gpu_types is None or g in space.gpu_types]


def configurations(instance: Instance, llm: Llm, space: SearchSpace = SearchSpace()) -> Iterator[tuple[str, int, int]]:
    """Every replica shape (gpu_type, tp, share) the search may give `llm`, in that order: a gpu
    type of the cluster (of the space), a TP degree of the LLM that fits that type's largest NVLink
    domain and is profiled, a share of 1..F units (F alone for whole GPUs only)."""
    for gpu_type in gpu_types_for(instance, space):
        for tp in tp_degrees_for(instance, llm, gpu_type, space):
            for share in shares_for(instance.cluster, space):
                yield gpu_type, tp, share


def _pareto(candidates: dict[int, tuple[np.ndarray, np.ndarray]], epsilon: float = 0.0) -> list[tuple[int, int, float]]:
    """Keep the (share, replicas, latency) points that no kept point with smaller-or-equal share and
    replicas matches within a factor (1 - epsilon) of latency. epsilon = 0: exact dominance. With
    epsilon > 0 every dropped point has a kept dominator at most 1/(1 - epsilon) slower."""
    if not candidates:
        return []
    factor = 1 - max(epsilon, LATENCY_TOLERANCE)
    top = max(int(d[-1]) for d, _ in candidates.values())
    best_before = np.full(top + 2, np.inf)  # best kept latency of smaller shares with <= d replicas
    kept: list[tuple[int, int, float]] = []
    for share in sorted(candidates):
        replicas, latencies = candidates[share]
        kept_row = np.full(top + 2, np.inf)
        running = np.inf  # best kept latency of this share with fewer replicas
        for d, latency in zip(replicas.tolist(), latencies.tolist()):
            if latency < min(best_before[d], running) * factor:  # inf: nothing dominates
                kept.append((share, d, latency))
                kept_row[d] = latency
                running = min(running, latency)
        best_before = np.minimum(best_before, np.minimum.accumulate(kept_row))
    return kept


def _check_deadline(deadline: float | None, instance: Instance, llm: Llm) -> None:
    if past_deadline(deadline):
        cluster = instance.cluster
        raise too_large_for_limit(
            f"building the configurations of llm {llm.name} ({len(instance.llms)} LLMs, {cluster.gpu_count()} GPUs)"
        )


def most_useful_replicas(curve, offered_rps: float, d_max: int) -> int:
    """The replica counts worth listing: up to the first d whose per-replica rate offered/d is at
    or below the curve's first point, where the latency stops falling (the curve is flat below it,
    models/instance/profile.py). Every larger d has that same latency with more replicas, so
    dominance pruning drops it: listing it would only make option building O(GPUs)."""
    first_rate = float(curve.rates_rps[0])
    flat_from = max(1, math.ceil(offered_rps / first_rate)) if first_rate > 0 else d_max
    while flat_from < d_max and offered_rps / flat_from > first_rate:  # rounding of the ceil
        flat_from += 1
    return min(d_max, flat_from)


def llm_options(
    instance: Instance, llm: Llm, space: SearchSpace = SearchSpace(), prune: bool = True, epsilon: float = 0.0,
    deadline: float | None = None, kinds: DomainKinds | None = None, shapes: dict | None = None,
) -> list[Option]:
    """All feasible options of one LLM (memory, profile, throughput), dominance-pruned if `prune`
    (within a latency factor 1/(1 - epsilon) if epsilon > 0). Past `deadline` (perf_counter
    seconds) it raises TimeLimitError: the time limit covers building the options too. `shapes`
    keeps each replica shape's profile curve and most replicas, which do not depend on the rates
    (valid for one cluster)."""
    cluster = instance.cluster
    kinds = domain_kinds(cluster) if kinds is None else kinds
    offered = instance.offered_rate_rps(llm.name)
    options: list[Option] = []
    for (gpu_type, tp), shapes_of_tp in itertools.groupby(configurations(instance, llm, space), key=lambda c: c[:2]):
        candidates: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        capacities: dict[int, float] = {}
        for _, _, share in shapes_of_tp:
            _check_deadline(deadline, instance, llm)
            curve, d_max = _shape(instance, llm, gpu_type, tp, share, shapes, kinds)
            if curve is None:
                continue
            usable = instance.max_utilization * curve.capacity_rps
            d_min = max(1, math.ceil(offered / usable * (1 - 1e-9)))
            if d_min > d_max:
                continue
            if prune:
                d_max = max(d_min, most_useful_replicas(curve, offered, d_max))
            replicas = np.arange(d_min, d_max + 1)
            latencies = np.asarray(curve.latency_s(offered / replicas, instance.call_latency_metric), dtype=float)
            candidates[share] = (replicas, latencies)
            capacities[share] = curve.capacity_rps
        points = _pareto(candidates, epsilon) if prune else [
            (s, int(d), float(l)) for s, (ds, ls) in sorted(candidates.items()) for d, l in zip(ds, ls)
        ]
        options += [Option(llm.name, gpu_type, tp, s, d, lat, capacities[s]) for s, d, lat in points]
    options.sort(key=lambda o: (o.gpu_type, o.tp, o.share, o.replicas))
    return options


def _shape(instance: Instance, llm: Llm, gpu_type: str, tp: int, share: int, shapes: dict | None,
           kinds: DomainKinds | None = None):
    """(profile curve or None, most replicas on the cluster) of one replica shape of `llm`."""
    key = (llm.name, gpu_type, tp, share)
    if shapes is not None and key in shapes:
        return shapes[key]
    curve = replica_curve(instance, llm, gpu_type, tp, share)
    found = (curve, max_replicas(instance.cluster, gpu_type, tp, share, kinds) if curve is not None else 0)
    if shapes is not None:
        shapes[key] = found
    return found


def all_options(
    instance: Instance, space: SearchSpace = SearchSpace(), prune: bool = True, epsilon: float = 0.0,
    deadline: float | None = None,
) -> dict[str, list[Option]]:
    kinds = domain_kinds(instance.cluster)
    return {llm.name: llm_options(instance, llm, space, prune, epsilon, deadline, kinds) for llm in instance.llms}


def max_servable(instance: Instance, llm: Llm, space: SearchSpace = SearchSpace()) -> tuple[float, str]:
    """The most requests/s the whole cluster could serve for this LLM alone (at max_utilization),
    and the configuration that does it; (0.0, "") when no configuration holds the model."""
    cluster = instance.cluster
    kinds = domain_kinds(cluster)
    best_rate, best_config = 0.0, ""
    for gpu_type, tp, share in configurations(instance, llm, space):
        curve = replica_curve(instance, llm, gpu_type, tp, share)
        if curve is None:
            continue
        replicas = max_replicas(cluster, gpu_type, tp, share, kinds)
        rate = replicas * curve.capacity_rps * instance.max_utilization
        if rate > best_rate:
            fraction = share / cluster.fractions_per_gpu
            best_rate = rate
            best_config = f"{replicas} replicas of {gpu_type} tp={tp} fraction={fraction:g}"
    return best_rate, best_config
