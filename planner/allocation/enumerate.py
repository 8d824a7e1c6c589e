"""The paper's pruned enumeration (section 5), kept as a baseline and as a warm start for CP-SAT.

How each step is read (docs/model.md, "Pruned enumeration", says the same):
1. Latency ratios. Each LLM's latency is its Aggregate-LLM-Pipeline contribution sum_w n/p * L_m
   on one whole GPU at the smallest TP degree that holds it, at its full offered rate (clamped to the
   curve's capacity). LLMs are ordered by it, highest first (ties by name).
2. GPU fractions. Units of 1/F GPU are dealt to the LLMs in that order so that all free units of the
   gpu type are used (the paper counts C(G*F + M - 1, M - 1) mappings, i.e. all units). Each LLM gets
   at least its lower bound (the fewest units that hold weights + KV cache at some TP degree) and at
   most its upper bound (all units minus the lower bounds of every lower-latency LLM). A
   higher-latency LLM never gets fewer units than a lower-latency one, unless the latter's lower
   bound forces it.
3. Contiguous packing. The units are laid out in order over the GPUs (node by node, GPU by GPU):
   an LLM spans the k GPUs its unit interval touches (1.66 GPUs -> 1.0 on one GPU, 0.66 on the next).
4. Resolving parallelism. For an LLM spanning k GPUs, TP degree t and replicas d are feasible when
   t <= k, t fits an NVLink domain, and t*d is a multiple of k (shards spread evenly over its GPUs);
   each shard gets floor(units / (t*d)) units, which must hold the model. The best (t, d) of each
   LLM is the one of least latency that meets its throughput.
5. The combination of best configurations with the best objective whose placement exists wins.
Heterogeneous clusters: every assignment of LLMs to gpu types is enumerated, each type on its own.
"""

from __future__ import annotations

import itertools
from typing import Iterable
import math
from dataclasses import dataclass

from scepsy.models.instance.allocation import Allocation, LlmAllocation, Placement
from scepsy.models.performance.alp import replica_curve
from scepsy.models.instance.instance import Instance, Llm
from scepsy.models.instance.profile import units_for_memory

from scepsy.planner.allocation.objective import Objective, Usage
from scepsy.planner.allocation.options import SearchSpace, gpu_types_for, tp_degrees_for
from scepsy.placement.feasibility.placeability import check_placement


@dataclass(frozen=True)
class EnumerationResult:
    allocation: Allocation
    placement: Placement
    values: tuple[float, ...]
    mappings: int  # fraction mappings enumerated


@dataclass(frozen=True)
class _Config:
    tp: int
    share: int
    replicas: int
    latency_s: float

    @property
    def units(self) -> int:
        return self.tp * self.share * self.replicas


