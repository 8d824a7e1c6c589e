"""A plan: the chosen allocation, its placement, its predicted performance and how it was solved.

Its JSON document is written (and read back) by models/plan/document.py alone."""

from __future__ import annotations

from dataclasses import dataclass, field

from scepsy.models.performance.alp import Prediction
from scepsy.models.instance.allocation import Allocation, Placement
from scepsy.models.plan.fragmentation import GpuTypeFragmentation


@dataclass(frozen=True)
class SolverInfo:
    backend: str
    wall_time_s: float
    iterations: int = 1  # allocation solves, one more per placement cut
    cuts: int = 0
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlacementObjective:
    """A placement's lexicographic objective (docs/placement.md), in the order it is optimised:
    when re-planning, the fewest `moved_shards` first and the fewest `occupied_units` second; then the most `free_domains` (NVLink domains
    whose GPUs are all free whole GPUs), the most `free_gpus` (whole GPUs free), the fewest
    `shared_gpus` (GPUs holding shards of two or more LLMs)."""

    free_domains: int
    free_gpus: int
    shared_gpus: int
    moved_shards: int | None = None  # re-planning only: shards of kept-shape replicas that move
    kept_replicas: int | None = None  # re-planning only: replicas left exactly where they were
    occupied_units: int | None = None  # re-planning only: units of new replicas beyond what is free now

    def key(self) -> tuple[int, int, int, int, int]:
        """Smaller is better, compared lexicographically."""
        return (self.moved_shards or 0, self.occupied_units or 0, -self.free_domains, -self.free_gpus, self.shared_gpus)


@dataclass(frozen=True)
class PlacementInfo:
    """How the placement was found: method, proof status, objective, bounds and gap."""

    method: str  # "heuristic" or "cpsat"
    status: str  # "optimal" (every stage proven), "feasible" (a stage hit the time limit) or "heuristic"
    objective: PlacementObjective
    wall_time_s: float
    bounds: tuple[tuple[str, int], ...] = ()  # (stage, best bound) of each stage solved
    gap: float | None = None  # relative gap of the first stage not proven optimal
    gap_stage: str | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    status: str  # "optimal" or "feasible"
    objective: str
    objective_value: float
    bound: float
    gap: float
    solver: SolverInfo
    allocation: Allocation
    prediction: Prediction
    placement: Placement
    extras: tuple[tuple[str, float], ...] = field(default_factory=tuple)  # objective-specific numbers
    instance: str | None = None  # the instance file the plan was made from
    placement_info: PlacementInfo | None = None  # set by scepsy.placement (method, objective, gap)
    fragmentation: tuple[GpuTypeFragmentation, ...] = ()  # what the placement leaves free, per gpu type

    @property
    def gpus_in_use(self) -> int:
        """Physical GPUs hosting at least one shard."""
        return len(self.placement.busy_gpus())
