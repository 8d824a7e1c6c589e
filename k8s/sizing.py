"""CPU and memory of the engine and gateway pods, sized from the model (rule in docs/deploy.md).

Engine pod of an LLM with weights W GiB on T GPUs (one engine process per GPU plus the API server
that tokenizes and detokenizes):
    cpu request  = 2 + 2 T cores          (each GPU's process busy-polls one core; the API server and
                                           the tokenizer take two)
    cpu limit    = 2 x request            (headroom for bursts of tokenization; never throttled below
                                           the request)
    memory       = ceil(W) + 4 (T + 1) + shm GiB, request = limit
                                          (the weights pass through host memory while loading:
                                           safetensors are memory-mapped, so the page cache counts
                                           against the pod; about 4 GiB per Python process with
                                           torch and CUDA; the memory-backed /dev/shm counts too)
    /dev/shm     = 2 GiB for T = 1 (vLLM's and SGLang's inter-process queues),
                   `shm_gib` (default 16 GiB) for T > 1 (NCCL's shared-memory transport)
Memory request = limit: a pod is never killed for using what it asked for, and the scheduler
reserves the whole amount (no overcommit of host memory on GPU nodes).

Gateway pod of an LLM: sized from nothing a re-plan changes, so that applying a re-plan with more
or fewer replicas never rewrites (and restarts) a gateway. Its costs, measured on the gateway binary
(sglang-router 0.3.2, bench/gateway_memory.py): 87 MiB resident with one worker, 91 MiB with 64 (the
workers themselves cost next to nothing); no growth per request under round_robin; under
cache_aware, the approximate radix tree it routes by keeps the prompt text it routed (one byte per
ASCII character) plus 3.3 to 4.1 KiB per prompt; 0.3 to 0.5 ms of CPU per request either way. What
grows with the replicas is the tree, which keeps up to `--max-tree-size` characters per worker
(least recently used first out, every 60 s). So:
    tree characters per worker = min(2^26 (the gateway's default), 2^28 / M)
        with M the most replicas of the LLM the cluster could hold (most_replicas: every GPU that
        fits it filled with its smallest share), a fact of the instance, not of the plan:
        at most 2^28 characters in the whole tree, whatever the plan;
    cpu request 1 core, limit 2;
    memory 1 GiB (the process, request bodies in flight, eviction lag) + 2^28 x 5 bytes = 2304 MiB
        for cache_aware (5 bytes per character holds for prompts whose new text is at least
        1000 characters, about 250 tokens); 1 GiB for round_robin (no tree); request = limit.

Endpoint picker of an LLM's InferencePool (`--router inference-gateway`): also sized from M (the
same reason: a re-plan never rewrites a picker). Its work grows with the endpoints it serves: it
scrapes each one's /metrics every 50 ms (the picker's `--refresh-metrics-interval` default) and
keeps a prefix-cache index of up to 31250 blocks per endpoint (the prefix-cache scorer's LRU
default); upstream publishes no sizing per pool size, only its chart's request for high request
rates (8 CPU, 8 GiB, limit 16 GiB for llm-d-router v0.10.0; 4 CPU for the extension's v1.5.0).
scepsy's estimate, not a measurement:
    cpu request  = 0.5 core + 50 m per possible endpoint, at most the chart's request;
    memory       = 512 MiB + 16 MiB per possible endpoint, at most the chart's 8 GiB; limit 2 x that
                   (at most the chart's 16 GiB).
Raise them (or use the chart's) when the picker's CPU throttles or its scheduling latency grows
(its metrics on port 9090).
"""

from __future__ import annotations

import math

from scepsy.models.instance.instance import Instance
from scepsy.models.instance.profile import units_for_memory

SHM_SINGLE_GPU_GIB = 2
PROCESS_MEMORY_GIB = 4


def shm_gib(tp: int, shm_multi_gpu_gib: int) -> int:
    return SHM_SINGLE_GPU_GIB if tp == 1 else shm_multi_gpu_gib


def engine_resources(weights_gib: float, tp: int, shm_multi_gpu_gib: int) -> tuple[dict[str, str], dict[str, str]]:
    """(requests, limits) of an engine container, without its GPU resources."""
    cpu = 2 + 2 * tp
    memory = math.ceil(weights_gib) + PROCESS_MEMORY_GIB * (tp + 1) + shm_gib(tp, shm_multi_gpu_gib)
    requests = {"cpu": str(cpu), "memory": f"{memory}Gi"}
    limits = {"cpu": str(2 * cpu), "memory": f"{memory}Gi"}
    return requests, limits


# the gateway's cache-aware tree: its default characters per worker, and what scepsy lets the whole tree hold
DEFAULT_TREE_CHARS = 2**26
TREE_BUDGET_CHARS = 2**28
TREE_BYTES_PER_CHAR = 5  # text + node overhead, for prompts whose new text is >= 1000 characters (bench/gateway_memory.py)
GATEWAY_BASE_MIB = 1024
GATEWAY_CPU = 1


def most_replicas(instance: Instance, llm: str) -> int:
    """The most replicas of the LLM the instance's cluster could hold if it had every GPU of a type that
    fits it: on each node, with the TP degree that gives the most, each GPU split into the smallest
    shares that hold its weights and minimum KV cache. An upper bound that only the instance sets."""
    spec = instance.llm(llm)
    cluster = instance.cluster
    f = cluster.fractions_per_gpu
    total = 0
    for node in cluster.nodes:
        memory_gib = float(cluster.gpu_types[node.gpu_type].memory_gib)
        best = 0
        for tp in spec.tp_degrees:
            if tp > max(len(d) for d in node.domains):
                continue
            units = units_for_memory(spec.memory_need_gib, tp, memory_gib, f)
            if units <= f:
                best = max(best, node.gpus * (f // units) // tp)
        total += best
    return max(total, 1)


def tree_chars_per_worker(most: int) -> int:
    """`--max-tree-size` of a cache-aware gateway whose LLM could have `most` replicas."""
    return min(DEFAULT_TREE_CHARS, TREE_BUDGET_CHARS // most)


PICKER_BASE_MILLICPU = 500
PICKER_MILLICPU_PER_ENDPOINT = 50
PICKER_BASE_MIB = 512
PICKER_MIB_PER_ENDPOINT = 16
PICKER_CHART_MEMORY_MIB = 8192


def picker_resources(most: int, chart_cpu_cores: int) -> tuple[dict[str, str], dict[str, str]]:
    """(requests, limits) of an endpoint picker whose pool could have `most` replicas."""
    millicpu = min(chart_cpu_cores * 1000, PICKER_BASE_MILLICPU + PICKER_MILLICPU_PER_ENDPOINT * most)
    memory_mib = min(PICKER_CHART_MEMORY_MIB, PICKER_BASE_MIB + PICKER_MIB_PER_ENDPOINT * most)
    return {"cpu": f"{millicpu}m", "memory": f"{memory_mib}Mi"}, {"memory": f"{2 * memory_mib}Mi"}


def gateway_resources(cache_aware: bool) -> tuple[dict[str, str], dict[str, str]]:
    """(requests, limits) of a gateway container: the same for every plan of an instance."""
    memory_mib = GATEWAY_BASE_MIB + (TREE_BUDGET_CHARS * TREE_BYTES_PER_CHAR >> 20 if cache_aware else 0)
    requests = {"cpu": str(GATEWAY_CPU), "memory": f"{memory_mib}Mi"}
    limits = {"cpu": str(2 * GATEWAY_CPU), "memory": f"{memory_mib}Mi"}
    return requests, limits
