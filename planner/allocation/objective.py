"""Objectives, shared by every backend: lexicographic stages over the LLM latencies and GPU usage.

Latency stages (the `welfare` of the instance decides how several workflows combine):
  one workflow:          L_w                                                     [s]
  egalitarian (default): max_w  weight_w * L_w / ref_w, then the social mean      [-], [s]
                         (ref_w = latency_slo_s, else the workflow's own optimum alone on the cluster)
  social:                sum_w weight_w lambda_w L_w / sum_w weight_w lambda_w   [s]
with L_w = sum_m n_wm / p_wm * f_wm * L_m (f_wm the critical-path share, 1 for serial stages). Objectives (instance `objective`):
  min_latency:     latency stages, then the fewest share units
  min_gpus:        fewest GPUs hosting a shard, subject to L_w <= latency_slo_s for every workflow
                   with an SLO; then latency stages; then share units
  min_cost:        least sum_g cost_per_hour_g * GPUs of type g, same constraints and tie-breaks
  min_units:       fewest share units sum_m t_m s_m d_m (GPU-hours paid per unit of 1/F GPU), same
                   constraints; then latency stages. On a cluster that shares GPUs (F > 1) min_gpus
                   fills every GPU it takes; min_units holds only the units that meet the SLOs
  max_throughput:  largest load factor s feasible at s * lambda (with the SLOs), found by bisection
                   in planner/allocation/search.py; the plan at s uses the min_latency stages and the SLOs.
Every stage is monotone in each LLM's latency and in its share units, which is what makes the
options' dominance pruning (planner/allocation/options.py) exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union, cast

from scepsy.models.instance.instance import Instance

# a plan meets an SLO when L_w <= latency_slo_s * (1 + SLO_TOLERANCE), in every backend and in
# the prediction (models/performance/alp.py): float sums in another order must not flip an exact fit
SLO_TOLERANCE = 1e-9
OBJECTIVES = ("min_latency", "max_throughput", "min_gpus", "min_cost", "min_units")
WELFARES = ("egalitarian", "social")


@dataclass(frozen=True)
class LatencySum:
    """sum_m weights[m] * L_m."""

    name: str
    weights: Mapping[str, float]


@dataclass(frozen=True)
class MaxLatencySum:
    """max over rows r of sum_m weights[r][m] * L_m (the egalitarian ratio)."""

    name: str
    weights: Mapping[str, Mapping[str, float]]


def latency_rows(stage: LatencySum | MaxLatencySum) -> dict[str, dict[str, float]]:
    """A latency stage as rows of LLM weights whose max is the stage value (one row for a sum)."""
    if isinstance(stage, LatencySum):
        return {stage.name: dict(stage.weights)}
    return {r: dict(row) for r, row in stage.weights.items()}


@dataclass(frozen=True)
class GpuCount:
    """sum_g cost[g] * (GPUs of type g hosting at least one shard)."""

    name: str
    cost: Mapping[str, float]


@dataclass(frozen=True)
class ShareUnits:
    """sum over LLMs of tp * share * replicas (units of 1/F GPU)."""

    name: str = "units"


Stage = Union[LatencySum, MaxLatencySum, GpuCount, ShareUnits]


@dataclass(frozen=True)
class Usage:
    """What an allocation uses, for evaluating GPU stages."""

    units: int
    gpus_by_type: Mapping[str, int]  # physical GPUs hosting a shard


@dataclass(frozen=True)
class Objective:
    kind: str
    stages: tuple[Stage, ...]
    coefficients: Mapping[str, Mapping[str, float]]  # workflow -> llm -> n_wm / p_wm
    latency_limits: Mapping[str, float]  # workflow -> L_w bound [s] (hard constraints)

    @property
    def latency_only(self) -> bool:
        """No GPU-count stage: every stage is exact from the options alone (latencies and share
        units), without the placement of fewest GPUs."""
        return not any(isinstance(s, GpuCount) for s in self.stages)

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def workflow_latencies(self, latency_by_llm: Mapping[str, float]) -> dict[str, float]:
        return {w: sum(c * latency_by_llm[m] for m, c in coefs.items()) for w, coefs in self.coefficients.items()}

    def within_limits(self, latency_by_llm: Mapping[str, float]) -> bool:
        return not self.broken_limits(latency_by_llm)

    def broken_limits(self, latency_by_llm: Mapping[str, float]) -> list[str]:
        """The workflows whose latency limit the LLM latencies break, in name order."""
        latencies = self.workflow_latencies(latency_by_llm)
        return [w for w, limit in sorted(self.latency_limits.items()) if latencies[w] > limit * (1 + SLO_TOLERANCE)]

    def values(self, latency_by_llm: Mapping[str, float], usage: Usage | None = None) -> tuple[float, ...]:
        """The stage values of one allocation (GPU stages need `usage`)."""
        out = []
        for stage in self.stages:
            if isinstance(stage, LatencySum):
                out.append(sum(w * latency_by_llm[m] for m, w in stage.weights.items()))
            elif isinstance(stage, MaxLatencySum):
                out.append(max(sum(w * latency_by_llm[m] for m, w in row.items()) for row in stage.weights.values()))
            elif isinstance(stage, GpuCount):
                out.append(sum(stage.cost[g] * n for g, n in (usage.gpus_by_type if usage else {}).items()))
            else:
                out.append(float(usage.units) if usage else float("nan"))
        return tuple(out)


def _latency_stages(instance: Instance, references: Mapping[str, float], welfare: str) -> list[Stage]:
    coefficients = {w.name: {s.llm: s.latency_weight * instance.latency_factor(w) for s in w.stages} for w in instance.workflows}
    weights = {w.name: w.weight for w in instance.workflows}
    rates = {w.name: w.arrival_rate for w in instance.workflows}
    if len(instance.workflows) == 1:
        (only,) = coefficients.values()
        return [LatencySum("latency_s", dict(only))]
    total = sum(weights[w] * rates[w] for w in coefficients)
    social: dict[str, float] = {}
    for w, coefs in coefficients.items():
        for m, c in coefs.items():
            social[m] = social.get(m, 0.0) + weights[w] * rates[w] / total * c
    mean = LatencySum("mean_latency_s", social)
    if welfare == "social":
        return [mean]
    ratios = {w: {m: weights[w] * c / references[w] for m, c in coefs.items()} for w, coefs in coefficients.items()}
    return [MaxLatencySum("max_latency_ratio", ratios), mean]


def needs_references(instance: Instance, kind: str) -> bool:
    """Egalitarian latency stages need ref_w; workflows with an SLO use it as their reference."""
    return (
        len(instance.workflows) > 1
        and instance.welfare == "egalitarian"
        and any(w.latency_slo_s is None for w in instance.workflows)
    )


def build_objective(instance: Instance, references: Mapping[str, float] | None = None, kind: str | None = None) -> Objective:
    """The stages of `kind` (default: the instance's objective; max_throughput plans at a fixed
    load use the min_latency stages with the SLOs as constraints). Every objective but min_latency
    bounds L_w by latency_slo_s; share units come last as a tie-break, except in min_units, where
    they are the first stage and the latency stages break its ties."""
    kind = kind or instance.objective
    refs = dict(references or {})
    for w in instance.workflows:
        if w.latency_slo_s is not None:
            refs.setdefault(w.name, w.latency_slo_s)
    coefficients = {w.name: {s.llm: s.latency_weight * instance.latency_factor(w) for s in w.stages} for w in instance.workflows}
    latency = _latency_stages(instance, refs, instance.welfare)
    limits = {} if kind == "min_latency" else {w.name: w.latency_slo_s for w in instance.workflows if w.latency_slo_s is not None}
    if kind == "min_gpus":
        stages = [GpuCount("gpus", {g: 1.0 for g in instance.cluster.used_gpu_types()}), *latency]
    elif kind == "min_cost":
        costs = {g: float(cast(float, instance.cluster.gpu_types[g].cost_per_hour)) for g in instance.cluster.used_gpu_types()}  # priced: checked by the instance
        stages = [GpuCount("cost_per_hour", costs), *latency]
    elif kind == "min_units":
        # the fewest share units first, the latency stages only among plans of that many units
        return Objective(kind, (ShareUnits(), *latency), coefficients, limits)
    else:
        stages = latency
    return Objective(kind, tuple(stages) + (ShareUnits(),), coefficients, limits)
