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

Gateway pod of an LLM with R replicas: cpu request 1 + R/4 cores (rounded up to 250m), limit twice
that; memory 1 GiB + 256 MiB per replica (the cache-aware radix tree and per-worker state),
request = limit.
"""

from __future__ import annotations

import math

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


def _millicores(cores: float) -> str:
    milli = math.ceil(cores * 4) * 250
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"


def gateway_resources(replicas: int) -> tuple[dict[str, str], dict[str, str]]:
    """(requests, limits) of a gateway container."""
    cpu = 1 + replicas / 4
    memory_mib = 1024 + 256 * replicas
    requests = {"cpu": _millicores(cpu), "memory": f"{memory_mib}Mi"}
    limits = {"cpu": _millicores(2 * cpu), "memory": f"{memory_mib}Mi"}
    return requests, limits
