"""Benchmark instances built from the shipped profiles (the paper's LLMs on RTX A6000 nodes)."""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

from scepsy.models.instance import Instance, Llm, Stage, Workflow, load_instance
from scepsy.models.synthetic import synthetic_cluster

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
