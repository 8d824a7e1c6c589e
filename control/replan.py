"""Re-planning for the controller: the cheapest plan that meets the SLOs at given rates, placed
with the fewest moves from the placement that runs now (the planner's `current` path).

    allocation(rates)      the cheapest plan at the rates (`cheapest_objective`: the fewest share
                           units, min_units, where the cluster shares GPUs; the fewest GPUs,
                           min_gpus, where it does not), with every workflow's latency bounded by its
                           planning SLO (latency_slo_s * slo_margin); where none meets it, the
                           min_latency plan at the rates (the most the cluster can do); None where
                           even that is infeasible (keep what runs). Rates are first rounded UP to a
                           geometric grid (`rate_step`, 5% by default), so that nearby forecasts
                           share one cached plan: repeated decisions cost a dictionary look-up,
                           and the rounding is headroom, never a shortfall.
    place(allocation, current)
                           placement.place with `current`: it minimises the moved shards first
                           (placement/current.py). Every plan returned was placed, so the cluster
                           can run it.
    moves(old, new)        replicas started, stopped or relocated (a stop and a start of one LLM
                           count as one relocation): sum_m max(starts_m, stops_m).
    moves_lower_bound      the least any placement of the new allocation needs: |d'_m - d_m| where
                           the LLM keeps its shape, max(d_m, d'_m) where it changes shape.

The caches live in the Replanner (plans are a deterministic function of the rounded rates and the
current placement); the decision function itself stays free of I/O and clocks.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Mapping

from scepsy.models.errors import InfeasibleError, TimeLimitError
from scepsy.models.instance.allocation import Allocation, LlmAllocation, Placement, ReplicaPlacement
from scepsy.models.instance.instance import Instance
from scepsy.placement.place import PlacementSettings, feasibility_placer
from scepsy.placement.place import place as place_allocation
from scepsy.planner.allocation.planning import make_plan
from scepsy.planner.allocation.search import PlanSettings

RATE_FLOOR_RPS = 1e-3  # rates below this plan as this (a plan needs a positive rate per workflow)


@dataclass
class Replanner:
    """Plans for the controller, with the caches described in the module docstring. `instance`
    carries the planning SLOs (latency_slo_s already multiplied by the margin)."""

    instance: Instance
    rate_step: float = 0.05
    plan_time_limit_s: float = 30.0
    placement: PlacementSettings = PlacementSettings(method="cpsat", time_limit_s=10.0)
    _allocations: dict[tuple[int, ...], Allocation | None] = field(default_factory=dict, repr=False)
    _placements: dict[tuple, Placement | None] = field(default_factory=dict, repr=False)
    _shapes: dict[tuple, Allocation | None] = field(default_factory=dict, repr=False)
    _corrected: dict[tuple, "Replanner"] = field(default_factory=dict, repr=False)

    def rounded(self, rates_rps: Mapping[str, float]) -> dict[str, float]:
        """The rates rounded up to the grid (module docstring)."""
        return {w.name: _grid_value(self._step(rates_rps.get(w.name, 0.0)), self.rate_step) for w in self.instance.workflows}

    def _step(self, rate: float) -> int:
        return _steps_up(max(rate, RATE_FLOOR_RPS) / RATE_FLOOR_RPS, self.rate_step)

    def allocation(self, rates_rps: Mapping[str, float]) -> Allocation | None:
        key = tuple(self._step(rates_rps.get(w.name, 0.0)) for w in self.instance.workflows)
        if key not in self._allocations:
            rates = {w.name: _grid_value(k, self.rate_step) for w, k in zip(self.instance.workflows, key)}
            self._allocations[key] = self._solve(self.instance.with_arrival_rates(rates))
        return self._allocations[key]

    def _solve(self, at: Instance) -> Allocation | None:
        settings = PlanSettings(time_limit_s=self.plan_time_limit_s, workers=1)
        for instance in (at.with_objective(cheapest_objective(at)), _without_slos(at).with_objective("min_latency")):
            try:
                return make_plan(instance, settings, feasibility_placer(self.placement)).allocation
            except (InfeasibleError, TimeLimitError):
                continue
        return None

    def same_shapes(self, allocation: Allocation, rates_rps: Mapping[str, float]) -> Allocation | None:
        """`same_shapes` at the rates rounded up to the grid, within the cluster's units (cached)."""
        key = (tuple(c.shape for c in allocation.llms), tuple(self._step(rates_rps.get(w.name, 0.0)) for w in self.instance.workflows))
        if key not in self._shapes:
            rates = {w.name: _grid_value(k, self.rate_step) for w, k in zip(self.instance.workflows, key[1])}
            cluster = self.instance.cluster
            units = sum(n.gpus for n in cluster.nodes) * cluster.fractions_per_gpu
            self._shapes[key] = same_shapes(self.instance, allocation, rates, units)
        return self._shapes[key]

    def rounded_scales(self, scales: Mapping[str, float]) -> dict[str, float]:
        """The LLMs' latency scales above 1, each rounded up to the rate grid (never below the
        correction measured)."""
        out = {}
        for llm, scale in sorted(scales.items()):
            if scale > 1 + 1e-9:
                out[llm] = (1 + self.rate_step) ** _steps_up(scale, self.rate_step)
        return out

    def corrected(self, scales: Mapping[str, float]) -> "Replanner":
        """The re-planner of the instance whose LLMs' latencies are scaled by `scales` (grid values:
        `rounded_scales`), with its own plan caches and this one's placements (cached)."""
        key = tuple(sorted(scales.items()))
        if key not in self._corrected:
            self._corrected[key] = Replanner(self.instance.with_latency_scales(scales), self.rate_step,
                                             self.plan_time_limit_s, self.placement, _placements=self._placements)
        return self._corrected[key]

    def place(self, allocation: Allocation, current: Placement | None) -> Placement | None:
        """`allocation` placed with the fewest moves from `current`; None where it cannot be placed."""
        key = (allocation, current)
        if key not in self._placements:
            try:
                result = place_allocation(self.instance.cluster, allocation, self.placement, current)
                self._placements[key] = result.placement
            except (InfeasibleError, TimeLimitError):
                self._placements[key] = None
        return self._placements[key]


