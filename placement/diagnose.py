"""Why an allocation cannot be placed: the binding reason, as one sentence (exit code 3).

Checked in order, each a necessary condition of placeability, so the first one that fails is a
proof by itself:
1. an LLM's gpu type is not in the cluster, or its TP degree exceeds every NVLink domain of it;
2. one LLM alone: more replicas than fit the cluster (per domain, n replicas of t shards fit iff
   sum_i min(c_i // s, n) >= n t -- placement/feasibility/packing.py);
3. all replicas on a gpu type need more units than are free on it (reservations deducted);
4. replicas with TP >= t need more units than the domains of at least t GPUs have free;
5. bin-packing: the shards too large to share a GPU (dual feasible functions, planner/allocation/cpsat.py)
   need more GPUs than there are;
otherwise the exact model proved that the replicas cannot be packed together.
"""

from __future__ import annotations

from scepsy.models.instance.allocation import Allocation
from scepsy.models.instance.instance import Cluster
from scepsy.placement.feasibility.packing import free_in_domains, gpu_weight_capacity, max_replicas, packing_weights


def _gpus(units: int, f: int) -> str:
    return f"{units / f:g}"


def explain_unplaceable(cluster: Cluster, allocation: Allocation) -> str:
    """The first necessary condition that fails, else the exact model's verdict (module docstring)."""
    return necessary_condition_violated(cluster, allocation) or (
        "the replicas cannot be packed together (the exact placement model proves it): TP replicas and "
        "shares fragment the NVLink domains; add GPUs or NVLink-connected nodes, or change the allocation"
    )


def necessary_condition_violated(cluster: Cluster, allocation: Allocation) -> str | None:
    """Checks 1-5 of the module docstring; None when all hold."""
    f = cluster.fractions_per_gpu
    for c in allocation.llms:
        fraction = c.share / f
        if c.gpu_type not in cluster.used_gpu_types():
            return f"llm {c.llm} needs {c.gpu_type} GPUs, which the cluster does not have"
        largest = cluster.largest_domain(c.gpu_type)
        if c.tp > largest:
            return (
                f"llm {c.llm} has tp {c.tp} but the largest NVLink domain of {c.gpu_type} has {largest} GPUs: "
                "a replica's shards must share one NVLink domain"
            )
        most = max_replicas(cluster, c.gpu_type, c.tp, c.share)
        if most < c.replicas:
            return (
                f"llm {c.llm} alone: {c.replicas} replicas of tp {c.tp} x fraction {fraction:g} on {c.gpu_type} "
                f"need {c.tp} GPUs with {fraction:g} free in one NVLink domain each, but at most {most} fit "
                "(after reservations)"
            )
    for gpu_type in sorted({c.gpu_type for c in allocation.llms}):
        choices = [c for c in allocation.llms if c.gpu_type == gpu_type]
        frees = free_in_domains(cluster, gpu_type, 1)  # free units -> GPUs, counted per domain kind
        free = sum(units * gpus for units, gpus in frees.items())
        need = sum(c.units for c in choices)
        if need > free:
            return f"the replicas on {gpu_type} need {_gpus(need, f)} GPUs but {_gpus(free, f)} are free (after reservations)"
        for t in sorted({c.tp for c in choices if c.tp > 1}):
            room = sum(units * gpus for units, gpus in free_in_domains(cluster, gpu_type, t).items())
            wide = sum(c.units for c in choices if c.tp >= t)
            if wide > room:
                return (
                    f"the replicas with tp >= {t} on {gpu_type} need {_gpus(wide, f)} GPUs inside NVLink domains of "
                    f"at least {t} GPUs, which have {_gpus(room, f)} free"
                )
        for weight in packing_weights(f):
            load = sum(c.tp * c.replicas * weight[c.share] for c in choices)
            capacity = sum(k * gpu_weight_capacity(weight, units) for units, k in frees.items())
            if load > capacity and weight[f] > 1:
                big = min(s for s in range(1, f + 1) if weight[s] == weight[f])
                small = min(s for s in range(1, f + 1) if weight[s] > 0)
                return (
                    f"on {gpu_type}, shards of at least {big / f:g} GPU leave no room for another of at least "
                    f"{small / f:g}: counting them, the shards need more GPUs than the {frees.total()} there are"
                )
    return None
