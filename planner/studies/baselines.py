"""Deployments to compare on the simulator: scepsy, its ablations, and what users do instead.

Systems (`SYSTEMS`):
  scepsy                   the plan of `make_plan` (fractions, TP, replicas; CP-SAT)
  scepsy-whole-gpus        ablation: whole GPUs only (no co-location)
  scepsy-tp1               ablation: no tensor parallelism
  scepsy-whole-gpus-tp1    ablation: both
  per-llm                  each LLM sized in isolation for its own load: whole-GPU replicas with the
                           smallest TP that fits, one each, then one more at a time to the LLM with
                           the highest utilisation Lambda_m / (d_m * T_m) while GPUs remain. It sees
                           only per-LLM load and capacity, never the workflow latency.
  k8s-hpa                  per-LLM autoscaling (models/simulation/autoscaler.py) from one whole-GPU replica each,
                           changing replicas while the simulation runs
  static                   a user-given allocation file (scepsy.models.plan.document.instance_allocation)

A scepsy plan needs a feasible load; above the planner's capacity `plan_deployment` plans for the
largest feasible fraction of the load (bisection) and the simulation then shows the overload.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from scepsy.models.instance.allocation import Allocation, LlmAllocation
from scepsy.models.plan.document import instance_allocation
from scepsy.models.performance.alp import replica_curve
from scepsy.models.simulation.autoscaler import Autoscaler, GpuPool, HpaSettings
from scepsy.models.errors import InfeasibleError, InputError
from scepsy.models.instance.instance import Instance, Llm
from scepsy.models.instance.profile import units_for_memory
from scepsy.models.simulation.simulator import replica_engine

from scepsy.planner.allocation.options import SearchSpace
from scepsy.placement.feasibility.placeability import check_placement
from scepsy.planner.allocation.search import PlanSettings
from scepsy.planner.allocation.planning import make_plan

ABLATIONS = {
    "scepsy": SearchSpace(),
    "scepsy-whole-gpus": SearchSpace(whole_gpus_only=True),
    "scepsy-tp1": SearchSpace(tp_one_only=True),
    "scepsy-whole-gpus-tp1": SearchSpace(whole_gpus_only=True, tp_one_only=True),
}
SYSTEMS = (*ABLATIONS, "per-llm", "k8s-hpa", "static")


@dataclass(frozen=True)
class Deployment:
    system: str
    allocation: Allocation
    controller: Callable | None = None  # simulator controller (dynamic systems)
    planned_load: float = 1.0  # fraction of the offered load the allocation was planned for
    predicted_latency_s: dict[str, float] = field(default_factory=dict)  # scepsy systems: ALP prediction
    note: str = ""


def plan_deployment(instance: Instance, system: str = "scepsy", time_limit_s: float = 30.0,
                    bisection_steps: int = 10) -> Deployment:
    """The plan of a scepsy system at the instance's rates, or at the largest feasible fraction."""
    settings = PlanSettings(time_limit_s=time_limit_s, space=ABLATIONS[system])
    try:
        plan = make_plan(instance, settings)
        return Deployment(system, plan.allocation, predicted_latency_s={w.name: w.latency_s for w in plan.prediction.workflows})
    except InfeasibleError:
        pass
    low, high, best = 0.0, 1.0, None
    for _ in range(bisection_steps):
        mid = (low + high) / 2
        try:
            best = (mid, make_plan(instance.scaled(mid), settings))
            low = mid
        except InfeasibleError:
            high = mid
    if best is None:
        raise InfeasibleError(f"{system}: no feasible plan even at {high:.3%} of the load")
    scale, plan = best
    return Deployment(system, plan.allocation, planned_load=scale, note=f"planned for {scale:.1%} of the load (overloaded)")


def _whole_gpu_shape(instance: Instance, llm: Llm) -> tuple[str, int]:
    """The gpu type and smallest TP whose whole GPUs hold the LLM (and are profiled)."""
    cluster = instance.cluster
    best = None
    for gpu_type in cluster.used_gpu_types():
        memory = cluster.gpu_types[gpu_type].memory_gib
        for tp in llm.tp_degrees:
            if tp > cluster.largest_domain(gpu_type) or not llm.profile.has(gpu_type, tp):
                continue
            if units_for_memory(llm.memory_need_gib, tp, memory, cluster.fractions_per_gpu) > cluster.fractions_per_gpu:
                continue
            key = (tp, -cluster.gpu_count(gpu_type), gpu_type)
            if best is None or key < best[0]:
                best = (key, (gpu_type, tp))
    if best is None:
        raise InfeasibleError(f"llm {llm.name} fits no whole-GPU replica of a profiled TP degree")
    return best[1]


