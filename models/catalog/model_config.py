"""Model cards from a Hugging Face `config.json` (a local file or model directory; no hub access).

`card_from_config(path, weights=None)` reads the architecture fields that decide a model's weights,
FLOPs and KV cache, under the names the common families use:

    layers          num_hidden_layers | n_layer | num_layers
    hidden          hidden_size | n_embd | d_model
    heads           num_attention_heads | n_head
    kv_heads        num_key_value_heads (GQA; default: heads, i.e. multi-head attention)
    head_dim        head_dim (default hidden / heads)
    intermediate    intermediate_size | n_inner | ffn_dim
    vocab           vocab_size
    max_context     max_position_embeddings | n_positions | max_seq_len
    tied            tie_word_embeddings (default: the family's -- Gemma ties, Llama/Qwen/Mistral do not)
    MoE             num_local_experts | num_experts | n_routed_experts  (experts)
                    num_experts_per_tok | experts_per_token | top_k_experts  (routed per token)
                    moe_intermediate_size (else intermediate_size: Mixtral, gpt-oss)
                    n_shared_experts x moe_intermediate_size | shared_expert_intermediate_size
                    first_k_dense_replace, mlp_only_layers, decoder_sparse_step, moe_layer_freq
    MLA             kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
    sliding window  sliding_window with layer_types (gpt-oss, Gemma 3), sliding_window_pattern,
                    Gemma 2's alternation, or every layer (Mistral v0.1; Qwen only with
                    use_sliding_window)
    precision       quantization_config.quant_method: fp8 -> fp8; mxfp4, awq, gptq (4 bits) -> int4;
                    modules_to_not_convert naming the attention keeps it in bf16 (gpt-oss)
    encoder         BERT-style encoders (model_type bert, roberta, xlm-roberta, ...): prefill only,
                    no KV cache, 2-matrix GELU MLP, learned absolute position embeddings

A multimodal config's language model (`text_config`) is used. Anything the card cannot represent
(a linear-attention hybrid, an encoder-decoder) is an InputError naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scepsy.models.catalog.catalog import WEIGHT_BYTES, MlaShape, ModelCard, MoeShape
from scepsy.models.errors import InputError

MAX_CONFIG_BYTES = 8 * 1024 * 1024  # real config.json files are a few kB (the largest list per-layer fields)
ENCODER_TYPES = {"bert", "roberta", "xlm-roberta", "distilbert", "electra", "camembert", "mpnet", "nomic_bert", "modernbert"}
TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text", "gpt2", "gpt_neo", "opt"}
UNGATED_DECODERS = {"gpt2", "gpt_neo", "gptj", "gpt_neox", "opt", "falcon", "phi", "starcoder2", "bloom"}


def _config_path(path: Path) -> Path:
    if path.is_dir():
        candidate = path / "config.json"
        if not candidate.is_file():
            raise InputError(str(path), None, "no config.json in the directory", "give a model directory with config.json or the file itself")
        return candidate
    if not path.is_file():
        raise InputError(str(path), None, "file not found", "give a local config.json or a model directory (no hub access)")
    return path


def read_config(path: Path | str) -> tuple[Path, dict]:
    """The parsed config.json at `path` (a file or a model directory), size-bounded."""
    file = _config_path(Path(path))
    with open(file, "rb") as handle:
        raw = handle.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise InputError(str(file), None, f"larger than {MAX_CONFIG_BYTES // 1024**2} MiB", "give the model's config.json")
    try:
        config = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(str(file), None, f"not JSON ({exc})", "give the model's config.json") from None
    if not isinstance(config, dict):
        raise InputError(str(file), None, "not a JSON object", "give the model's config.json")
    return file, config


class _Fields:
    """Typed access to a config's fields with errors that name the file and the field."""

    def __init__(self, config: dict, source: str):
        self.config, self.source = config, source

    def get(self, *names: str) -> Any:
        for name in names:
            if self.config.get(name) is not None:
                return self.config[name]
        return None

    def integer(self, *names: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.get(*names)
        if value is None:
            if default is not None:
                return default
            raise InputError(self.source, names[0], "missing", f"a config.json of a transformer has {names[0]}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < minimum:
            raise InputError(self.source, names[0], f"{value!r} is not an integer >= {minimum}", "fix the config.json")
        return int(value)


def _is_encoder(config: dict) -> bool:
    return str(config.get("model_type", "")).lower() in ENCODER_TYPES


def _moe(f: _Fields, layers: int, intermediate: int) -> MoeShape | None:
    experts = f.integer("num_local_experts", "num_experts", "n_routed_experts", default=0, minimum=0)
    if experts <= 1:
        return None
    per_token = f.integer("num_experts_per_tok", "experts_per_token", "top_k_experts", "moe_topk")
    if per_token > experts:
        raise InputError(f.source, "num_experts_per_tok", f"{per_token} experts per token of {experts}", "fix the config.json")
    expert_width = f.integer("moe_intermediate_size", default=intermediate)
    shared = f.integer("shared_expert_intermediate_size", default=0, minimum=0)
    if not shared and f.get("n_shared_experts"):
        shared = f.integer("n_shared_experts") * expert_width
    dense_layers = set(range(f.integer("first_k_dense_replace", default=0, minimum=0)))
    dense_layers |= {int(i) for i in f.get("mlp_only_layers") or []}
    step = f.integer("decoder_sparse_step", "moe_layer_freq", default=1)
    moe_layers = [i for i in range(layers) if i not in dense_layers and (i + 1) % step == 0]
    return MoeShape(experts, per_token, expert_width, len(moe_layers), shared)


def _mla(f: _Fields) -> MlaShape | None:
    if f.get("kv_lora_rank") is None:
        return None
    return MlaShape(
        q_lora_rank=f.integer("q_lora_rank", default=0, minimum=0),
        kv_lora_rank=f.integer("kv_lora_rank"),
        qk_nope_head_dim=f.integer("qk_nope_head_dim"),
        qk_rope_head_dim=f.integer("qk_rope_head_dim"),
        v_head_dim=f.integer("v_head_dim"),
    )


def _sliding(f: _Fields, model_type: str, layers: int) -> tuple[int | None, int]:
    """(window, number of sliding-window layers)."""
    window = f.get("sliding_window")
    if window is None or isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        return None, 0
    if f.get("use_sliding_window") is False:
        return None, 0  # Qwen2/3 configs carry a window they do not use
    layer_types = f.get("layer_types")
    if isinstance(layer_types, list):
        unknown = sorted({str(t) for t in layer_types} - {"sliding_attention", "full_attention"})
        if unknown:
            raise InputError(f.source, "layer_types", f"layers of type {', '.join(unknown)}",
                             "only full and sliding-window attention layers are modelled")
        return window, sum(1 for t in layer_types if t == "sliding_attention")
    pattern = f.get("sliding_window_pattern", "_sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 0:
        return window, sum(1 for i in range(layers) if (i + 1) % pattern)
    if model_type == "gemma2":
        return window, sum(1 for i in range(layers) if i % 2 == 0)  # transformers' Gemma2Config alternation
    return window, layers


def _precision(f: _Fields) -> tuple[str, str | None]:
    """(layer weights, attention weights if different) from quantization_config."""
    quant = f.get("quantization_config")
    if not isinstance(quant, dict):
        return "bf16", None
    method = str(quant.get("quant_method", "")).lower()
    bits = quant.get("bits") or quant.get("w_bit")
    if method == "fp8" or bits == 8:
        weights = "fp8"
    elif method == "mxfp4" or bits == 4 or method in ("awq", "gptq", "nvfp4"):
        weights = "int4"
    else:
        raise InputError(f.source, "quantization_config.quant_method", f"unknown quantization {method!r}",
                         "pass `weights` bf16, fp8 or int4 to state the weight precision")
    kept = " ".join(str(m) for m in quant.get("modules_to_not_convert") or [])
    return weights, ("bf16" if "self_attn" in kept else None)


def card_from_config(path: Path | str, weights: str | None = None, name: str | None = None) -> ModelCard:
    """The model card of the config.json at `path`; `weights` (bf16, fp8, int4) overrides the
    precision the config's quantization_config implies."""
    file, whole = read_config(path)
    source = str(file)
    text_config = whole.get("text_config")
    config: dict = text_config if isinstance(text_config, dict) else whole
    if whole.get("is_encoder_decoder"):
        raise InputError(source, "is_encoder_decoder", "encoder-decoder models are not modelled", "give a decoder-only or encoder-only model")
    if weights is not None and weights not in WEIGHT_BYTES:
        raise InputError(None, "weights", f"unknown precision {weights!r}", f"use one of: {', '.join(WEIGHT_BYTES)}")
    f = _Fields(config, source)
    model_type = str(config.get("model_type") or whole.get("model_type") or "").lower()
    encoder = _is_encoder(config)
    layers = f.integer("num_hidden_layers", "n_layer", "num_layers")
    hidden = f.integer("hidden_size", "n_embd", "d_model")
    heads = f.integer("num_attention_heads", "n_head")
    kv_heads = f.integer("num_key_value_heads", default=1 if config.get("multi_query") else heads)
    head_dim = f.integer("head_dim", default=hidden // heads)
    intermediate = f.integer("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
    vocab = f.integer("vocab_size")
    max_context = f.integer("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", default=2048)
    tied = config.get("tie_word_embeddings", whole.get("tie_word_embeddings", model_type in TIED_BY_DEFAULT))
    window, sliding_layers = _sliding(f, model_type, layers)
    layer_weights, attention_weights = _precision(_Fields(whole, source)) if weights is None else (weights, None)
    hf_id = str(whole.get("_name_or_path") or file.parent.name)
    card = ModelCard(
        name=name or file.parent.name or hf_id,
        hf_id=hf_id,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=vocab,
        encoder=encoder,
        gated_mlp=not encoder and model_type not in UNGATED_DECODERS,
        tied_embeddings=bool(tied),
        max_context=max_context,
        published_params=0.0,  # a config.json does not state it
        source=source,
        moe=None if encoder else _moe(f, layers, intermediate),
        mla=_mla(f),
        sliding_window=window if sliding_layers else None,
        sliding_layers=sliding_layers,
        weights=layer_weights,
        attention_weights=attention_weights,
        position_embeddings=max_context if encoder and config.get("position_embedding_type", "absolute") == "absolute" else 0,
    )
    return card


def describe(card: ModelCard) -> dict:
    """The card's derived numbers, for `profiles synthesize` output and docs."""
    data = {
        "model": card.name,
        "layers": card.layers,
        "attention": "MLA" if card.mla else ("MHA" if card.kv_heads == card.heads else f"GQA {card.heads}/{card.kv_heads}"),
        "params_b": round(card.params / 1e9, 3),
        "active_params_b": round(card.active_params / 1e9, 3),
        "weights": card.weights + (f" (attention {card.attention_weights})" if card.attention_weights else ""),
        "weights_gib": round(card.weights_gib, 3),
        "kv_kib_per_token": round(card.kv_bytes_per_token / 1024, 3),
        "tied_embeddings": card.tied_embeddings,
        "encoder": card.encoder,
    }
    if card.moe:
        data["experts"] = f"{card.moe.experts_per_token} of {card.moe.experts} in {card.moe.moe_layers} layers"
    if card.sliding_layers:
        data["sliding_window"] = f"{card.sliding_window} tokens in {card.sliding_layers} of {card.layers} layers"
    return data


def resolve_model(name_or_path: str, weights: str | None = None, field: str = "model") -> ModelCard:
    """A catalog model by name, or the card of a local config.json / model directory; `weights`
    overrides the weight precision."""
    from dataclasses import replace

    from scepsy.models.catalog.catalog import MODELS, find_model

    card = find_model(name_or_path)
    if card is None:
        path = Path(name_or_path)
        if not path.exists():
            raise InputError(None, field, f"unknown model {name_or_path!r}",
                             f"use one of: {', '.join(MODELS)}, or give a local config.json or model directory")
        return card_from_config(path, weights)
    if weights is None or weights == card.weights:
        return card
    if weights not in WEIGHT_BYTES:
        raise InputError(None, "weights", f"unknown precision {weights!r}", f"use one of: {', '.join(WEIGHT_BYTES)}")
    return replace(card, weights=weights, attention_weights=None)
