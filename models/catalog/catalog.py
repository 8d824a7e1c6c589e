"""Hardware and model catalog: the numbers the engine model (models/performance/engine.py) runs on.

Every number carries its source. GPUs: NVIDIA datasheets (dense, i.e. without structured
sparsity, bf16 tensor-core rate; HBM/GDDR bandwidth; NVLink and PCIe bandwidth as the datasheet
states it, bidirectional, per GPU). Models: the architecture fields of each model's config.json on
Hugging Face; parameter counts are derived from them (`ModelCard.params`) and checked against the
published totals in tests/test_engine.py.

Conventions:
- memory_gib is the datasheet capacity read as GiB (the driver and CUDA context take a little of it;
  the engine model's `memory_utilization` accounts for that, as vLLM's gpu_memory_utilization does);
- nvml_memory_mib is the total NVML reports (`nvmlDeviceGetMemoryInfo(h).total`, shown by nvidia-smi
  as "Memory-Usage ... / N MiB"), which is what GPU-sharing stacks register and divide (HAMi's
  `nvidia.com/gpumem`, MPS pinned-memory limits); it is below the nominal capacity because ECC and
  reserved regions come off (an H100 80GB reports 81559 MiB, not 81920). Sources in NVML_SOURCES;
- bandwidths are GB/s = 1e9 bytes/s; rates are TFLOP/s = 1e12 FLOP/s;
- link latencies are the small-message all-reduce latencies of NCCL/vLLM custom all-reduce
  (engineering estimates, see docs/engine-model.md), not datasheet numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from scepsy.models.errors import InputError

BYTES_BF16 = 2


@dataclass(frozen=True)
class GpuCard:
    name: str
    memory_gib: float
    hbm_gbps: float  # GB/s
    bf16_tflops: float  # dense
    nvlink_gbps: float | None  # bidirectional per GPU; None: no NVLink
    nvlink_max_gpus: int  # largest group one NVLink fabric joins (bridge: 2, NVSwitch: 8)
    pcie_gbps: float  # bidirectional, x16
    source: str
    aliases: tuple[str, ...] = ()
    nvlink_latency_us: float = 8.0  # one small all-reduce over NVLink (estimate)
    pcie_latency_us: float = 25.0  # one small all-reduce over PCIe between two GPUs (estimate)
    # a PCIe host whose switches join at most `pcie_switch_gpus` GPUs peer to peer: a larger ring's
    # slowest hop runs through the host, at `pcie_host_gbps` (effective, bidirectional; None: no such limit)
    pcie_switch_gpus: int = 8
    pcie_host_gbps: float | None = None
    nvml_memory_mib: int | None = None  # total memory NVML (nvidia-smi memory.total) reports, MiB
    # calibration against AIConfigurator's measured kernels (CALIBRATION below): the engine
    # settings' efficiencies are multiplied by these on this GPU
    compute_scale: float = 1.0
    memory_scale: float = 1.0
    link_scale: float = 1.0
    # large all-reduces over NVLink switch to a bandwidth-optimised algorithm with a longer start-up
    # (fitted against AIConfigurator where it shows: its latency, and its link scale in place of
    # link_scale); None: one algorithm for every size
    nvlink_bulk_latency_us: float | None = None
    bulk_link_scale: float = 1.0


WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "int4": 0.5}  # bytes per weight of each weight precision


@dataclass(frozen=True)
class MoeShape:
    """The mixture-of-experts MLP of `moe_layers` layers (the others keep a dense MLP): `experts`
    SwiGLU experts of width `expert_intermediate`, `experts_per_token` of them routed per token,
    plus always-active shared experts of total width `shared_intermediate`."""

    experts: int
    experts_per_token: int
    expert_intermediate: int
    moe_layers: int
    shared_intermediate: int = 0


@dataclass(frozen=True)
class MlaShape:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank query and key/value projections; the
    KV cache keeps one latent of kv_lora_rank + qk_rope_head_dim values per token and layer."""

    q_lora_rank: int  # 0: queries projected directly from the hidden state
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelCard:
    """Architecture of one transformer (bf16 weights unless `weights` says otherwise, bf16 KV cache).

    Dense decoders need only the first fields; models/catalog/model_config.py fills the rest from a
    Hugging Face config.json (mixture of experts, latent attention, sliding windows, precision)."""

    name: str
    hf_id: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    encoder: bool  # encoder-only (embedders, cross-encoder rerankers): prefill only, no KV cache kept
    gated_mlp: bool  # SwiGLU (3 matrices) or GELU MLP (2 matrices)
    tied_embeddings: bool
    max_context: int
    published_params: float  # as the model card / safetensors metadata states it
    source: str
    aliases: tuple[str, ...] = ()
    moe: MoeShape | None = None
    mla: MlaShape | None = None
    sliding_window: int | None = None  # tokens a sliding-window layer attends to
    sliding_layers: int = 0  # layers with sliding-window attention (the others attend to everything)
    weights: str = "bf16"  # precision of the layer matrices: bf16, fp8 or int4 (embeddings stay bf16)
    attention_weights: str | None = None  # precision of the attention matrices if it differs (gpt-oss)
    position_embeddings: int = 0  # learned absolute position embeddings (BERT-style encoders)

    # -- parameters -----------------------------------------------------------------------------

    @property
    def attention_params(self) -> int:
        """Weights of one layer's attention projections (query, key, value, output)."""
        if self.mla is not None:
            a = self.mla
            qk = a.qk_nope_head_dim + a.qk_rope_head_dim
            q = (self.hidden * a.q_lora_rank + a.q_lora_rank * self.heads * qk) if a.q_lora_rank else self.hidden * self.heads * qk
            kv = self.hidden * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank * self.heads * (a.qk_nope_head_dim + a.v_head_dim)
            return q + kv + self.heads * a.v_head_dim * self.hidden
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        return q_o + k_v

    @property
    def mlp_params(self) -> int:
        """Weights of one dense MLP."""
        return (3 if self.gated_mlp else 2) * self.hidden * self.intermediate

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert (0 for dense models)."""
        return 0 if self.moe is None else 3 * self.hidden * self.moe.expert_intermediate

    @property
    def _moe_fixed_params(self) -> int:
        """Weights of one MoE layer's MLP that every token uses: shared experts and the router."""
        if self.moe is None:
            return 0
        return 3 * self.hidden * self.moe.shared_intermediate + self.hidden * self.moe.experts

    @property
    def routed_expert_params(self) -> int:
        """Weights of the routed experts one token runs through (0 for dense models)."""
        return 0 if self.moe is None else self.moe.moe_layers * self.moe.experts_per_token * self.expert_params

    @property
    def _dense_mlp_layers(self) -> int:
        return self.layers - (self.moe.moe_layers if self.moe else 0)

    @property
    def layer_params(self) -> int:
        """Weights of the matrix multiplications of one dense layer (attention projections and MLP)."""
        return self.attention_params + self.mlp_params

    @property
    def dense_params(self) -> int:
        """Weights every token multiplies through (its active parameters without embedding and LM
        head): all layers' attention, dense MLPs, and per MoE layer the shared experts, the router
        and `experts_per_token` routed experts."""
        active = self.layers * self.attention_params + self._dense_mlp_layers * self.mlp_params
        if self.moe is not None:
            active += self.moe.moe_layers * (self._moe_fixed_params + self.moe.experts_per_token * self.expert_params)
        return active

    @property
    def stored_layer_params(self) -> int:
        """Weights of all layers' matrices, every expert included."""
        if self.moe is None:
            return self.dense_params
        moe_mlp = self._moe_fixed_params + self.moe.experts * self.expert_params
        return self.layers * self.attention_params + self._dense_mlp_layers * self.mlp_params + self.moe.moe_layers * moe_mlp

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden + self.position_embeddings * self.hidden

    @property
    def lm_head_params(self) -> int:
        """The output projection a decoder applies to each sampled position (tied or not)."""
        return 0 if self.encoder else self.vocab * self.hidden

    @property
    def _untied_head_params(self) -> int:
        return 0 if (self.encoder or self.tied_embeddings) else self.lm_head_params

    @property
    def params(self) -> int:
        """Total parameters: layers + embedding (+ an untied LM head); norms and biases left out."""
        return self.stored_layer_params + self.embedding_params + self._untied_head_params

    @property
    def active_params(self) -> int:
        """Parameters one token uses: active layer weights, embedding and LM head."""
        return self.dense_params + self.embedding_params + self._untied_head_params

    # -- bytes ----------------------------------------------------------------------------------

    @property
    def _layer_bytes_per_param(self) -> float:
        return WEIGHT_BYTES[self.weights]

    @property
    def _attention_bytes_per_param(self) -> float:
        return WEIGHT_BYTES[self.attention_weights or self.weights]

    def _layer_bytes(self, layer_params: int) -> float:
        """Bytes of `layer_params` layer weights, the attention at its own precision."""
        attention = self.layers * self.attention_params
        return attention * self._attention_bytes_per_param + (layer_params - attention) * self._layer_bytes_per_param

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights: layers at their precision, embedding and LM head in bf16."""
        return self._layer_bytes(self.stored_layer_params) + (self.embedding_params + self._untied_head_params) * BYTES_BF16

    @property
    def weights_gib(self) -> float:
        return self.weight_bytes / 1024**3

    @property
    def streamed_weight_bytes(self) -> float:
        """Weight bytes one forward pass of one token reads from HBM: the active layers and the LM
        head (embedding rows are gathered, not streamed)."""
        return self.streamed_weight_bytes_for(1)

    def streamed_weight_bytes_for(self, tokens: int) -> float:
        """Weight bytes one forward pass over `tokens` tokens reads: dense weights once, and per
        MoE layer every expert some token is routed to. With uniform routing the expected number
        of distinct experts that T tokens touch is E (1 - (1 - k/E)^T)."""
        streamed = self._layer_bytes(self.dense_params) + self.lm_head_params * BYTES_BF16
        if self.moe is None or tokens <= 1:
            return streamed
        extra_experts = max(self._experts_touched(tokens) - self.moe.experts_per_token, 0.0)
        return streamed + self.moe.moe_layers * extra_experts * self.expert_params * self._layer_bytes_per_param

    def _experts_touched(self, tokens: int) -> float:
        """Expected distinct routed experts of one MoE layer that `tokens` tokens use."""
        assert self.moe is not None
        e, k = self.moe.experts, self.moe.experts_per_token
        return k if tokens <= 1 else e * (1.0 - (1.0 - k / e) ** tokens)

    def routed_expert_bytes_for(self, tokens: int) -> float:
        """The routed experts' part of `streamed_weight_bytes_for(tokens)` (0 for dense models)."""
        if self.moe is None:
            return 0.0
        return self.moe.moe_layers * self._experts_touched(tokens) * self.expert_params * self._layer_bytes_per_param

    # -- KV cache and attention -----------------------------------------------------------------

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of one token in every layer, bf16 (MLA: one latent per layer); 0 for encoders.
        Sliding-window layers are counted in full: the capacity estimate stays conservative."""
        if self.encoder:
            return 0.0
        if self.mla is not None:
            return self.layers * (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim) * BYTES_BF16
        return 2 * self.layers * self.kv_heads * self.head_dim * BYTES_BF16

    def _windowed(self, positions: float, sequences: int) -> float:
        """`positions` (KV tokens or attended positions) averaged over the layers, where
        sliding-window layers see at most `window` positions per sequence."""
        if not self.sliding_layers or not self.sliding_window:
            return positions
        capped = min(positions, max(sequences, 1) * self.sliding_window)
        full = self.layers - self.sliding_layers
        return (full * positions + self.sliding_layers * capped) / self.layers

    def kv_bytes_read(self, kv_tokens: float, sequences: int) -> float:
        """KV bytes one iteration reads and writes for `kv_tokens` tokens of `sequences` sequences."""
        return self.kv_bytes_per_token * self._windowed(kv_tokens, sequences)

    def elementwise_bytes(self, tokens: int, tp: int = 1) -> float:
        """Activation bytes one GPU of `tp` reads and writes in the elementwise kernels between the
        matrix multiplications, for `tokens` tokens: per layer two normalisations with their
        residual adds (read residual and input, write both: 4 x hidden, replicated on every
        shard) and per dense-MLP layer the gate activation (read gate and up, write their product:
        3 x intermediate / tp; without a gate 2 x). Routed experts' activations are left in the
        expert term; embedding gathers are negligible."""
        dense_mlp_layers = self.layers - (self.moe.moe_layers if self.moe else 0)
        norms = self.layers * 2 * 4 * self.hidden
        activation = dense_mlp_layers * (3 if self.gated_mlp else 2) * self.intermediate / tp
        return tokens * (norms + activation) * BYTES_BF16

    def attention_flops(self, attended: float, tokens: int) -> float:
        """FLOPs of the score and value products over `attended` positions of `tokens` query
        tokens: 2 (qk dims + v dims) per head, layer and position."""
        if self.mla is not None:
            dims = self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim + self.mla.v_head_dim
        else:
            dims = 2 * self.head_dim
        return 2.0 * self.layers * self.heads * dims * self._windowed(attended, tokens)


_DATASHEET = {
    "A6000": "https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/quadro-product-literature/proviz-print-nvidia-rtx-a6000-datasheet-us-nvidia-1454980-r9-web%20(1).pdf",
    "A100": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    "H100": "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
    "H200": "https://www.nvidia.com/en-us/data-center/h200/",
    "L40S": "https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413",
    "L4": "https://www.nvidia.com/en-us/data-center/l4/",
}

# Total memory NVML reports per GPU model (MiB), as nvidia-smi prints it on a default (ECC on for
# data-centre parts) driver set-up. H100, A6000 and L4 are also the recorded NVML answers of
# tests/fixtures/nvml (memory_total_bytes / 2**20). The others are the totals nvidia-smi prints in
# public logs (found with code search on nvidia-smi output: "NVIDIA A100-SXM4-80GB ... / 81920MiB",
# "NVIDIA H200 ... / 143771MiB", "NVIDIA L40S ... / 46068MiB"). A GPU without an entry (A100 40GB)
# falls back to its nominal capacity in `reported_memory_mib`. The totals are each card's
# `nvml_memory_mib` below (the A6000's with ECC off, the workstation default).
NVML_SOURCES = (
    "tests/fixtures/nvml/*.json (recorded nvmlDeviceGetMemoryInfo totals: H100 85520809984 B, "
    "A6000 51527024640 B, L4 24152899584 B)",
    "nvidia-smi Memory-Usage totals in public logs (A100 80GB 81920MiB, "
    "H200 143771MiB, L40S 46068MiB)",
)


GPUS: dict[str, GpuCard] = {
    card.name: card
    for card in (
        # 48 GB GDDR6, 768 GB/s, 309.7 tensor TFLOPS with sparsity -> 154.8 dense, NVLink bridge
        # 112.5 GB/s bidirectional between two cards, PCIe Gen4 x16 (64 GB/s).
        GpuCard("A6000", 48.0, 768.0, 154.8, 112.5, 2, 64.0, _DATASHEET["A6000"], ("RTX A6000", "RTX-A6000"), nvml_memory_mib=49140),
        # A100 80GB SXM: HBM2e 2,039 GB/s, BF16 312 TFLOPS dense, NVLink 600 GB/s, PCIe Gen4 64 GB/s.
        GpuCard("A100-80G", 80.0, 2039.0, 312.0, 600.0, 8, 64.0, _DATASHEET["A100"], ("A100", "A100-SXM4-80GB", "A100-80GB"), nvml_memory_mib=81920),
        # A100 80GB PCIe: HBM2e 1,935 GB/s, 312 TFLOPS, no NVLink in the validation setups.
        GpuCard("A100-80G-PCIE", 80.0, 1935.0, 312.0, None, 1, 64.0, _DATASHEET["A100"], ("A100-PCIE-80GB",), nvml_memory_mib=81920),
        # A100 40GB SXM: HBM2 1,555 GB/s, 312 TFLOPS, NVLink 600 GB/s.
        GpuCard("A100-40G", 40.0, 1555.0, 312.0, 600.0, 8, 64.0, _DATASHEET["A100"], ("A100-SXM4-40GB", "A100-40GB")),
        # H100 SXM5 80GB: HBM3 3.35 TB/s, BF16 1,979 TFLOPS with sparsity -> 989.4 dense,
        # NVLink 900 GB/s, PCIe Gen5 128 GB/s.
        GpuCard("H100-SXM", 80.0, 3350.0, 989.4, 900.0, 8, 128.0, _DATASHEET["H100"], ("H100", "H100-SXM5-80GB", "H100-80GB"), nvml_memory_mib=81559),
        # H200 SXM 141GB: HBM3e 4.8 TB/s, BF16 989 TFLOPS dense, NVLink 900 GB/s, PCIe Gen5.
        GpuCard("H200", 141.0, 4800.0, 989.4, 900.0, 8, 128.0, _DATASHEET["H200"], ("H200-SXM", "H200-141GB"), nvml_memory_mib=143771),
        # L40S: 48 GB GDDR6, 864 GB/s, BF16 733 TFLOPS with sparsity -> 362.05 dense, no NVLink, PCIe Gen4.
        # pcie_switch_gpus=2: in AIConfigurator's measured L40S host two GPUs all-reduce peer to peer
        # and four do not (its vLLM custom all-reduce table, systems/data/l40s/comm/vllm/0.22.0:
        # 268M bf16 values in 28.0 ms on two GPUs, 216 ms on four); the host bandwidth is fitted below.
        GpuCard("L40S", 48.0, 864.0, 362.05, None, 1, 64.0, _DATASHEET["L40S"], nvml_memory_mib=46068,
                pcie_switch_gpus=2),
        # L4: 24 GB GDDR6, 300 GB/s, BF16 242 TFLOPS with sparsity -> 121 dense, no NVLink, PCIe Gen4.
        GpuCard("L4", 24.0, 300.0, 121.0, None, 1, 64.0, _DATASHEET["L4"], nvml_memory_mib=23034),
    )
}


# GPUs beyond the paper's, with the memory NVML reports (`nvidia-smi --query-gpu=name,memory.total`)
# beside the nominal capacity. NVML values: nvidia-smi output recorded in public repositories, e.g.
# "NVIDIA B200, 183359 MiB", "NVIDIA H100 PCIe, 81559 MiB", "NVIDIA RTX PRO 6000 Blackwell Server
# Edition, 97887 MiB" (also AIConfigurator's systems/rtx_pro_6000_server.yaml), "NVIDIA A10G,
# 23028 MiB" (AWS g5 instances).
_DATASHEET_MORE = {
    "B200": "https://www.nvidia.com/en-us/data-center/hgx/",
    "H100-PCIE": "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
    "RTX-PRO-6000": "https://www.nvidia.com/en-us/data-center/rtx-pro-6000-blackwell-server-edition/",
    "A10G": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/a10-datasheet.pdf",
}
GPUS.update({
    card.name: card
    for card in (
        # HGX B200: 180 GB HBM3e and 7.7 TB/s per GPU (1.44 TB, 62 TB/s per 8-GPU board), BF16 4.5
        # PFLOPS with sparsity -> 2,250 dense (AIConfigurator systems/b200_sxm.yaml: 2250 TFLOPS,
        # 7.7 TB/s), NVLink 5 1.8 TB/s bidirectional per GPU, PCIe Gen5 x16.
        GpuCard("B200", 180.0, 7700.0, 2250.0, 1800.0, 8, 128.0, _DATASHEET_MORE["B200"],
                ("B200-SXM", "NVIDIA B200"), nvml_memory_mib=183359),
        # H100 PCIe 80GB: HBM2e 2.0 TB/s, BF16 1,513 TFLOPS with sparsity -> 756.5 dense, NVLink
        # bridge 600 GB/s between two cards, PCIe Gen5 x16 128 GB/s.
        GpuCard("H100-PCIE", 80.0, 2000.0, 756.5, 600.0, 2, 128.0, _DATASHEET_MORE["H100-PCIE"],
                ("H100 PCIe", "H100-PCIE-80GB", "NVIDIA H100 PCIe"), nvml_memory_mib=81559),
        # RTX PRO 6000 Blackwell Server Edition: 96 GB GDDR7 at 1,792 GB/s (512-bit, 28 Gbps; same
        # on all three editions), BF16 dense 467.8 TFLOPS at its 2,430 MHz clock (AIConfigurator
        # systems/rtx_pro_6000_server.yaml), no NVLink, PCIe Gen5 x16.
        GpuCard("RTX-PRO-6000", 96.0, 1792.0, 467.8, None, 1, 128.0, _DATASHEET_MORE["RTX-PRO-6000"],
                ("RTX PRO 6000", "RTX-PRO-6000-BLACKWELL", "NVIDIA RTX PRO 6000 Blackwell Server Edition"),
                nvml_memory_mib=97887),
        # A10G (AWS G5): the A10 with 24 GB GDDR6 at 600 GB/s; BF16 250 TFLOPS with sparsity -> 125
        # dense per the A10 datasheet (the A10G runs at lower clocks: an upper bound), no NVLink,
        # PCIe Gen4 x16.
        GpuCard("A10G", 24.0, 600.0, 125.0, None, 1, 64.0, _DATASHEET_MORE["A10G"],
                ("NVIDIA A10G", "A10"), nvml_memory_mib=23028),
    )
})


# Recalibration against AIConfigurator (aiconfigurator-core 0.12.0, its vLLM databases: 0.24.0, and
# 0.14.0 for A100), fitted on 2026-12-01 by models/performance/engine_comparison.py `fit_calibration`
# on the fit half of the grid of bench/engine_model_comparison.py (every other point of each model x
# GPU x phase group sorted by batch, length and TP) and reported on the other half
# (docs/engine-model.md, "Against AIConfigurator"): per GPU, the GpuCard fields below (efficiency
# scales, the small all-reduce latency, the host path's bandwidth, over NVLink the large-message
# all-reduce's latency and link scale, B200 refitted 2026-12-01 with them). Only GPUs the built-in model
# was more than 15% off on in the fit half, and not H100-SXM, whose numbers the shipped profiles
# (instances/profiles/*.csv) were generated with.
CALIBRATION: dict[str, dict[str, float]] = {
    "B200": {"compute_scale": 0.9, "memory_scale": 1.05, "link_scale": 0.2, "nvlink_latency_us": 4,
             "nvlink_bulk_latency_us": 35.0, "bulk_link_scale": 1.1},
    "L40S": {"compute_scale": 0.85, "memory_scale": 1.075, "link_scale": 0.9, "pcie_latency_us": 2, "pcie_host_gbps": 7.5},
    "RTX-PRO-6000": {"compute_scale": 1.2, "memory_scale": 1.125, "link_scale": 0.65, "pcie_latency_us": 6},
}
for _name, _fields in CALIBRATION.items():
    _changes: dict[str, Any] = dict(_fields)  # GpuCard fields, each a number
    GPUS[_name] = replace(GPUS[_name], **_changes)


def _hf(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


MODELS: dict[str, ModelCard] = {
    card.name: card
    for card in (
        ModelCard(
            "llama-3.2-1b", "meta-llama/Llama-3.2-1B", 16, 2048, 32, 8, 64, 8192, 128256,
            encoder=False, gated_mlp=True, tied_embeddings=True, max_context=131072,
            published_params=1.24e9, source=_hf("meta-llama/Llama-3.2-1B"),
            aliases=("meta-llama/Llama-3.2-1B-Instruct",),
        ),
        ModelCard(
            "llama-3.1-8b", "meta-llama/Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256,
            encoder=False, gated_mlp=True, tied_embeddings=False, max_context=131072,
            published_params=8.03e9, source=_hf("meta-llama/Llama-3.1-8B"),
            # the PRM of the paper's beam search is a Llama-3.1-8B fine-tune (same architecture)
            aliases=("meta-llama/Llama-3.1-8B-Instruct", "RLHFlow/Llama3.1-8B-PRM-Deepseek-Data",
                     "RLHFlow/Llama3.1-8B-PRM-Mistral-Data", "llama-3.1-8b-prm"),
        ),
        ModelCard(
            "llama-3-8b", "meta-llama/Meta-Llama-3-8B", 32, 4096, 32, 8, 128, 14336, 128256,
            encoder=False, gated_mlp=True, tied_embeddings=False, max_context=8192,
            published_params=8.03e9, source=_hf("meta-llama/Meta-Llama-3-8B"),
            aliases=("meta-llama/Meta-Llama-3-8B-Instruct",),
        ),
        ModelCard(
            "llama-2-7b", "meta-llama/Llama-2-7b-hf", 32, 4096, 32, 32, 128, 11008, 32000,
            encoder=False, gated_mlp=True, tied_embeddings=False, max_context=4096,
            published_params=6.74e9, source=_hf("meta-llama/Llama-2-7b-hf"),
            aliases=("meta-llama/Llama-2-7b-chat-hf",),
        ),
        ModelCard(
            "mistral-7b", "mistralai/Mistral-7B-v0.3", 32, 4096, 32, 8, 128, 14336, 32768,
            encoder=False, gated_mlp=True, tied_embeddings=False, max_context=32768,
            published_params=7.25e9, source=_hf("mistralai/Mistral-7B-v0.3"),
            aliases=("mistralai/Mistral-7B-Instruct-v0.3",),
        ),
        ModelCard(
            "qwen2.5-7b", "Qwen/Qwen2.5-7B", 28, 3584, 28, 4, 128, 18944, 152064,
            encoder=False, gated_mlp=True, tied_embeddings=False, max_context=131072,
            published_params=7.62e9, source=_hf("Qwen/Qwen2.5-7B"),
            aliases=("Qwen/Qwen2.5-7B-Instruct",),
        ),
        ModelCard(
            "llama-3.1-70b", "meta-llama/Llama-3.1-70B", 80, 8192, 64, 8, 128, 28672, 128256,
            encoder=False, gated_mlp=True, tied_embeddings=False, max_context=131072,
            published_params=70.6e9, source=_hf("meta-llama/Llama-3.1-70B"),
            aliases=("meta-llama/Llama-3.1-70B-Instruct",),
        ),
        ModelCard(
            "e5-base-v2", "intfloat/e5-base-v2", 12, 768, 12, 12, 64, 3072, 30522,
            encoder=True, gated_mlp=False, tied_embeddings=False, max_context=512,
            published_params=109e6, source=_hf("intfloat/e5-base-v2"),
        ),
        ModelCard(
            "bge-reranker-base", "BAAI/bge-reranker-base", 12, 768, 12, 12, 64, 3072, 250002,
            encoder=True, gated_mlp=False, tied_embeddings=False, max_context=514,
            published_params=278e6, source=_hf("BAAI/bge-reranker-base"),
        ),
    )
}


def _normalise(name: str) -> str:
    return name.strip().lower()


def find_gpu(name: str) -> GpuCard | None:
    key = _normalise(name)
    for card in GPUS.values():
        if key == _normalise(card.name) or key in (_normalise(a) for a in card.aliases):
            return card
    return None


def find_model(name: str) -> ModelCard | None:
    key = _normalise(name)
    for card in MODELS.values():
        names = (card.name, card.hf_id, *card.aliases)
        if key in (_normalise(n) for n in names):
            return card
    return None


def gpu(name: str, field: str = "gpu", source: str | None = None) -> GpuCard:
    """The catalog GPU called `name` (or an alias); an InputError naming `field` if unknown."""
    card = find_gpu(name)
    if card is None:
        raise InputError(source, field, f"unknown gpu {name!r}", f"use one of: {', '.join(GPUS)}")
    return card


def model(name: str, field: str = "model", source: str | None = None) -> ModelCard:
    """The catalog model called `name` (short name, Hugging Face id or alias); InputError if unknown."""
    card = find_model(name)
    if card is None:
        raise InputError(source, field, f"unknown model {name!r}", f"use one of: {', '.join(MODELS)}")
    return card


def reported_memory_mib(gpu_type: str, nominal_gib: float) -> int:
    """The memory NVML reports for a GPU of this type (MiB); the nominal capacity when the
    catalogue has no reported total for it."""
    card = find_gpu(gpu_type)
    if card is not None and card.nvml_memory_mib is not None:
        return card.nvml_memory_mib
    return math.floor(nominal_gib * 1024)


# Hugging Face organisations whose model repositories are gated: downloading needs an access
# token of an account that accepted the licence (every meta-llama repository is gated behind the
# Llama community licence; https://huggingface.co/meta-llama). Other organisations' models in the
# catalogue (Qwen, intfloat, BAAI, RLHFlow) are public.
GATED_ORGANISATIONS = ("meta-llama",)


def is_gated(hf_id: str) -> bool:
    """Whether downloading this Hugging Face repository needs an access token."""
    return hf_id.split("/", 1)[0] in GATED_ORGANISATIONS


def encoder_task(card: ModelCard) -> str:
    """What an encoder serves: `score` for cross-encoders (rerankers: a query-document pair in,
    a relevance score out), `embed` for embedders (which also score and rerank, by the cosine of
    embeddings, as vLLM does). Cross-encoders are recognised by "rerank" or "cross-encoder" in
    their catalog or Hugging Face name."""
    names = f"{card.name} {card.hf_id} {' '.join(card.aliases)}".lower()
    return "score" if "rerank" in names or "cross-encoder" in names else "embed"


def serving_task(model_id: str) -> str:
    """What a replica of this model serves: `generate` (decoders, and models the catalogue does
    not know), `embed` (embedders) or `score` (cross-encoder rerankers)."""
    card = find_model(model_id)
    if card is None or not card.encoder:
        return "generate"
    return encoder_task(card)
