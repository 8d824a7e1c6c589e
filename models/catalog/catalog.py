"""Hardware and model catalog: the numbers the engine model (models/performance/engine.py) runs on.

Every number carries its source. GPUs: NVIDIA datasheets (dense, i.e. without structured
sparsity, bf16 tensor-core rate; HBM/GDDR bandwidth; NVLink and PCIe bandwidth as the datasheet
states it, bidirectional, per GPU). Models: the architecture fields of each model's config.json on
Hugging Face; parameter counts are derived from them (`ModelCard.params`) and checked against the
published totals in tests/test_engine.py.

Conventions:
- memory_gib is the datasheet capacity read as GiB (the driver and CUDA context take a little of it;
  the engine model's `memory_utilization` accounts for that, as vLLM's gpu_memory_utilization does);
- bandwidths are GB/s = 1e9 bytes/s; rates are TFLOP/s = 1e12 FLOP/s;
- link latencies are the small-message all-reduce latencies of NCCL/vLLM custom all-reduce
  (engineering estimates, see docs/engine-model.md), not datasheet numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    pcie_latency_us: float = 25.0  # one small all-reduce over PCIe (estimate)


@dataclass(frozen=True)
class ModelCard:
    """Architecture of one transformer (bf16 weights, bf16 KV cache)."""

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

    @property
    def layer_params(self) -> int:
        """Weights of the matrix multiplications of one layer (attention projections and MLP)."""
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.intermediate
        return q_o + k_v + mlp

    @property
    def dense_params(self) -> int:
        """Weights every token multiplies through: all layers' matrices (no embedding, no LM head)."""
        return self.layers * self.layer_params

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        """The output projection a decoder applies to each sampled position (tied or not)."""
        return 0 if self.encoder else self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Total parameters: layers + embedding (+ an untied LM head); norms and biases left out."""
        untied_head = 0 if (self.encoder or self.tied_embeddings) else self.lm_head_params
        return self.dense_params + self.embedding_params + untied_head

    @property
    def weight_bytes(self) -> float:
        return self.params * BYTES_BF16

    @property
    def weights_gib(self) -> float:
        return self.weight_bytes / 1024**3

    @property
    def streamed_weight_bytes(self) -> float:
        """Weight bytes one forward pass reads from HBM: the layers and the LM head (embedding
        rows are gathered, not streamed)."""
        return (self.dense_params + self.lm_head_params) * BYTES_BF16

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of one token in every layer, bf16; 0 for encoders (nothing is kept)."""
        return 0.0 if self.encoder else 2 * self.layers * self.kv_heads * self.head_dim * BYTES_BF16


_DATASHEET = {
    "A6000": "https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/quadro-product-literature/proviz-print-nvidia-rtx-a6000-datasheet-us-nvidia-1454980-r9-web%20(1).pdf",
    "A100": "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    "H100": "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
    "H200": "https://www.nvidia.com/en-us/data-center/h200/",
    "L40S": "https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413",
    "L4": "https://www.nvidia.com/en-us/data-center/l4/",
}

GPUS: dict[str, GpuCard] = {
    card.name: card
    for card in (
        # 48 GB GDDR6, 768 GB/s, 309.7 tensor TFLOPS with sparsity -> 154.8 dense, NVLink bridge
        # 112.5 GB/s bidirectional between two cards, PCIe Gen4 x16 (64 GB/s).
        GpuCard("A6000", 48.0, 768.0, 154.8, 112.5, 2, 64.0, _DATASHEET["A6000"], ("RTX A6000", "RTX-A6000")),
        # A100 80GB SXM: HBM2e 2,039 GB/s, BF16 312 TFLOPS dense, NVLink 600 GB/s, PCIe Gen4 64 GB/s.
        GpuCard("A100-80G", 80.0, 2039.0, 312.0, 600.0, 8, 64.0, _DATASHEET["A100"], ("A100", "A100-SXM4-80GB", "A100-80GB")),
        # A100 80GB PCIe: HBM2e 1,935 GB/s, 312 TFLOPS, no NVLink in the validation setups.
        GpuCard("A100-80G-PCIE", 80.0, 1935.0, 312.0, None, 1, 64.0, _DATASHEET["A100"], ("A100-PCIE-80GB",)),
        # A100 40GB SXM: HBM2 1,555 GB/s, 312 TFLOPS, NVLink 600 GB/s.
        GpuCard("A100-40G", 40.0, 1555.0, 312.0, 600.0, 8, 64.0, _DATASHEET["A100"], ("A100-SXM4-40GB", "A100-40GB")),
        # H100 SXM5 80GB: HBM3 3.35 TB/s, BF16 1,979 TFLOPS with sparsity -> 989.4 dense,
        # NVLink 900 GB/s, PCIe Gen5 128 GB/s.
        GpuCard("H100-SXM", 80.0, 3350.0, 989.4, 900.0, 8, 128.0, _DATASHEET["H100"], ("H100", "H100-SXM5-80GB", "H100-80GB")),
        # H200 SXM 141GB: HBM3e 4.8 TB/s, BF16 989 TFLOPS dense, NVLink 900 GB/s, PCIe Gen5.
        GpuCard("H200", 141.0, 4800.0, 989.4, 900.0, 8, 128.0, _DATASHEET["H200"], ("H200-SXM", "H200-141GB")),
        # L40S: 48 GB GDDR6, 864 GB/s, BF16 733 TFLOPS with sparsity -> 362.05 dense, no NVLink, PCIe Gen4.
        GpuCard("L40S", 48.0, 864.0, 362.05, None, 1, 64.0, _DATASHEET["L40S"]),
        # L4: 24 GB GDDR6, 300 GB/s, BF16 242 TFLOPS with sparsity -> 121 dense, no NVLink, PCIe Gen4.
        GpuCard("L4", 24.0, 300.0, 121.0, None, 1, 64.0, _DATASHEET["L4"]),
    )
}


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


def gpu(name: str, field: str = "--gpu", source: str | None = None) -> GpuCard:
    """The catalog GPU called `name` (or an alias); an InputError naming `field` if unknown."""
    card = find_gpu(name)
    if card is None:
        raise InputError(source, field, f"unknown gpu {name!r}", f"use one of: {', '.join(GPUS)}")
    return card


def model(name: str, field: str = "--model", source: str | None = None) -> ModelCard:
    """The catalog model called `name` (short name, Hugging Face id or alias); InputError if unknown."""
    card = find_model(name)
    if card is None:
        raise InputError(source, field, f"unknown model {name!r}", f"use one of: {', '.join(MODELS)}")
    return card