def cheapest_objective(instance: Instance) -> str:
    """What the controller pays for is share units held (GPU-hours count a shard's share of its
    GPU): on a cluster that shares GPUs (fractions_per_gpu > 1) min_units holds the fewest, where
    min_gpus would fill every GPU it takes. Where a GPU is one unit (fractions_per_gpu = 1) every
    shard fills its GPU, the two count the same thing, and the controller plans with min_gpus."""
    return "min_units" if instance.cluster.fractions_per_gpu > 1 else "min_gpus"


def _steps_up(ratio: float, rate_step: float) -> int:
    """The fewest steps of the geometric grid (factor 1 + rate_step) that reach `ratio` (>= 1)."""
    return math.ceil(math.log(ratio) / math.log1p(rate_step) - 1e-9)


def _grid_value(step: int, rate_step: float) -> float:
    return RATE_FLOOR_RPS * (1 + rate_step) ** step


def _without_slos(instance: Instance) -> Instance:
    workflows = tuple(replace(w, latency_slo_s=None) for w in instance.workflows)
    return replace(instance, workflows=workflows)


def replica_key(replica: ReplicaPlacement) -> tuple:
    """Where a replica runs, whatever its index: (llm, node, ((gpu, units), ...)); two replicas
    with one key are interchangeable."""
    return (replica.llm, replica.node, tuple(sorted((s.gpu, s.units) for s in replica.shards)))


def moves(old: Placement, new: Placement) -> int:
    """Replicas started, stopped or relocated between two placements (module docstring)."""
    before = Counter(replica_key(r) for r in old.replicas)
    after = Counter(replica_key(r) for r in new.replicas)
    starts = Counter(k[0] for k in (after - before).elements())
    stops = Counter(k[0] for k in (before - after).elements())
    return sum(max(starts[m], stops[m]) for m in set(starts) | set(stops))


