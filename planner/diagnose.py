"""Name the binding reason when no plan exists (the message of exit code 3)."""

from __future__ import annotations

from scepsy.models.alp import replica_curve
from scepsy.models.instance import Instance, Llm

from .options import Option, SearchSpace, gpu_types_for, max_replicas, shares_for, tp_degrees_for


def _restrictions(space: SearchSpace) -> str:
    parts = []
    if space.whole_gpus_only:
        parts.append("whole GPUs only")
    if space.tp_one_only:
        parts.append("TP=1 only")
    return f" ({', '.join(parts)})" if parts else ""


def _no_options_reason(instance: Instance, llm: Llm, space: SearchSpace) -> str:
    cluster = instance.cluster
    offered = instance.offered_rate_rps(llm.name)
    best_memory = 0.0
    best_rate, best_config = 0.0, ""
    for gpu_type in gpu_types_for(instance, space):
        memory = cluster.gpu_types[gpu_type].memory_gib
        for tp in tp_degrees_for(instance, llm, gpu_type, space):
            for share in shares_for(cluster, space):
                best_memory = max(best_memory, tp * share / cluster.fractions_per_gpu * memory)
                curve = replica_curve(instance, llm, gpu_type, tp, share)
                if curve is None:
                    continue
                replicas = max_replicas(cluster, gpu_type, tp, share)
                rate = replicas * curve.capacity_rps * instance.max_utilization
                if rate > best_rate:
                    fraction = share / cluster.fractions_per_gpu
                    best_rate = rate
                    best_config = f"{replicas} replicas of {gpu_type} tp={tp} fraction={fraction:g}"
    if best_rate == 0.0:
        return (
            f"llm {llm.name} cannot fit its memory: it needs {llm.memory_need_gib:g} GiB "
            f"(weights_gib + min_kv_gib) per replica but gets at most {best_memory:g} GiB{_restrictions(space)}"
        )
    return (
        f"throughput of llm {llm.name} cannot be met even with all GPUs: it must serve {offered:g} req/s "
        f"but at most {best_rate:g} req/s fit ({best_config}){_restrictions(space)}"
    )


def explain_infeasible(instance: Instance, options: dict[str, list[Option]], space: SearchSpace) -> str:
    """One sentence naming what binds: memory, one LLM's throughput, total GPUs, or placement."""
    for llm in instance.llms:
        if not options.get(llm.name):
            return _no_options_reason(instance, llm, space)
    cluster = instance.cluster
    f = cluster.fractions_per_gpu
    free_units = sum(cluster.free_units(n.name, g) for n in cluster.nodes for g in range(n.gpus))
    least = {m: min(o.units for o in opts) for m, opts in options.items()}
    if sum(least.values()) > free_units:
        needs = ", ".join(f"{m} >= {u / f:g}" for m, u in least.items())
        return (
            f"the LLMs together need at least {sum(least.values()) / f:g} GPUs to meet their throughput "
            f"({needs}) but the cluster has {free_units / f:g} GPUs free"
        )
    return (
        "every allocation that meets the throughput fails placement: the replicas' shards cannot be packed "
        "onto distinct GPUs of single NVLink domains (too many tensor-parallel replicas for the domains, "
        "or shares that fragment the GPUs); add GPUs or NVLink-connected nodes, or lower the arrival rates"
    )
