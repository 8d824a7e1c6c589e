"""Generate the shipped instances' profiles from an analytic model of one serving replica.

    python instances/generate_profiles.py            # rewrites instances/profiles/*.csv

Reproducible (no randomness) and documented in instances/README.md. The model, per replica of an
LLM with P parameters on `tp` GPUs with `fraction` of each (MPS share of SMs, bandwidth and memory):

    bandwidth  B = fraction * tp * hbm_gbps * 0.75            achievable HBM bandwidth, GB/s
    compute    C = fraction * tp * bf16_tflops * 0.45         achievable dense bf16, TFLOP/s
    all-reduce a = 2 * layers * (8 us + 2 * hidden * 2 B / nvlink_gbps)   per decode step, tp > 1
    decode step with b running sequences of mean context c:
               tau(b) = (weight_bytes + b * c * kv_bytes_per_token) / B + 2 P b / C + a
    prefill of I tokens (batched into the step):  2 P I / C
    service time of a request with I prompt and O output tokens at mean batch b:
               S(b) = 2 P I / C * (1 + b / 8) + O * tau(b)        (decoder)
               S(b) = weight_bytes / B + 2 P I b / C               (encoder: one batched pass)
    KV capacity limits the batch: b_max = min(256, (tp * fraction * memory - weights) / (c * kv_bytes_per_token))
    At arrival rate r the mean batch solves b = r * S(b) (Little's law); capacity T = b_max / S(b_max).
    Queueing near saturation: L(r) = S(b) * (1 + rho^8 / (1 - rho)) with rho = r / T.
    Percentiles scale the mean by the spread of output lengths: p50 0.85x, p90 1.6x, p99 2.4x.

Rows sweep r from 2% to 110% of T; rows above T report throughput T (unstable, as a real sweep would).
A later issue replaces this model with the engine model and SimPy-synthesized profiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent

GIB = 1024**3

# Datasheet numbers: RTX A6000 (NVIDIA RTX A6000 datasheet: 48 GB GDDR6, 768 GB/s, 154.8 dense FP16/bf16
# tensor TFLOPS, NVLink bridge 112.5 GB/s), H100 SXM5 80GB (NVIDIA H100 datasheet: 3.35 TB/s HBM3,
# 989.4 dense bf16 TFLOPS, NVLink 900 GB/s).
GPUS = {
    "A6000": {"memory_gib": 48.0, "hbm_gbps": 768.0, "bf16_tflops": 154.8, "nvlink_gbps": 112.5},
    "H100": {"memory_gib": 80.0, "hbm_gbps": 3350.0, "bf16_tflops": 989.4, "nvlink_gbps": 900.0},
}


@dataclass(frozen=True)
class ModelCard:
    """Architecture numbers from the models' config.json on Hugging Face."""

    params_b: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    encoder: bool = False

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * 2  # bf16

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


MODELS = {
    "llama-3.2-1b": ModelCard(1.24, 16, 2048, 8, 64),
    "llama-3.1-8b-prm": ModelCard(8.03, 32, 4096, 8, 128),
    "llama-3-8b": ModelCard(8.03, 32, 4096, 8, 128),
    "e5-base-v2": ModelCard(0.109, 12, 768, 12, 64, encoder=True),
    "bge-reranker-base": ModelCard(0.278, 12, 768, 12, 64, encoder=True),
}


@dataclass(frozen=True)
class Request:
    """Mean request shape of the LLM's role in its workflow (tokens)."""

    prompt: int
    output: int


# role -> (model card, request shape, min KV GiB, GPU types and TP degrees to profile)
PROFILES = {
    "llama-3.2-1b": ("llama-3.2-1b", Request(800, 160), 1.0),
    "llama-3.1-8b-prm": ("llama-3.1-8b-prm", Request(1200, 1), 2.0),
    "llama-3-8b": ("llama-3-8b", Request(1500, 200), 2.0),
    "e5-base-v2": ("e5-base-v2", Request(48, 0), 0.25),
    "bge-reranker-base": ("bge-reranker-base", Request(3200, 0), 0.5),
}
TP_DEGREES = {"A6000": (1, 2), "H100": (1, 2, 4, 8)}
FRACTIONS = (0.2, 0.5, 1.0)
RATE_POINTS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1)
PERCENTILE_FACTORS = {"p50": 0.85, "p90": 1.6, "p99": 2.4}


def service_time_s(card: ModelCard, request: Request, gpu: dict, tp: int, fraction: float, batch: float) -> float:
    bandwidth = fraction * tp * gpu["hbm_gbps"] * 0.75 * 1e9
    compute = fraction * tp * gpu["bf16_tflops"] * 0.45 * 1e12
    flops_per_token = 2 * card.params_b * 1e9
    if card.encoder:
        return card.weight_bytes / bandwidth + flops_per_token * request.prompt * max(batch, 1.0) / compute
    allreduce = 0.0 if tp == 1 else 2 * card.layers * (8e-6 + 2 * card.hidden * 2 / (gpu["nvlink_gbps"] * 1e9))
    context = request.prompt + request.output / 2
    step = (card.weight_bytes + batch * context * card.kv_bytes_per_token) / bandwidth
    step += flops_per_token * batch / compute + allreduce
    prefill = flops_per_token * request.prompt / compute * (1 + batch / 8)
    return prefill + request.output * step


def max_batch(card: ModelCard, request: Request, gpu: dict, tp: int, fraction: float) -> float:
    kv_bytes = tp * fraction * gpu["memory_gib"] * GIB - card.weight_bytes
    if card.encoder:
        return 64.0
    return min(256.0, kv_bytes / ((request.prompt + request.output) * card.kv_bytes_per_token))


def mean_batch(card, request, gpu, tp, fraction, rate) -> float:
    """Solve b = rate * S(b) by bisection (S is increasing in b)."""
    low, high = 0.0, max_batch(card, request, gpu, tp, fraction)
    for _ in range(100):
        mid = (low + high) / 2
        if rate * service_time_s(card, request, gpu, tp, fraction, mid) > mid:
            low = mid
        else:
            high = mid
    return high


def profile_rows(name: str, gpu_type: str) -> list[dict]:
    card_name, request, min_kv_gib = PROFILES[name]
    card = MODELS[card_name]
    gpu = GPUS[gpu_type]
    rows = []
    for tp in TP_DEGREES[gpu_type]:
        for fraction in FRACTIONS:
            if tp * fraction * gpu["memory_gib"] * GIB < card.weight_bytes + min_kv_gib * GIB:
                continue
            b_max = max_batch(card, request, gpu, tp, fraction)
            capacity = b_max / service_time_s(card, request, gpu, tp, fraction, b_max)
            for point in RATE_POINTS:
                rate = point * capacity
                rho = min(point, 0.999)
                batch = mean_batch(card, request, gpu, tp, fraction, min(rate, capacity))
                mean = service_time_s(card, request, gpu, tp, fraction, batch) * (1 + rho**8 / (1 - rho))
                row = {
                    "gpu_type": gpu_type,
                    "tp": tp,
                    "fraction": fraction,
                    "arrival_rate": rate,
                    "throughput": min(rate, capacity),
                    "latency_mean": mean,
                }
                row.update({f"latency_{p}": mean * k for p, k in PERCENTILE_FACTORS.items()})
                rows.append(row)
    return rows


def main() -> None:
    from scepsy.models.profile import write_profile

    out = HERE / "profiles"
    for name in PROFILES:
        rows = [row for gpu_type in GPUS for row in profile_rows(name, gpu_type)]
        write_profile(pd.DataFrame(rows), out / f"{name}.csv")
        print(f"wrote {out / (name + '.csv')} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
