"""A plan: the chosen allocation, its placement, its predicted performance and how it was solved."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from scepsy.models.performance.alp import Prediction
from scepsy.models.instance.allocation import Allocation, Placement
from scepsy.models.plan.fragmentation import GpuTypeFragmentation


def _num(value: float | None) -> float | None:
    """JSON-safe number with 9 significant digits (stable across runs; no NaN/Infinity)."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.9g}")


def prediction_to_json(prediction: Prediction) -> dict:
    """The `workflows` and `llms` sections of a plan (field names fixed by the plan format)."""
    workflows = [
        {
            "name": w.name,
            "arrival_rate": _num(w.arrival_rate_rps),
            "latency_s": _num(w.latency_s),
            "max_throughput_rps": _num(w.max_throughput_rps),
            "bottleneck": w.bottleneck,
            "latency_slo_s": _num(w.latency_slo_s),
            "meets_slo": w.meets_slo,
            "stages": [
                {
                    "llm": s.llm,
                    "invocations": _num(s.invocations),
                    "parallelism": _num(s.parallelism),
                    "latency_contribution_s": _num(s.latency_contribution_s),
                }
                for s in w.stages
            ],
        }
        for w in prediction.workflows
    ]
    llms = [
        {
            "name": p.llm,
            "model": p.model,
            "gpu_type": p.gpu_type,
            "tp": p.tp,
            "fraction": _num(p.fraction),
            "replicas": p.replicas,
            "gpus": _num(p.gpus),
            "per_replica_rate": _num(p.per_replica_rate_rps),
            "offered_rate_rps": _num(p.offered_rate_rps),
            "latency_s": _num(p.latency_s),
            "capacity_rps": _num(p.capacity_rps),
            "utilization": _num(p.utilization),
            "overloaded": p.overloaded,
            # only for an unprofiled fraction: its curve is derived, not measured
            **({"profile_derived_from_fractions": [_num(f) for f in p.profile_derived_from]} if p.profile_derived_from else {}),
        }
        for p in prediction.llms
    ]
    return {"workflows": workflows, "llms": llms}


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
    when re-planning, the fewest `moved_shards` first; then the most `free_domains` (NVLink domains
    whose GPUs are all free whole GPUs), the most `free_gpus` (whole GPUs free), the fewest
    `shared_gpus` (GPUs holding shards of two or more LLMs)."""

    free_domains: int
    free_gpus: int
    shared_gpus: int
    moved_shards: int | None = None  # re-planning only: shards of kept-shape replicas that move
    kept_replicas: int | None = None  # re-planning only: replicas left exactly where they were

    def key(self) -> tuple[int, int, int, int]:
        """Smaller is better, compared lexicographically."""
        return (self.moved_shards or 0, -self.free_domains, -self.free_gpus, self.shared_gpus)

    def to_json(self) -> dict:
        out: dict[str, int | None] = {"free_domains": self.free_domains, "free_gpus": self.free_gpus, "shared_gpus": self.shared_gpus}
        if self.moved_shards is not None:
            out.update(moved_shards=self.moved_shards, kept_replicas=self.kept_replicas)
        return out


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

    def to_json(self, include_wall_time: bool = True) -> dict:
        out: dict[str, object] = {
            "method": self.method,
            "status": self.status,
            "wall_time_s": _num(self.wall_time_s) if include_wall_time else None,
            "objective": self.objective.to_json(),
        }
        if self.bounds:
            out["bound"] = dict(self.bounds)
        if self.gap is not None:
            out.update(gap=_num(self.gap), gap_stage=self.gap_stage)
        if self.notes:
            out["notes"] = list(self.notes)
        return out


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

    def to_json(self, include_wall_time: bool = True) -> dict:
        solver: dict[str, object] = {"backend": self.solver.backend, "wall_time_s": _num(self.solver.wall_time_s) if include_wall_time else None}
        solver.update({"iterations": self.solver.iterations, "cuts": self.solver.cuts})
        if self.solver.notes:
            solver["notes"] = list(self.solver.notes)
        out: dict = {
            "status": self.status,
            "objective": self.objective,
            "objective_value": _num(self.objective_value),
            "bound": _num(self.bound),
            "gap": _num(self.gap),
            "solver": solver,
        }
        if self.placement_info is not None:
            out["placement_solver"] = self.placement_info.to_json(include_wall_time)
        out.update({key: _num(value) for key, value in self.extras})
        out["instance"] = self.instance
        out["fractions_per_gpu"] = self.allocation.fractions_per_gpu
        out["gpus_in_use"] = self.gpus_in_use
        out.update(prediction_to_json(self.prediction))
        out["placement"] = self.placement.to_json()
        if self.fragmentation:
            out["fragmentation"] = [entry.to_json() for entry in self.fragmentation]
        return out

    def dumps(self, include_wall_time: bool = True) -> str:
        return json.dumps(self.to_json(include_wall_time), indent=2) + "\n"
