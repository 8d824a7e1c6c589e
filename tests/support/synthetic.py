"""Seeded synthetic instances for tests and benchmarks (no files: profiles are built in memory).

Profiles follow a simple, monotone shape per (gpu_type, tp, fraction): light-load latency
L0 = base / (tp^0.7 * fraction^0.8) seconds, capacity T = rate * tp^0.9 * fraction requests/s, and
L(r) = L0 * (1 + 2 (r/T)^3) up to T, with one unstable row above T as a real sweep would record.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from scepsy.models.instance.instance import Cluster, GpuTypeSpec, Instance, Llm, Node, Stage, Workflow
from scepsy.models.instance.profile import build_profile

RATE_POINTS = (0.05, 0.25, 0.5, 0.75, 0.9, 1.0)


def _profile_frame(gpu_type: str, tps, fractions, base_latency_s: float, base_rate_rps: float) -> pd.DataFrame:
    rows = []
    for tp in tps:
        for fraction in fractions:
            light = base_latency_s / (tp**0.7 * fraction**0.8)
            capacity = base_rate_rps * tp**0.9 * fraction
            for point in RATE_POINTS + (1.3,):
                rate = point * capacity
                latency = light * (1 + 2 * min(point, 1.0) ** 3)
                rows.append(
                    {
                        "gpu_type": gpu_type,
                        "tp": tp,
                        "fraction": fraction,
                        "arrival_rate": rate,
                        "throughput": min(rate, capacity),
                        "latency_mean": latency,
                        "latency_p50": 0.9 * latency,
                        "latency_p90": 1.5 * latency,
                        "latency_p99": 2.2 * latency,
                    }
                )
    return pd.DataFrame(rows)


def synthetic_cluster(
    nodes: int,
    gpus_per_node: int,
    domains: list[list[int]],
    fractions_per_gpu: int,
    gpu_type: str = "G",
    memory_gib: float = 40.0,
    extra_types: dict[str, tuple[int, float]] | None = None,
) -> Cluster:
    """`nodes` nodes of `gpus_per_node` GPUs with the given NVLink domains; optional extra types
    {name: (node count, memory_gib)} with the same node shape."""
    def node_list(prefix: str, count: int, kind: str) -> list[Node]:
        listed = {g for d in domains for g in d}
        parts = tuple(sorted([tuple(sorted(d)) for d in domains] + [(g,) for g in range(gpus_per_node) if g not in listed]))
        return [Node(f"{prefix}-{i}", kind, gpus_per_node, parts) for i in range(count)]

    types = {gpu_type: GpuTypeSpec(memory_gib=memory_gib)}
    all_nodes = node_list("node", nodes, gpu_type)
    for name, (count, memory) in (extra_types or {}).items():
        types[name] = GpuTypeSpec(memory_gib=memory)
        all_nodes += node_list(name.lower(), count, name)
    return Cluster(fractions_per_gpu, types, tuple(all_nodes))


def random_instance(
    seed: int,
    n_llms: int = 3,
    nodes: int = 1,
    gpus_per_node: int = 4,
    domains: list[list[int]] | None = None,
    fractions_per_gpu: int = 4,
    n_workflows: int = 1,
    load: float = 0.5,
    tp_choices: tuple[int, ...] = (1, 2, 4),
    second_type_nodes: int = 0,
    slo_factor: float | None = None,
    objective: str = "min_latency",
    welfare: str = "egalitarian",
) -> Instance:
    """A random instance; `load` scales arrival rates against the cluster's capacity (>1 is often
    infeasible). LLM memory needs vary so that some need TP or large shares. With
    `second_type_nodes`, a second GPU type "H" (twice the memory, 1.6x faster) joins the cluster,
    both with prices; with `slo_factor`, every workflow gets latency_slo_s = slo_factor times its
    latency with every LLM at light load on one whole GPU of type G."""
    rng = np.random.default_rng(seed)
    domains = domains if domains is not None else [list(range(gpus_per_node))]
    extra = {"H": (second_type_nodes, 80.0)} if second_type_nodes else None
    cluster = synthetic_cluster(nodes, gpus_per_node, domains, fractions_per_gpu, extra_types=extra)
    prices = {"G": 1.0, "H": round(float(rng.uniform(1.2, 2.5)), 2)}
    cluster = replace(cluster, gpu_types={g: t.model_copy(update={"cost_per_hour": prices[g]}) for g, t in cluster.gpu_types.items()})
    largest = max((len(d) for d in domains), default=1)
    fractions = sorted({1.0, 0.5} | {round(k / fractions_per_gpu, 6) for k in (1, fractions_per_gpu // 2) if k >= 1})
    total_gpus = (nodes + second_type_nodes) * gpus_per_node
    light: dict[str, float] = {}
    llms = []
    for i in range(n_llms):
        tps = tuple(t for t in tp_choices if t <= largest and (t == 1 or rng.random() < 0.7)) or (1,)
        base_latency, base_rate = float(rng.uniform(0.05, 2.0)), float(rng.uniform(2.0, 40.0))
        frame = _profile_frame("G", tps, fractions, base_latency, base_rate)
        if second_type_nodes:
            fast = _profile_frame("H", tps, fractions, base_latency / 1.6, base_rate * 1.6)
            frame = pd.concat([frame, fast], ignore_index=True)
        light[f"m{i}"] = base_latency
        need = float(rng.choice([0.1, 0.3, 0.6, 0.9, 1.4])) * 40.0  # GiB; 1.4 x 40 needs tp >= 2
        llms.append(
            Llm(
                name=f"m{i}",
                model=f"synthetic/model-{i}",
                weights_gib=round(0.8 * need, 3),
                min_kv_gib=round(0.2 * need, 3),
                tp_degrees=tps,
                profile_path=f"<synthetic m{i}>",
                profile=build_profile(frame, f"<synthetic m{i}>"),
            )
        )
    workflows = []
    names = [m.name for m in llms]
    for w in range(n_workflows):
        used = names if n_workflows == 1 else sorted(rng.choice(names, size=int(rng.integers(1, len(names) + 1)), replace=False))
        stages = tuple(
            Stage(m, float(rng.choice([1.0, 2.0, 4.0])), 1.0) for m in used
        )
        stages = tuple(Stage(s.llm, s.invocations, float(rng.uniform(1.0, s.invocations))) for s in stages)
        rate = load * total_gpus * 10.0 / sum(s.invocations for s in stages) / max(1, n_workflows)
        slo = None
        if slo_factor is not None:
            slo = round(slo_factor * sum(light[s.llm] * s.invocations / s.parallelism for s in stages), 4)
        weight = round(float(rng.choice([1.0, 1.0, 2.0])), 1)
        workflows.append(Workflow(f"w{w}", round(float(rate * rng.uniform(0.5, 1.5)), 4), stages, slo, weight))
    used_llms = {s.llm for w in workflows for s in w.stages}
    llms = [m for m in llms if m.name in used_llms]
    return Instance(
        cluster=cluster, llms=tuple(llms), workflows=tuple(workflows), objective=objective, welfare=welfare,
        source=f"<random seed={seed}>",
    )