class _Enumerator:
    def __init__(self, instance: Instance, objective: Objective, space: SearchSpace, placer):
        self.instance = instance
        self.objective = objective
        self.space = space
        self.placer = placer
        self.cluster = instance.cluster
        self.f = instance.cluster.fractions_per_gpu
        self.memo: dict[tuple[str, str, int, int], _Config | None] = {}
        self.mappings = 0

    # step 1
    def latency_ratio(self, llm: Llm, gpu_type: str) -> float:
        offered = self.instance.offered_rate_rps(llm.name)
        weight = sum(c.get(llm.name, 0.0) for c in self.objective.coefficients.values())
        for tp in tp_degrees_for(self.instance, llm, gpu_type, self.space):
            curve = replica_curve(self.instance, llm, gpu_type, tp, self.f)
            if curve is not None:
                rate = min(offered, curve.capacity_rps)
                return weight * float(curve.latency_s(rate, self.instance.call_latency_metric))
        return 0.0

    def lower_bound(self, llm: Llm, gpu_type: str) -> int | None:
        memory = self.cluster.gpu_types[gpu_type].memory_gib
        bounds = [
            tp * units_for_memory(llm.memory_need_gib, tp, memory, self.f)
            for tp in tp_degrees_for(self.instance, llm, gpu_type, self.space)
            if units_for_memory(llm.memory_need_gib, tp, memory, self.f) <= self.f
        ]
        if self.space.whole_gpus_only:
            bounds = [math.ceil(b / self.f) * self.f for b in bounds]
        return min(bounds) if bounds else None

    # step 4
    def best_config(self, llm: Llm, gpu_type: str, units: int, gpus: int) -> _Config | None:
        key = (llm.name, gpu_type, units, gpus)
        if key not in self.memo:
            self.memo[key] = self._resolve(llm, gpu_type, units, gpus)
        return self.memo[key]

    def _resolve(self, llm: Llm, gpu_type: str, units: int, gpus: int) -> _Config | None:
        offered = self.instance.offered_rate_rps(llm.name)
        best: _Config | None = None
        for tp in tp_degrees_for(self.instance, llm, gpu_type, self.space):
            if tp > gpus:
                continue
            for shards in range(gpus, units + 1, gpus):  # t*d a multiple of k
                if shards % tp:
                    continue
                share = min(units // shards, self.f)
                if share < 1 or (self.space.whole_gpus_only and share != self.f):
                    continue
                curve = replica_curve(self.instance, llm, gpu_type, tp, share)
                if curve is None:
                    continue
                replicas = shards // tp
                rate = offered / replicas
                if rate > self.instance.max_utilization * curve.capacity_rps * (1 + 1e-9):
                    continue
                config = _Config(tp, share, replicas, float(curve.latency_s(rate, self.instance.call_latency_metric)))
                if best is None or (config.latency_s, config.units, tp) < (best.latency_s, best.units, best.tp):
                    best = config
        return best

    # steps 2 and 3 for the LLMs assigned to one gpu type
    def type_mappings(self, llms: list[Llm], gpu_type: str):
        """Yield {llm: config} for each fraction mapping of these LLMs onto the type's GPUs."""
        free = [
            self.cluster.free_units(n.name, g)
            for n in self.cluster.nodes
            if n.gpu_type == gpu_type
            for g in range(n.gpus)
        ]
        starts = list(itertools.accumulate(free, initial=0))
        total = starts[-1]
        ordered = sorted(llms, key=lambda m: (-self.latency_ratio(m, gpu_type), m.name))
        bounds = [self.lower_bound(m, gpu_type) for m in ordered]
        lower = [lb for lb in bounds if lb is not None]
        if len(lower) < len(bounds) or sum(lower) > total:
            return
        upper = [total - sum(lower[i + 1:]) for i in range(len(ordered))]
        step = self.f if self.space.whole_gpus_only else 1

        def span(begin: int, end: int) -> int:
            first = next(i for i in range(len(free)) if starts[i + 1] > begin)
            last = next(i for i in range(len(free)) if starts[i + 1] >= end)
            return last - first + 1

        def deal(i: int, begin: int, previous: int, chosen: dict):
            if i == len(ordered):
                self.mappings += 1
                yield dict(chosen)
                return
            llm = ordered[i]
            remaining = total - begin
            amounts: Iterable[int]
            if i == len(ordered) - 1:
                amounts = [remaining] if lower[i] <= remaining <= upper[i] else []
            else:
                cap = min(upper[i], remaining - sum(lower[i + 1:]), max(previous, lower[i]))
                amounts = range(cap - (cap - lower[i]) % step, lower[i] - 1, -step)
            for amount in amounts:
                if amount > max(previous, lower[i]):
                    continue
                config = self.best_config(llm, gpu_type, amount, span(begin, begin + amount))
                if config is None:
                    continue
                chosen[llm.name] = config
                yield from deal(i + 1, begin + amount, amount, chosen)
                del chosen[llm.name]

        yield from deal(0, 0, total, {})

    def run(self) -> EnumerationResult | None:
        types = gpu_types_for(self.instance, self.space)
        best: tuple[tuple[float, ...], Allocation, Placement] | None = None
        for assignment in itertools.product(types, repeat=len(self.instance.llms)):
            groups = {
                g: [m for m, a in zip(self.instance.llms, assignment) if a == g] for g in set(assignment)
            }
            per_type = [list(self.type_mappings(llms, g)) for g, llms in sorted(groups.items())]
            for parts in itertools.product(*per_type):
                chosen = {name: (g, c) for (g, _), part in zip(sorted(groups.items()), parts) for name, c in part.items()}
                latencies = {name: c.latency_s for name, (_, c) in chosen.items()}
                if not self.objective.within_limits(latencies):
                    continue
                values = self.objective.values(latencies, Usage(sum(c.units for _, c in chosen.values()), {}))
                if best is not None and values >= best[0]:
                    continue
                allocation = Allocation(
                    self.f,
                    tuple(
                        LlmAllocation(m.name, chosen[m.name][0], chosen[m.name][1].tp, chosen[m.name][1].share,
                                      chosen[m.name][1].replicas)
                        for m in self.instance.llms
                    ),
                )
                check = self.placer(self.cluster, allocation)
                if check.placeable:
                    best = (values, allocation, check.placement)
        if best is None:
            return None
        return EnumerationResult(best[1], best[2], best[0], self.mappings)


def solve_enumerate(
    instance: Instance, objective: Objective, space: SearchSpace = SearchSpace(), placer=check_placement
) -> EnumerationResult | None:
    return _Enumerator(instance, objective, space, placer).run()
