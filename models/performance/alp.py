"""The Aggregate LLM Pipeline: workflow latency and throughput of an allocation (paper, section 4).

For LLM m with d_m replicas of (gpu_type, tp, fraction) and workflows w calling it n_wm times per
request with parallelism p_wm:

    Lambda_m = sum_w lambda_w * n_wm                      LLM-level arrival rate, requests/s
    r_m      = Lambda_m / d_m                             per-replica rate, requests/s
    L_w      = sum_m L_m(r_m) * n_wm / p_wm * f_wm * c_m  workflow latency, s; f_wm: the share of m's
                                                          busy time on the request's critical path
                                                          (1 for serial stages; models/instance/statistic.py);
                                                          c_m: m's observed call latency over its
                                                          profile's (1 but in the controller's model)
    T_w      = min_m (u * d_m * T_m - sum_{w' != w} lambda_w' * n_w'm) / n_wm
                                                          workflow throughput limit, requests/s: what
                                                          the LLMs leave for w at the other workflows'
                                                          rates (shared LLMs), each LLM kept within
                                                          u = max_utilization of its capacity

where L_m is the replica's latency curve and T_m its capacity (models/instance/profile.py). A per-replica rate
above max_utilization * T_m is infeasible (the LLM is overloaded). The margin is applied once, here:
T_w is the capacity a plan claims for w (a `max_throughput` plan at load factor s has T_w = s *
lambda_w at its bottleneck), and every command prints this one number; `headroom` is the share of
an LLM's capacity its offered load leaves free (at least 1 - max_utilization in a feasible plan).
Beside T_w each workflow has its recovery limit R_w: the highest load it returns to its steady
state from after the standard burst, and each LLM its entry limit, the calls in flight the
workflow entry lets through to it (models/performance/recovery.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scepsy.models.instance.instance import Instance, Llm, Stage, Workflow
from scepsy.models.instance.allocation import Allocation, LlmAllocation
from scepsy.models.instance.profile import ProfileCurve
from scepsy.models.performance.cards import find_gpu_card, find_model_card
from scepsy.models.performance.fraction_shape import profile_share_model
from scepsy.models.instance.workflow import continues_prompts
from scepsy.models.performance.recovery import entry_limit, recovery_limit_fcfs_rps, recovery_limit_rps


@dataclass(frozen=True)
class LlmPrediction:
    llm: str
    model: str
    gpu_type: str
    tp: int
    fraction: float
    replicas: int
    offered_rate_rps: float
    per_replica_rate_rps: float
    capacity_rps: float  # of one replica
    latency_s: float  # inf when overloaded
    utilization: float  # offered load / (replicas * capacity)
    overloaded: bool
    max_utilization: float = 1.0  # the instance's margin: the share of the capacity a plan may use
    entry_limit: int | None = None  # the entry's calls in flight past it, at most (recovery.py); None: no load to size it by
    # an unprofiled fraction: the measured fractions its curve was derived from (models/instance/profile.py)
    profile_derived_from: tuple[float, ...] = ()

    @property
    def gpus(self) -> float:
        return self.replicas * self.tp * self.fraction

    @property
    def usable_capacity_rps(self) -> float:
        """The most requests/s all replicas are planned to take: max_utilization x their capacity."""
        return self.max_utilization * self.replicas * self.capacity_rps

    @property
    def headroom(self) -> float:
        """The share of the LLM's capacity its offered load leaves free (1 - utilization)."""
        return 1.0 - self.utilization


@dataclass(frozen=True)
class StagePrediction:
    llm: str
    invocations: float
    parallelism: float
    latency_contribution_s: float
    critical_path: float = 1.0


@dataclass(frozen=True)
class WorkflowPrediction:
    name: str
    arrival_rate_rps: float
    latency_s: float
    max_throughput_rps: float
    bottleneck: str
    stages: tuple[StagePrediction, ...]
    latency_slo_s: float | None
    recovery_limit_rps: float = math.nan  # the highest load it recovers from after the standard burst, with the workflow entry (recovery.py)
    recovery_limit_fcfs_rps: float = math.nan  # the same without it, engines first come first served (0: none claimed)

    @property
    def meets_slo(self) -> bool | None:
        if self.latency_slo_s is None:
            return None
        return self.latency_s <= self.latency_slo_s * (1 + 1e-9)


@dataclass(frozen=True)
class Prediction:
    llms: tuple[LlmPrediction, ...]
    workflows: tuple[WorkflowPrediction, ...]

    @property
    def feasible(self) -> bool:
        return not any(p.overloaded for p in self.llms)

    def llm(self, name: str) -> LlmPrediction:
        return next(p for p in self.llms if p.llm == name)

    def workflow(self, name: str) -> WorkflowPrediction:
        return next(w for w in self.workflows if w.name == name)