def moves_lower_bound(old: Allocation, new: Allocation) -> int:
    """The fewest moves any placement of `new` needs from one of `old` (module docstring)."""
    total = 0
    for llm in sorted({c.llm for c in old.llms} | {c.llm for c in new.llms}):
        a, b = _choice(old, llm), _choice(new, llm)
        d_old = a.replicas if a else 0
        d_new = b.replicas if b else 0
        same = a is not None and b is not None and a.shape == b.shape
        total += abs(d_new - d_old) if same or d_old == 0 or d_new == 0 else max(d_old, d_new)
    return total


def _choice(allocation: Allocation, llm: str) -> LlmAllocation | None:
    return next((c for c in allocation.llms if c.llm == llm), None)


def without_replicas(allocation: Allocation, placement: Placement, remove: Mapping[str, int]) -> tuple[Allocation, Placement]:
    """The plan with `remove[m]` replicas of each LLM m stopped (the highest replica indices first):
    a subset of a placement that runs, so the cluster can always run it."""
    dropped: set[tuple[str, int]] = set()
    for llm, count in remove.items():
        indices = sorted((r.replica for r in placement.replicas if r.llm == llm), reverse=True)
        dropped |= {(llm, i) for i in indices[:count]}
    kept = tuple(r for r in placement.replicas if (r.llm, r.replica) not in dropped)
    llms = tuple(replace(c, replicas=sum(1 for r in kept if r.llm == c.llm)) for c in allocation.llms)
    return Allocation(allocation.fractions_per_gpu, llms), Placement(placement.fractions_per_gpu, kept)


def same_shapes(instance: Instance, allocation: Allocation, rates_rps: Mapping[str, float], max_units: int) -> Allocation | None:
    """The fewest replicas of the running shapes (each LLM's gpu type, TP and share kept) that meet
    every workflow's latency_slo_s at `rates_rps` without overloading an LLM, within `max_units`
    share units; None where no such count exists. Greedy from one replica each: the next replica
    goes to the LLM whose extra replica lowers the worst latency / SLO ratio most (overloaded LLMs
    first), ties to the fewest units. Such a plan only starts or stops replicas: no relocation."""
    from scepsy.models.performance.alp import AllocationError, predict

    at = instance.with_arrival_rates(dict(rates_rps))
    slos = {w.name: w.latency_slo_s for w in at.workflows if w.latency_slo_s is not None}

    def score(replicas: Mapping[str, int]) -> tuple[float, int] | None:
        candidate = _with_replicas(allocation, replicas)
        try:
            prediction = predict(at, candidate)
        except AllocationError:
            return None
        if not prediction.feasible:
            return (1e6 + sum(p.utilization for p in prediction.llms if p.overloaded), candidate.units)
        worst = max((prediction.workflow(w).latency_s / slo for w, slo in slos.items()), default=0.0)
        return (worst, candidate.units)

    replicas = {c.llm: 1 for c in allocation.llms}
    while True:
        if _with_replicas(allocation, replicas).units > max_units:
            return None
        current = score(replicas)
        if current is None:
            return None
        if current[0] <= 1 + 1e-9:
            return _with_replicas(allocation, replicas)
        options = []
        for choice in allocation.llms:
            trial = dict(replicas) | {choice.llm: replicas[choice.llm] + 1}
            value = score(trial)
            if value is not None:
                options.append((value[0], choice.tp * choice.share, choice.llm))
        if not options:
            return None
        _, _, best = min(options)
        replicas[best] += 1


def _with_replicas(allocation: Allocation, replicas: Mapping[str, int]) -> Allocation:
    return Allocation(allocation.fractions_per_gpu,
                      tuple(replace(c, replicas=replicas.get(c.llm, c.replicas)) for c in allocation.llms))