def per_llm_allocation(instance: Instance) -> Allocation:
    """Isolated sizing (see module doc): greedy on per-LLM utilisation, whole GPUs, smallest TP."""
    cluster = instance.cluster
    f = cluster.fractions_per_gpu
    shapes = {m.name: _whole_gpu_shape(instance, m) for m in instance.llms}
    capacity = {}
    for m in instance.llms:
        curve = replica_curve(instance, m, shapes[m.name][0], shapes[m.name][1], f)
        capacity[m.name] = curve.capacity_rps if curve is not None else 0.0
    free = {g: cluster.gpu_count(g) for g in cluster.used_gpu_types()}
    replicas = {m.name: 0 for m in instance.llms}

    def take(name: str) -> bool:
        gpu_type, tp = shapes[name]
        if free[gpu_type] < tp:
            return False
        trial = Allocation(f, tuple(
            LlmAllocation(n, shapes[n][0], shapes[n][1], f, replicas[n] + (n == name))
            for n in sorted(replicas) if replicas[n] + (n == name) > 0
        ))
        if not check_placement(cluster, trial).placeable:
            return False
        free[gpu_type] -= tp
        replicas[name] += 1
        return True

    for m in instance.llms:
        if not take(m.name):
            raise InfeasibleError(f"per-llm: not enough whole GPUs for one replica of every llm (at {m.name})")
    while True:
        load = {
            n: instance.offered_rate_rps(n) / (replicas[n] * capacity[n]) if capacity[n] > 0 else math.inf
            for n in replicas
        }
        for name in sorted(replicas, key=lambda n: (-load[n], n)):
            if take(name):
                break
        else:
            break
    return Allocation(f, tuple(LlmAllocation(n, shapes[n][0], shapes[n][1], f, replicas[n]) for n in sorted(replicas)))


def hpa_deployment(instance: Instance, settings: HpaSettings = HpaSettings()) -> Deployment:
    """One whole-GPU replica per LLM to start, and the autoscaler as the simulator's controller."""
    f = instance.cluster.fractions_per_gpu
    pool = GpuPool(instance.cluster)
    choices: list[LlmAllocation] = []
    engines: dict = {}
    leases: dict = {}
    for m in instance.llms:
        gpu_type, tp = _whole_gpu_shape(instance, m)
        engines[m.name] = replica_engine(instance, m.name, gpu_type, tp, 1.0)
        leases[m.name] = []
        for _ in range(settings.min_replicas):
            lease = pool.take(gpu_type, tp)
            if lease is None:
                raise InfeasibleError(f"k8s-hpa: no free whole GPUs for the first replica of {m.name}")
            leases[m.name].append(lease)
        choices.append(LlmAllocation(m.name, gpu_type, tp, f, settings.min_replicas))
    autoscaler = Autoscaler(settings, pool, engines, leases)
    return Deployment("k8s-hpa", Allocation(f, tuple(choices)), controller=autoscaler,
                      note=f"HPA on {settings.metric}, target {settings.target:g}")


def static_deployment(instance: Instance, path: Path | str) -> Deployment:
    allocation = instance_allocation(path, instance)
    return Deployment("static", allocation, note=str(path))


def check_system(system: str, static_path: Path | str | None = None) -> None:
    """A system `deployment` can build: one of SYSTEMS, `static` only with its allocation file."""
    if system not in SYSTEMS:
        raise InputError(None, "baselines", f"unknown system {system!r}", f"use some of: {', '.join(SYSTEMS)}")
    if system == "static" and static_path is None:
        raise InputError(None, "allocation", "the static system needs an allocation file", "pass `allocation`, a file")


def deployment(system: str, instance: Instance, *, static_path: Path | str | None = None,
               hpa: HpaSettings = HpaSettings(), time_limit_s: float = 30.0) -> Deployment:
    check_system(system, static_path)
    if system in ABLATIONS:
        return plan_deployment(instance, system, time_limit_s)
    if system == "per-llm":
        return Deployment("per-llm", per_llm_allocation(instance))
    if system == "k8s-hpa":
        return hpa_deployment(instance, hpa)
    assert static_path is not None  # check_system: the static system has its file
    return static_deployment(instance, static_path)


def fresh(dep: Deployment, instance: Instance, hpa: HpaSettings = HpaSettings()) -> Deployment:
    """A deployment whose controller has no state yet (an autoscaler is single-use)."""
    if dep.system == "k8s-hpa":
        return hpa_deployment(instance, hpa)
    return replace(dep)