class AllocationError(ValueError):
    """The allocation names a configuration the instance cannot run (no profile, no memory)."""


def replica_curve(instance: Instance, llm: Llm, gpu_type: str, tp: int, share: int) -> ProfileCurve | None:
    """Latency curve of one replica with `tp` shards of `share` units, or None if unavailable."""
    cluster = instance.cluster
    memory_gib = cluster.gpu_types[gpu_type].memory_gib
    fraction = share / cluster.fractions_per_gpu
    if tp * fraction * memory_gib < llm.memory_need_gib - 1e-9:
        return None
    # an unprofiled fraction: derived with the engine model's shape of this model, GPU and TP
    measured = llm.profile.measures(gpu_type, tp, fraction)
    shape = None if measured else profile_share_model(llm.profile, find_model_card(instance, llm.name),
                                                      find_gpu_card(instance, gpu_type), gpu_type, tp)
    curve = llm.profile.curve(gpu_type, tp, fraction, memory_gib, llm.weights_gib, shape)
    if curve is None or curve.capacity_rps <= 0:
        return None
    return curve


def predict_llm(instance: Instance, choice: LlmAllocation) -> LlmPrediction:
    llm = instance.llm(choice.llm)
    curve = replica_curve(instance, llm, choice.gpu_type, choice.tp, choice.share)
    if curve is None:
        raise AllocationError(
            f"llm {choice.llm}: no usable profile or not enough memory for {choice.gpu_type} tp={choice.tp} "
            f"fraction={choice.share / instance.cluster.fractions_per_gpu:g}"
        )
    offered = instance.offered_rate_rps(choice.llm)
    rate = offered / choice.replicas
    capacity = curve.capacity_rps
    overloaded = rate > instance.max_utilization * capacity * (1 + 1e-9)
    latency = math.inf if overloaded else float(curve.latency_s(rate, instance.call_latency_metric))
    usable_rps = instance.max_utilization * capacity  # per replica, the most the plan lets it take
    return LlmPrediction(
        llm=choice.llm,
        model=llm.model,
        gpu_type=choice.gpu_type,
        tp=choice.tp,
        fraction=choice.share / instance.cluster.fractions_per_gpu,
        replicas=choice.replicas,
        offered_rate_rps=offered,
        per_replica_rate_rps=rate,
        capacity_rps=capacity,
        latency_s=latency,
        utilization=offered / (choice.replicas * capacity),
        overloaded=overloaded,
        max_utilization=instance.max_utilization,
        entry_limit=entry_limit(choice.replicas * usable_rps,
                                float(curve.latency_s(usable_rps, "mean")) if usable_rps > 0 else math.inf),
        profile_derived_from=curve.derived_from,
    )


def _stage_throughput_limit_rps(llm: LlmPrediction, workflow: Workflow, stage: Stage) -> float:
    """Workflow requests/s one LLM can take for this workflow, with the other workflows' load on
    it (a shared LLM) held at their current rates and the LLM kept within max_utilization u of its
    capacity, the margin every plan keeps: (u d_m T_m - sum_{w' != w} lambda_w' n_w'm) / n_wm."""
    others = llm.offered_rate_rps - workflow.arrival_rate * stage.invocations
    return max(llm.usable_capacity_rps - others, 0.0) / stage.invocations


def predict(instance: Instance, allocation: Allocation) -> Prediction:
    """Evaluate the Aggregate LLM Pipeline of every workflow for one allocation."""
    llms = tuple(predict_llm(instance, allocation.of(m.name)) for m in instance.llms)
    by_name = {p.llm: p for p in llms}
    workflows = []
    for workflow in instance.workflows:
        factor = instance.latency_factor(workflow)
        stages = tuple(
            StagePrediction(
                s.llm, s.invocations, s.parallelism,
                by_name[s.llm].latency_s * s.invocations / s.parallelism * s.critical_path * s.latency_scale * factor,
                s.critical_path,
            )
            for s in workflow.stages
        )
        limits = {s.llm: _stage_throughput_limit_rps(by_name[s.llm], workflow, s) for s in workflow.stages}
        bottleneck = min(limits, key=lambda name: (limits[name], name))
        recovery_rps = recovery_limit_rps(limits[bottleneck], list(limits.values()))
        workflows.append(
            WorkflowPrediction(
                name=workflow.name,
                arrival_rate_rps=workflow.arrival_rate,
                latency_s=sum(s.latency_contribution_s for s in stages),
                max_throughput_rps=limits[bottleneck],
                bottleneck=bottleneck,
                stages=stages,
                latency_slo_s=workflow.latency_slo_s,
                recovery_limit_rps=recovery_rps,
                recovery_limit_fcfs_rps=recovery_limit_fcfs_rps(recovery_rps, continues_prompts(workflow.program)),
            )
        )
    return Prediction(llms, tuple(workflows))
