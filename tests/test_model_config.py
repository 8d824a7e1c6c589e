"""Model cards from real config.json files of public models (tests/fixtures/model_configs/SOURCES.md
says where each file and each published parameter count comes from)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from scepsy.models.catalog.catalog import gpu, model
from scepsy.models.performance.engine import Engine, IterationWork
from scepsy.models.errors import InputError
from scepsy.models.catalog.model_config import card_from_config

CONFIGS = Path(__file__).parent / "fixtures" / "model_configs"

# directory: (published total, published active or None, whether "active" counts the input embedding)
PUBLISHED = {
    "meta-llama--Meta-Llama-3.1-8B": (8.03e9, None, True),
    "Qwen--Qwen3-8B": (8.2e9, None, True),
    "Qwen--Qwen3-32B-FP8": (32.8e9, None, True),
    "Qwen--Qwen3-30B-A3B": (30.5e9, 3.3e9, True),
    "deepseek-ai--DeepSeek-V3": (671e9, 37e9, True),
    "openai--gpt-oss-20b": (20.91e9, 3.61e9, False),
    "mistralai--Mixtral-8x7B-v0.1": (46.7e9, 12.9e9, True),
    "google--gemma-2-2b-it": (2.61e9, None, True),
    "sentence-transformers--all-MiniLM-L6-v2": (22.7e6, None, True),
    "BAAI--bge-reranker-base": (278e6, None, True),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_totals(name):
    card = card_from_config(CONFIGS / name)
    total, active, with_embedding = PUBLISHED[name]
    assert card.params == pytest.approx(total, rel=0.02)
    if active is not None:
        counted = card.active_params - (0 if with_embedding else card.vocab * card.hidden)
        assert counted == pytest.approx(active, rel=0.03)
    else:
        assert card.active_params == card.params


def test_gqa_and_tied_embeddings_are_read():
    llama = card_from_config(CONFIGS / "meta-llama--Meta-Llama-3.1-8B" / "config.json")
    catalog = model("llama-3.1-8b")
    for field in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "tied_embeddings"):
        assert getattr(llama, field) == getattr(catalog, field), field
    assert llama.params == catalog.params and llama.kv_bytes_per_token == catalog.kv_bytes_per_token
    gemma = card_from_config(CONFIGS / "google--gemma-2-2b-it")
    assert gemma.tied_embeddings and (gemma.heads, gemma.kv_heads, gemma.head_dim) == (8, 4, 256)
    qwen = card_from_config(CONFIGS / "Qwen--Qwen3-8B")
    assert not qwen.tied_embeddings and qwen.sliding_layers == 0  # its sliding_window is switched off


def test_mixture_of_experts_shapes():
    qwen = card_from_config(CONFIGS / "Qwen--Qwen3-30B-A3B").moe
    assert qwen is not None
    assert (qwen.experts, qwen.experts_per_token, qwen.expert_intermediate, qwen.moe_layers) == (128, 8, 768, 48)
    deepseek = card_from_config(CONFIGS / "deepseek-ai--DeepSeek-V3")
    assert deepseek.moe is not None and deepseek.mla is not None
    assert (deepseek.moe.experts, deepseek.moe.moe_layers, deepseek.moe.shared_intermediate) == (256, 58, 2048)
    assert deepseek.mla.kv_lora_rank == 512
    # MLA keeps one 576-value latent per layer instead of 128 heads of K and V
    assert deepseek.kv_bytes_per_token == 61 * (512 + 64) * 2
    mixtral = card_from_config(CONFIGS / "mistralai--Mixtral-8x7B-v0.1").moe
    assert mixtral is not None
    assert (mixtral.experts, mixtral.experts_per_token, mixtral.expert_intermediate) == (8, 2, 14336)


def test_sliding_window_layers():
    oss = card_from_config(CONFIGS / "openai--gpt-oss-20b")
    assert (oss.sliding_window, oss.sliding_layers) == (128, 12)
    gemma = card_from_config(CONFIGS / "google--gemma-2-2b-it")
    assert (gemma.sliding_window, gemma.sliding_layers) == (4096, 13)
    # beyond the window, KV read grows only through the full-attention layers
    engine = Engine(oss, gpu("H100"))
    short = engine.breakdown(IterationWork(decode_sequences=1, decode_context=100)).memory_s
    long = engine.breakdown(IterationWork(decode_sequences=1, decode_context=10_100)).memory_s
    per_token_all_layers = oss.kv_bytes_per_token / (gpu("H100").hbm_gbps * 1e9 * engine.settings.memory_efficiency)
    assert long - short < 10_000 * per_token_all_layers * 0.6


def test_weight_precision_from_config_and_flag():
    fp8 = card_from_config(CONFIGS / "Qwen--Qwen3-32B-FP8")
    assert fp8.weights == "fp8"
    bf16 = card_from_config(CONFIGS / "Qwen--Qwen3-32B-FP8", weights="bf16")
    int4 = card_from_config(CONFIGS / "Qwen--Qwen3-32B-FP8", weights="int4")
    embedding_gib = 2 * fp8.vocab * fp8.hidden * 2 / 1024**3  # embedding and LM head stay bf16
    assert bf16.weights_gib - embedding_gib == pytest.approx(2 * (fp8.weights_gib - embedding_gib))
    assert int4.weights_gib - embedding_gib == pytest.approx((fp8.weights_gib - embedding_gib) / 2)
    oss = card_from_config(CONFIGS / "openai--gpt-oss-20b")
    assert (oss.weights, oss.attention_weights) == ("int4", "bf16")  # mxfp4 experts, bf16 attention
    # half the bytes per weight: a memory-bound decode step streams about half the bytes
    h100 = gpu("H100")
    work = IterationWork(decode_sequences=1, decode_context=512)
    assert Engine(int4, h100).breakdown(work).memory_s < 0.6 * Engine(bf16, h100).breakdown(work).memory_s


def test_moe_decode_streams_more_experts_as_the_batch_grows():
    card = card_from_config(CONFIGS / "Qwen--Qwen3-30B-A3B")
    one = card.streamed_weight_bytes_for(1)
    assert one < card.weight_bytes / 5  # one token touches 8 of 128 experts
    assert card.streamed_weight_bytes_for(8) > one
    assert card.streamed_weight_bytes_for(4096) == pytest.approx(card.weight_bytes - card.vocab * card.hidden * 2, rel=0.01)


def test_encoders_are_prefill_only():
    for name in ("sentence-transformers--all-MiniLM-L6-v2", "BAAI--bge-reranker-base"):
        card = card_from_config(CONFIGS / name)
        assert card.encoder and not card.gated_mlp and card.kv_bytes_per_token == 0 and card.moe is None


def test_bad_configs_are_one_line_input_errors(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        card_from_config(tmp_path / "missing.json")
    with pytest.raises(InputError, match="no config.json"):
        card_from_config(tmp_path)
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not JSON"):
        card_from_config(bad)
    config = json.loads((CONFIGS / "Qwen--Qwen3-8B" / "config.json").read_text())
    del config["num_hidden_layers"]
    bad.write_text(json.dumps(config))
    with pytest.raises(InputError, match="num_hidden_layers") as error:
        card_from_config(bad)
    assert "missing" in str(error.value)
    config["num_hidden_layers"] = 2
    config["layer_types"] = ["linear_attention", "full_attention"]
    config["sliding_window"] = 64
    config["use_sliding_window"] = True
    bad.write_text(json.dumps(config))
    with pytest.raises(InputError, match="linear_attention"):
        card_from_config(bad)
    with pytest.raises(InputError, match="^weights: unknown precision"):
        card_from_config(CONFIGS / "Qwen--Qwen3-8B", weights="fp4")


def test_cli_synthesizes_a_profile_from_a_config_json(tmp_path):
    from typer.testing import CliRunner

    from scepsy.cli import app

    out = tmp_path / "qwen.csv"
    result = CliRunner().invoke(app, [
        "profiles", "synthesize", "--model", str(CONFIGS / "Qwen--Qwen3-32B-FP8"), "--gpu", "H100-PCIE",
        "--tp", "1", "--fractions", "1.0", "--requests", "fixed:512,64", "--requests-per-point", "50", "--out", str(out), "--json",
    ])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["model_card"]["weights"] == "fp8" and summary["model_card"]["params_b"] == pytest.approx(32.8, rel=0.01)
    assert summary["engine_model"] == "builtin" and summary["rows"] > 15  # the grid, then rows locating the stability boundary
    # bf16 weights (61 GiB) leave less KV cache on one 80 GiB GPU than fp8 (31 GiB): less capacity
    bf16 = CliRunner().invoke(app, [
        "profiles", "synthesize", "--model", str(CONFIGS / "Qwen--Qwen3-32B-FP8"), "--weights", "bf16", "--gpu", "H100-PCIE",
        "--tp", "1", "--fractions", "1.0", "--requests", "fixed:512,64", "--requests-per-point", "50", "--out", str(tmp_path / "b.csv"), "--json",
    ])
    assert bf16.exit_code == 0, bf16.output
    assert json.loads(bf16.output)["capacity_rps"]["tp1/f1"] < summary["capacity_rps"]["tp1/f1"]


def test_cli_bad_model_path_and_weights_are_one_line_exit_2(tmp_path):
    from typer.testing import CliRunner

    from scepsy.cli import app

    runner = CliRunner()
    missing = runner.invoke(app, ["profiles", "synthesize", "--model", str(tmp_path), "--gpu", "H100", "--out", str(tmp_path / "x.csv")])
    assert missing.exit_code == 2 and "no config.json" in missing.output and "Traceback" not in missing.output
    weights = runner.invoke(app, ["profiles", "synthesize", "--model", "llama-3.1-8b", "--weights", "fp2", "--gpu", "H100",
                                  "--out", str(tmp_path / "x.csv")])
    assert weights.exit_code == 2 and "--weights" in weights.output


def test_an_instance_llm_given_by_its_config_json(write_instance, tmp_path):
    from scepsy.models.instance.instance import load_instance
    from scepsy.models.simulation.simulator import model_card

    shutil.copytree(CONFIGS / "Qwen--Qwen3-8B", tmp_path / "qwen3-8b")
    instance = load_instance(write_instance(lambda d: d["llms"][1].update(model="qwen3-8b")))
    card = model_card(instance, "ver")
    assert card.params == pytest.approx(8.19e9, rel=0.01) and card.kv_heads == 8
