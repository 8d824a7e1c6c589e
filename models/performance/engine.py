"""A performance model of one replica of a continuous-batching LLM engine (vLLM-like).

An `Engine` is one replica: a model (models/catalog/catalog.py `ModelCard`) on `tp` shards of a GPU type,
each shard with a fraction `f` of its GPU (an MPS share). The engine runs *iterations*; each one
processes the new prompt tokens of some sequences (chunked prefill) and one token for every
decoding sequence. `iteration_time_s(batch)` is the time of one iteration:

    T        = prefill tokens + decode sequences                            tokens in the iteration
    FLOPs    = 2 * (P_dense - P_routed) * T                                 layer matmuls
             + 2 * P_head * (decode sequences + prefills finishing)         LM head (decoders only)
             + 4 * layers * heads * head_dim * A                            attention; A = attended
                                                                            positions summed over tokens
    bytes    = 2 * (P_dense - P_routed + P_head)                            weights streamed once
             + kv_bytes_per_token * (decode context + prefill past + T)     KV read and written
    compute  = FLOPs / (tp * f * bf16_rate * compute_efficiency)
    memory   = bytes / (tp * f * hbm_bandwidth * memory_efficiency)
    experts  = 2 * P_routed * T / (compute rate * moe_efficiency)           MoE: routed experts, loaded
             + expert bytes(T) / memory rate                                then multiplied (no overlap)
    elementwise = T * layers * (2 * 4 * hidden + 3 * intermediate / tp) * 2 bytes / (f * hbm * memory_efficiency)
                                                                            norms + residual adds, gate
    comm     = 2 * layers * allreduce(T * hidden * 2 bytes)                 tp > 1 only
    allreduce(B) = latency + 2 (tp-1)/tp * B / (link_bandwidth_per_direction * link_efficiency)
                   (PCIe: latency per hop, (tp - 1) hops; a ring larger than the PCIe switch group
                   runs at the host path's bandwidth; NVLink on a card with a bulk algorithm: the
                   smaller of this and the bulk one's start-up latency + bytes at its own link scale)
    overhead = iteration_overhead + layers * layer_overhead + sequences * sequence_overhead
    time     = max(compute, memory) + experts + elementwise + comm + overhead

The GPU fraction f scales compute and memory bandwidth (co-located MPS clients contend for HBM,
so a share of f is the conservative, placement-independent assumption). The link is NVLink when
the GPU has it and tp fits one NVLink fabric (2 for an RTX A6000 bridge, 8 for NVSwitch), else
PCIe. Memory: each shard gets f of its GPU; vLLM keeps `memory_utilization` of that and the rest
after the weights is KV cache:

    kv_gib = tp * f * memory_gib * memory_utilization - weights_gib

which caps the running batch (tokens held by running sequences <= kv capacity, at most
max_num_seqs sequences). Encoder-only models (embedders, cross-encoder rerankers) only prefill:
attention is bidirectional within each sequence (A = sum of squared lengths) and nothing is kept.

The efficiency and overhead constants are calibrated against published measurements; the fit
and its error are in docs/engine-model.md (bench/engine_validation.py reproduces the table). Per
GPU, the catalog's compute/memory/link scales multiply the efficiencies (fitted against
AIConfigurator, bench/engine_model_comparison.py, with the all-reduce latency and host path); the
routed-expert FLOPs of MoE models run at `moe_efficiency` of the dense rate, the expert weights
streamed per iteration are the experts its tokens touch (models/catalog/catalog.py), and
sliding-window layers read at most their window of KV.

`Engine(..., timer=...)` replaces the roofline time of every iteration by another engine model's
(`IterationTimer`, models/performance/aiconfigurator.py); memory and scheduler limits stay this module's.

This module is a public API: the simulator (models/simulation/simulator.py), profile synthesis
(models/profiles/synthesize.py) and an OpenAI-compatible emulator time token generation with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Protocol

from scepsy.models.catalog.catalog import BYTES_BF16, GpuCard, ModelCard

GIB = 1024**3
# Fitted against AIConfigurator's measured MoE kernels on the fit half of its grid (docs/engine-model.md,
# "Against AIConfigurator"; models/catalog/catalog.py CALIBRATION has the protocol): grouped expert
# GEMMs over few tokens per expert run well below the dense GEMM rate.
MOE_EFFICIENCY = 0.45


@dataclass(frozen=True)
class EngineSettings:
    """Efficiency factors, overheads and scheduler limits (defaults: calibrated, see module doc)."""

    compute_efficiency: float = 0.70  # fraction of dense bf16 peak large GEMMs reach
    memory_efficiency: float = 0.80  # fraction of HBM bandwidth weight/KV streaming reaches
    link_efficiency: float = 0.70  # fraction of per-direction link bandwidth an all-reduce reaches
    moe_efficiency: float = MOE_EFFICIENCY  # routed-expert GEMMs reach this fraction of the dense GEMMs' rate
    iteration_overhead_s: float = 1.2e-3  # scheduler, input preparation, sampling launch
    layer_overhead_s: float = 10e-6  # kernel gaps per layer (CUDA graphs keep this small)
    sequence_overhead_s: float = 6e-6  # per running sequence: sampling, detokenizing, bookkeeping
    memory_utilization: float = 0.90  # vLLM gpu_memory_utilization
    max_num_seqs: int = 256  # vLLM default
    max_num_batched_tokens: int = 2048  # vLLM's chunked-prefill token budget (API server default)

    def __post_init__(self) -> None:
        for name in ("compute_efficiency", "memory_efficiency", "link_efficiency", "moe_efficiency", "memory_utilization"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"{name} must lie in (0, 1], got {value}")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")


DEFAULT_SETTINGS = EngineSettings()


class IterationTimer(Protocol):
    """Another engine model (models/performance/aiconfigurator.py): the time of one iteration of a replica on
    whole GPUs. The Engine keeps its own memory model and scheduler limits, and divides the time by
    the GPU fraction (a share f gets f of the compute and bandwidth, as in the roofline)."""

    name: str

    def iteration_time_s(self, work: "IterationWork") -> float: ...

    def describe(self) -> str:
        """One line naming the engine model and its data (printed by the commands that use it)."""
        ...


@dataclass(frozen=True)
class IterationWork:
    """What one iteration processes (sums over the sequences scheduled in it)."""

    prefill_tokens: int = 0  # new prompt tokens computed (all prefilling sequences)
    prefill_attention: float = 0.0  # attended positions summed over those tokens
    prefill_past_tokens: int = 0  # earlier tokens (previous chunks, cached prefixes) whose KV is read
    prefills_finishing: int = 0  # sequences whose prompt completes now (each samples a token)
    decode_sequences: int = 0  # sequences generating one token each
    decode_context: int = 0  # their context lengths, summed (KV read)

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_sequences

    @property
    def sequences(self) -> int:
        return self.decode_sequences + self.prefills_finishing


@dataclass(frozen=True)
class IterationTime:
    compute_s: float
    memory_s: float
    comm_s: float
    overhead_s: float
    experts_s: float = 0.0  # routed-expert GEMMs of MoE models (weights streamed, then multiplied)
    elementwise_s: float = 0.0  # norms, residual adds and activations between the matmuls (HBM-bound)

    @property
    def total_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.experts_s + self.elementwise_s + self.comm_s + self.overhead_s

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def causal_attention(new_tokens: int, past_tokens: int = 0) -> float:
    """Attended positions of `new_tokens` causal tokens after `past_tokens` earlier ones."""
    return new_tokens * past_tokens + new_tokens * (new_tokens + 1) / 2


@dataclass(frozen=True)
class Engine:
    """One replica: `model` on `tp` shards, each with `fraction` of a `gpu` (see module doc)."""

    model: ModelCard
    gpu: GpuCard
    tp: int = 1
    fraction: float = 1.0
    settings: EngineSettings = field(default=DEFAULT_SETTINGS)
    interconnect: str | None = None  # "nvlink" or "pcie"; None: NVLink when it spans the replica
    timer: IterationTimer | None = None  # another engine model's iteration times (None: the roofline)

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction must lie in (0, 1], got {self.fraction}")
        if self.interconnect not in (None, "nvlink", "pcie"):
            raise ValueError(f"interconnect must be nvlink or pcie, got {self.interconnect!r}")

    # -- efficiencies: the settings', scaled by the GPU's calibration (models/catalog/catalog.py) ---------

    @property
    def _compute_efficiency(self) -> float:
        return min(self.settings.compute_efficiency * self.gpu.compute_scale, 1.0)

    @property
    def _memory_efficiency(self) -> float:
        return min(self.settings.memory_efficiency * self.gpu.memory_scale, 1.0)

    # -- memory ---------------------------------------------------------------------------------

    @property
    def link(self) -> str:
        if self.interconnect is not None:
            return self.interconnect
        if self.gpu.nvlink_gbps and self.tp <= self.gpu.nvlink_max_gpus:
            return "nvlink"
        return "pcie"

    @cached_property  # a frozen replica's: asked once per request by profile synthesis
    def kv_capacity_gib(self) -> float:
        """KV cache of the replica: tp * f * memory * utilisation - weights (may be <= 0: no fit)."""
        usable = self.tp * self.fraction * self.gpu.memory_gib * self.settings.memory_utilization
        return usable - self.model.weights_gib

    @property
    def fits(self) -> bool:
        return self.kv_capacity_gib > 0

    @cached_property
    def kv_capacity_tokens(self) -> int:
        """Tokens whose KV fits at once (encoders keep none: their batch is capped by the budget)."""
        if self.model.encoder:
            return 2**62
        return max(int(self.kv_capacity_gib * GIB / self.model.kv_bytes_per_token), 0)

    def max_batch(self, context_tokens: int) -> int:
        """Most sequences of `context_tokens` each that can run at once."""
        by_memory = self.kv_capacity_tokens // max(context_tokens, 1)
        return int(min(self.settings.max_num_seqs, by_memory))

    # -- time -----------------------------------------------------------------------------------

    def _allreduce_s(self, nbytes: float) -> float:
        """A ring all-reduce of `nbytes` (alpha-beta): latency + 2 (tp-1)/tp nbytes / bandwidth."""
        ring_bytes = 2 * (self.tp - 1) / self.tp * nbytes
        efficiency = min(self.settings.link_efficiency * self.gpu.link_scale, 1.0)
        if self.link == "nvlink" and self.gpu.nvlink_gbps is not None:  # a GPU without NVLink: PCIe
            per_direction = self.gpu.nvlink_gbps / 2 * 1e9
            small = self.gpu.nvlink_latency_us * 1e-6 + ring_bytes / (per_direction * efficiency)
            if self.gpu.nvlink_bulk_latency_us is None:
                return small
            # large messages switch to a bandwidth-optimised algorithm with a longer start-up (the
            # faster of the two: the engine picks it by size)
            bulk_efficiency = min(self.settings.link_efficiency * self.gpu.bulk_link_scale, 1.0)
            bulk = self.gpu.nvlink_bulk_latency_us * 1e-6 + ring_bytes / (per_direction * bulk_efficiency)
            return min(small, bulk)
        # over PCIe the small-message latency grows with the ring's hops (the card's figure: two GPUs)
        latency_s = self.gpu.pcie_latency_us * 1e-6 * (self.tp - 1)
        if self.gpu.pcie_host_gbps is not None and self.tp > self.gpu.pcie_switch_gpus:
            # the ring leaves the PCIe switch: its slowest hop runs through the host, at the
            # bandwidth fitted for that path (an effective figure: no efficiency applies)
            return latency_s + ring_bytes / (self.gpu.pcie_host_gbps / 2 * 1e9)
        return latency_s + ring_bytes / (self.gpu.pcie_gbps / 2 * 1e9 * efficiency)

    def breakdown(self, work: IterationWork) -> IterationTime:
        """The parts of one iteration's time (see the module doc for the formulas)."""
        m, s = self.model, self.settings
        tokens = work.tokens
        if tokens <= 0:
            return IterationTime(0.0, 0.0, 0.0, 0.0)
        attended = work.prefill_attention + work.decode_context
        expert_flops = 2.0 * m.routed_expert_params * tokens
        expert_bytes = m.routed_expert_bytes_for(tokens)
        flops = 2.0 * m.dense_params * tokens - expert_flops
        flops += 2.0 * m.lm_head_params * work.sequences
        flops += m.attention_flops(attended, tokens)
        kv_tokens = work.decode_context + work.prefill_past_tokens + tokens
        nbytes = m.streamed_weight_bytes_for(tokens) - expert_bytes + m.kv_bytes_read(kv_tokens, max(work.sequences, 1))
        share = self.tp * self.fraction
        flop_rate = share * self.gpu.bf16_tflops * 1e12 * self._compute_efficiency
        byte_rate = share * self.gpu.hbm_gbps * 1e9 * self._memory_efficiency
        compute_s = flops / flop_rate
        memory_s = nbytes / byte_rate
        # grouped expert GEMMs over few tokens per expert: loading and multiplying do not overlap
        experts_s = expert_flops / (flop_rate * s.moe_efficiency) + expert_bytes / byte_rate
        # separate kernels between the matmuls, streaming activations: they add to the matmuls' time
        elementwise_s = m.elementwise_bytes(tokens, self.tp) / (byte_rate / self.tp)
        comm_s = 0.0
        if self.tp > 1:
            comm_s = 2 * m.layers * self._allreduce_s(tokens * m.hidden * BYTES_BF16)
        overhead_s = s.iteration_overhead_s + m.layers * s.layer_overhead_s + work.sequences * s.sequence_overhead_s
        return IterationTime(compute_s, memory_s, comm_s, overhead_s, experts_s, elementwise_s)

    def iteration_time_s(self, work: IterationWork) -> float:
        if self.timer is not None:
            return self.timer.iteration_time_s(work) / self.fraction
        return self.breakdown(work).total_s

    def decode_step_time_s(self, batch: int, mean_context: float) -> float:
        """One decode iteration of `batch` sequences of `mean_context` tokens each."""
        return self.iteration_time_s(
            IterationWork(decode_sequences=batch, decode_context=int(round(batch * mean_context)))
        )

    def decode_run_times_s(self, batch: int, context: int, steps: int) -> list[float]:
        """Times of `steps` consecutive decode iterations of the same `batch` sequences whose
        contexts sum to `context` at the first one (each iteration adds one token per sequence).
        Equal to calling `iteration_time_s` step by step, without building the work objects."""
        first = self.breakdown(IterationWork(decode_sequences=batch, decode_context=context))
        if steps <= 1:
            return [first.total_s][:steps]
        if self.timer is not None or self.model.sliding_layers:
            # not linear in the step: time every step
            return [self.iteration_time_s(IterationWork(decode_sequences=batch, decode_context=context + i * batch))
                    for i in range(steps)]
        m, s = self.model, self.settings
        share = self.tp * self.fraction
        compute_slope = m.attention_flops(batch, batch) / (
            share * self.gpu.bf16_tflops * 1e12 * self._compute_efficiency
        )
        memory_slope = m.kv_bytes_per_token * batch / (share * self.gpu.hbm_gbps * 1e9 * self._memory_efficiency)
        fixed = first.experts_s + first.elementwise_s + first.comm_s + first.overhead_s
        return [
            max(first.compute_s + i * compute_slope, first.memory_s + i * memory_slope) + fixed for i in range(steps)
        ]

    def prefill_time_s(self, prompt_tokens: int, cached_tokens: int = 0, sequences: int = 1) -> float:
        """Prefill of one request alone (chunked by the token budget); `sequences` independent
        sequences of equal length share it (a reranker request scores several pairs)."""
        new = max(prompt_tokens - cached_tokens, 0)
        if self.model.encoder or sequences > 1:
            per_seq = prompt_tokens / sequences
            attention = sequences * per_seq * per_seq if self.model.encoder else sequences * causal_attention(int(per_seq))
            return self.iteration_time_s(
                IterationWork(prefill_tokens=prompt_tokens, prefill_attention=attention, prefills_finishing=sequences)
            )
        budget = self.settings.max_num_batched_tokens
        total, done = 0.0, 0
        while True:
            chunk = min(budget, new - done) if new > done else 0
            past = cached_tokens + done
            last = done + chunk >= new
            total += self.iteration_time_s(
                IterationWork(
                    prefill_tokens=max(chunk, 1),
                    prefill_attention=causal_attention(max(chunk, 1), past),
                    prefill_past_tokens=past,
                    prefills_finishing=1 if last else 0,
                )
            )
            done += chunk
            if last:
                return total

    def request_time_s(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """Latency of one request alone on the replica: prefill (first token) then decode steps."""
        total = self.prefill_time_s(prompt_tokens, cached_tokens)
        if self.model.encoder:
            return total
        for k in range(1, max(completion_tokens, 1)):
            total += self.decode_step_time_s(1, prompt_tokens + k)
        return total


def engine_for(model: ModelCard, gpu: GpuCard, tp: int = 1, fraction: float = 1.0, **settings) -> Engine:
    """Convenience constructor: `engine_for(model("llama-3.1-8b"), gpu("H100"), tp=2)`."""
    return Engine(model, gpu, tp, fraction, replace(DEFAULT_SETTINGS, **settings) if settings else DEFAULT_SETTINGS)
