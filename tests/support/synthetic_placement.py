"""Seeded random placement cases (clusters with mixed NVLink layouts and reservations, placeable
allocations with mixed TP degrees and fractional shares), for tests and bench/placement_scaling.py.

An allocation is made placeable by construction: replicas are added one at a time at random spots
(a random LLM, a random NVLink domain with room, random GPUs with room) until the cluster is filled
to `fill` of its free units or nothing more fits; the allocation is what was placed. The random
spots are thrown away -- the placement methods start from the allocation alone.
"""

from __future__ import annotations

import numpy as np

from scepsy.models.instance.allocation import Allocation, LlmAllocation
from scepsy.models.instance.instance import Cluster, GpuTypeSpec, Node

LAYOUTS_8 = (
    ((0, 1, 2, 3, 4, 5, 6, 7),),  # NVSwitch: one domain
    ((0, 1, 2, 3), (4, 5, 6, 7)),  # two quads
    ((0, 1), (2, 3), (4, 5), (6, 7)),  # NVLink pairs
)


def random_cluster(
    rng: np.random.Generator,
    nodes: int,
    gpus_per_node: int,
    layouts: tuple,
    fractions_per_gpu: int,
    reserved_gpus: float = 0.0,
    gpu_type: str = "G",
) -> Cluster:
    """`nodes` nodes, each with a random layout of `layouts`; about `reserved_gpus` of the GPUs
    carry a random reservation of 1..F units."""
    chosen = [layouts[int(rng.integers(len(layouts)))] for _ in range(nodes)]
    node_list = []
    for k, layout in enumerate(chosen):
        listed = {g for d in layout for g in d}
        domains = tuple(sorted([tuple(d) for d in layout] + [(g,) for g in range(gpus_per_node) if g not in listed]))
        node_list.append(Node(f"node-{k:04d}", gpu_type, gpus_per_node, domains))
    reserved = {}
    for node in node_list:
        for g in range(gpus_per_node):
            if rng.random() < reserved_gpus:
                reserved[(node.name, g)] = int(rng.integers(1, fractions_per_gpu + 1))
    return Cluster(fractions_per_gpu, {gpu_type: GpuTypeSpec(memory_gib=80.0)}, tuple(node_list), reserved)


def random_allocation(
    rng: np.random.Generator,
    cluster: Cluster,
    n_llms: int,
    tp_choices: tuple[int, ...] = (1, 2, 4, 8),
    fill: float = 0.8,
) -> Allocation:
    """A placeable allocation filling about `fill` of the free units (module docstring)."""
    f = cluster.fractions_per_gpu
    gpu_type = cluster.used_gpu_types()[0]
    largest = cluster.largest_domain(gpu_type)
    shapes = []
    for m in range(n_llms):
        tp = int(rng.choice([t for t in tp_choices if t <= largest]))
        # whole GPUs for some, fractions for the others (larger TP: more often whole)
        whole = rng.random() < (0.3 + 0.1 * tp)
        share = f if whole else int(rng.integers(1, f + 1))
        shapes.append((f"m{m}", tp, share))
    free = {(n.name, g): cluster.free_units(n.name, g) for n in cluster.nodes for g in range(n.gpus)}
    domains = cluster.domains()
    target = fill * sum(free.values())
    used, counts, misses = 0, [0] * n_llms, 0
    while used < target and misses < 4 * n_llms:
        m = int(rng.integers(n_llms))
        _, tp, share = shapes[m]
        spots = [d for d in domains if sum(free[(d.node, g)] >= share for g in d.gpus) >= tp]
        if not spots:
            misses += 1
            continue
        domain = spots[int(rng.integers(len(spots)))]
        fitting = [g for g in domain.gpus if free[(domain.node, g)] >= share]
        for g in rng.choice(fitting, size=tp, replace=False):
            free[(domain.node, int(g))] -= share
        counts[m] += 1
        used += tp * share
    choices = tuple(
        LlmAllocation(name, gpu_type, tp, share, counts[m]) for m, (name, tp, share) in enumerate(shapes) if counts[m] > 0
    )
    return Allocation(f, choices)


def random_case(
    seed: int,
    nodes: int,
    gpus_per_node: int = 8,
    layouts: tuple = LAYOUTS_8,
    fractions_per_gpu: int = 10,
    n_llms: int = 8,
    tp_choices: tuple[int, ...] = (1, 2, 4, 8),
    fill: float = 0.8,
    reserved_gpus: float = 0.05,
) -> tuple[Cluster, Allocation]:
    rng = np.random.default_rng(seed)
    cluster = random_cluster(rng, nodes, gpus_per_node, layouts, fractions_per_gpu, reserved_gpus)
    return cluster, random_allocation(rng, cluster, n_llms, tp_choices, fill)
