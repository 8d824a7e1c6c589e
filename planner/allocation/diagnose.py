"""Name the binding reason when no plan exists (the message of exit code 3)."""

from __future__ import annotations

from scepsy.models.instance.instance import Instance, Llm

from scepsy.planner.allocation.objective import Objective
from scepsy.planner.allocation.options import Option, SearchSpace, configurations, max_servable


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
    best_rate, best_config = max_servable(instance, llm, space)
    if best_rate == 0.0:
        best_memory = max(
            (tp * share / cluster.fractions_per_gpu * cluster.gpu_types[g].memory_gib for g, tp, share in configurations(instance, llm, space)),
            default=0.0,
        )
        return (
            f"llm {llm.name} cannot fit its memory: it needs {llm.memory_need_gib:g} GiB "
            f"(weights_gib + min_kv_gib) per replica but gets at most {best_memory:g} GiB{_restrictions(space)}"
        )
    return (
        f"throughput of llm {llm.name} cannot be met even with all GPUs: it must serve {offered:g} req/s "
        f"but at most {best_rate:g} req/s fit ({best_config}){_restrictions(space)}"
    )


def _slo_reason(instance: Instance, options: dict[str, list[Option]], objective: Objective) -> str | None:
    """A workflow whose SLO is below its latency with every LLM at its fastest option."""
    for workflow, limit in sorted(objective.latency_limits.items()):
        coefs = objective.coefficients[workflow]
        fastest = sum(c * min(o.latency_s for o in options[m]) for m, c in coefs.items())
        if fastest > limit * (1 + 1e-9):
            return (
                f"workflow {workflow} cannot meet its latency_slo_s of {limit:g} s: even with each of its LLMs "
                f"in its fastest configuration it takes {fastest:.4g} s; relax the SLO or lower the arrival rate"
            )
    if objective.latency_limits:
        return (
            "the latency SLOs of "
            + ", ".join(sorted(objective.latency_limits))
            + " cannot all be met together at these arrival rates on this cluster; relax an SLO, lower the rates or add GPUs"
        )
    return None


def explain_infeasible(
    instance: Instance, options: dict[str, list[Option]], space: SearchSpace, objective: Objective | None = None
) -> str:
    """One sentence naming what binds: memory, one LLM's throughput, total GPUs, SLOs, or placement."""
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
    slo = _slo_reason(instance, options, objective) if objective is not None else None
    if slo is not None:
        return slo
    return (
        "every allocation that meets the throughput fails placement: the replicas' shards cannot be packed "
        "onto distinct GPUs of single NVLink domains (too many tensor-parallel replicas for the domains, "
        "or shares that fragment the GPUs); add GPUs or NVLink-connected nodes, or lower the arrival rates"
    )
