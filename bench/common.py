"""Benchmark instances built from the shipped profiles (the paper's LLMs on RTX A6000 nodes)."""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

from scepsy.models.instance.instance import Instance, Llm, Stage, Workflow, load_instance
import paths  # noqa: F401, E402 - examples/ and tests/support/ on the import path
from support.synthetic import synthetic_cluster

REPO = Path(__file__).resolve().parents[1]
BEAM = load_instance(REPO / "instances" / "beam-4xa6000.yaml")
RAG = load_instance(REPO / "instances" / "rag-4xa6000.yaml")
BASE_LLMS = {m.name: m for m in BEAM.llms + RAG.llms}
# per GPU, requests/s of each workflow: half of what the 4-GPU instances carry per GPU
RATE_PER_GPU = {"beam": 0.375, "rag": 1.0}


def combined_instance(n_llms: int, gpus: int, fractions_per_gpu: int = 10, load: float = 1.0) -> Instance:
    """The combined workflow (beam search + RAG) with `n_llms` LLMs on `gpus` A6000s (nodes of 4,
    NVLink pairs). LLMs beyond the paper's five are copies of them (a second beam search, ...)."""
    order = ["gen", "ver", "embed", "rerank", "rag-gen"]
    cluster = synthetic_cluster(gpus // 4, 4, [[0, 1], [2, 3]], fractions_per_gpu, gpu_type="A6000", memory_gib=48.0)
    llms: list[Llm] = []
    for k in range(n_llms):
        base = BASE_LLMS[order[k % 5]]
        llms.append(replace(base, name=base.name if k < 5 else f"{base.name}-{k // 5}"))
    workflows = []
    copies = (n_llms + 4) // 5
    for c in range(copies):
        suffix = "" if c == 0 else f"-{c}"
        names = {m.name for m in llms}
        for name, stages in (("beam", BEAM.workflows[0].stages), ("rag", RAG.workflows[0].stages)):
            kept = tuple(Stage(s.llm + suffix, s.invocations, s.parallelism) for s in stages if s.llm + suffix in names)
            if kept:
                rate = RATE_PER_GPU[name] * gpus * load / copies
                workflows.append(Workflow(name + suffix, round(rate, 6), kept))
    return Instance(cluster, tuple(llms), tuple(workflows), max_utilization=0.9, source=f"<combined {n_llms} llms {gpus} gpus F={fractions_per_gpu}>")


def timed(fn, repeats: int):
    """(median seconds, results) of `repeats` calls."""
    times, results = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        results.append(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times), results


H100 = load_instance(REPO / "instances" / "combined-8xh100.yaml")


def large_instance(gpus: int, n_llms: int = 10, fractions_per_gpu: int = 10, load: float = 0.5) -> Instance:
    """The scale benchmark: `gpus` GPUs in nodes of 8, half H100 SXM (one NVSwitch domain per
    node) and half RTX A6000 (NVLink pairs), `n_llms` LLMs (copies of the paper's five) in three
    workflows: beam search, RAG, and an agent calling the copies. Rates scale with the cluster."""
    from scepsy.models.instance.instance import GpuTypeSpec, Node
    from scepsy.models.instance.instance import Cluster

    nodes = []
    for k in range(gpus // 8):
        if k % 2 == 0:
            nodes.append(Node(f"h100-{k // 2}", "H100", 8, ((0, 1, 2, 3, 4, 5, 6, 7),)))
        else:
            nodes.append(Node(f"a6000-{k // 2}", "A6000", 8, ((0, 1), (2, 3), (4, 5), (6, 7))))
    cluster = Cluster(
        fractions_per_gpu,
        {"H100": GpuTypeSpec(memory_gib=80.0, cost_per_hour=4.0), "A6000": GpuTypeSpec(memory_gib=48.0, cost_per_hour=0.8)},
        tuple(nodes),
    )
    order = ["gen", "ver", "embed", "rerank", "rag-gen"]
    llms = []
    for k in range(n_llms):
        base = BASE_LLMS[order[k % 5]]
        llms.append(replace(base, name=base.name if k < 5 else f"{base.name}-{k // 5}"))
    names = {m.name for m in llms}
    per_gpu = {"beam": 0.6, "rag": 1.6, "agent": 0.3}
    stages = {
        "beam": BEAM.workflows[0].stages,
        "rag": RAG.workflows[0].stages,
        "agent": tuple(Stage(f"{s.llm}-1", s.invocations / 2, s.parallelism / 2 if s.parallelism >= 2 else 1.0)
                       for s in BEAM.workflows[0].stages + RAG.workflows[0].stages),
    }
    workflows = []
    for name, chain in stages.items():
        kept = tuple(s for s in chain if s.llm in names)
        if kept:
            workflows.append(Workflow(name, round(per_gpu[name] * gpus * load, 6), kept))
    return Instance(cluster, tuple(llms), tuple(workflows), max_utilization=0.9,
                    source=f"<large {gpus} gpus {n_llms} llms F={fractions_per_gpu}>")
