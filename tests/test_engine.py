"""Engine model and catalog: formulas, limits, and the error against published measurements."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scepsy.models.catalog import catalog
from scepsy.models.performance.engine import Engine, EngineSettings, IterationWork, causal_attention
from support.engine_validation import REFERENCES, compare
from scepsy.models.errors import InputError

ERROR_BOUND = 0.15  # every in-bound reference (docs/engine-model.md)
MAPE_BOUND = 0.08


@pytest.mark.parametrize("card", list(catalog.MODELS.values()), ids=lambda c: c.name)
def test_parameters_derived_from_config_match_published_totals(card):
    assert card.params == pytest.approx(card.published_params, rel=0.02)
    assert card.source.startswith("https://huggingface.co/")


def test_every_gpu_has_a_datasheet_and_sane_numbers():
    for card in catalog.GPUS.values():
        assert card.source.startswith("https://")
        assert card.memory_gib > 0 and card.hbm_gbps > 0 and card.bf16_tflops > 0
    assert catalog.gpu("H100").name == "H100-SXM"
    assert catalog.gpu("rtx a6000").name == "A6000"
    assert catalog.model("RLHFlow/Llama3.1-8B-PRM-Deepseek-Data").name == "llama-3.1-8b"


def test_unknown_names_are_input_errors():
    with pytest.raises(InputError, match="unknown gpu"):
        catalog.gpu("B300")
    with pytest.raises(InputError, match="unknown model"):
        catalog.model("gpt-5")


def test_kv_capacity_formula_and_fit():
    llama8b, a6000 = catalog.model("llama-3.1-8b"), catalog.gpu("A6000")
    engine = Engine(llama8b, a6000, tp=2, fraction=0.5)
    assert engine.kv_capacity_gib == pytest.approx(2 * 0.5 * 48 * 0.9 - llama8b.weights_gib)
    assert engine.kv_capacity_tokens == int(engine.kv_capacity_gib * 1024**3 / llama8b.kv_bytes_per_token)
    assert not Engine(llama8b, a6000, 1, 0.3).fits
    assert Engine(llama8b, a6000, 1, 1.0).max_batch(500) == 256  # max_num_seqs binds
    assert Engine(llama8b, a6000, 1, 0.4).max_batch(2000) < 256  # memory binds


def test_decode_is_memory_bound_and_long_prefill_compute_bound():
    engine = Engine(catalog.model("llama-3-8b"), catalog.gpu("H100"))
    assert engine.breakdown(IterationWork(decode_sequences=1, decode_context=500)).bound == "memory"
    big = IterationWork(prefill_tokens=2048, prefill_attention=causal_attention(2048), prefills_finishing=1)
    assert engine.breakdown(big).bound == "compute"


def test_time_grows_with_batch_and_context_and_shrinks_with_resources():
    model, gpu = catalog.model("llama-3.1-8b"), catalog.gpu("A100-80G")
    engine = Engine(model, gpu)
    times = [engine.decode_step_time_s(b, 1000) for b in (1, 8, 64, 256)]
    assert times == sorted(times)
    assert engine.decode_step_time_s(32, 4000) > engine.decode_step_time_s(32, 500)
    half = Engine(model, gpu, fraction=0.5)
    assert half.decode_step_time_s(1, 500) > 1.8 * (engine.decode_step_time_s(1, 500) - 2e-3)
    tp2 = Engine(model, gpu, tp=2)
    assert tp2.breakdown(IterationWork(decode_sequences=1, decode_context=500)).comm_s > 0
    assert tp2.decode_step_time_s(1, 500) < engine.decode_step_time_s(1, 500)


def test_pcie_all_reduce_is_slower_than_nvlink():
    model = catalog.model("llama-3.1-8b")
    nvlink = Engine(model, catalog.gpu("A100-80G"), tp=2)
    pcie = Engine(model, catalog.gpu("A100-80G"), tp=2, interconnect="pcie")
    assert nvlink.link == "nvlink" and pcie.link == "pcie"
    assert Engine(model, catalog.gpu("A6000"), tp=4).link == "pcie"  # the bridge joins two cards
    work = IterationWork(prefill_tokens=1024, prefill_attention=causal_attention(1024), prefills_finishing=1)
    assert pcie.breakdown(work).comm_s > nvlink.breakdown(work).comm_s


def test_a_pcie_ring_pays_one_latency_per_hop_and_the_host_path_beyond_its_switch():
    """Alpha-beta all-reduce over PCIe: the small-message latency grows with the ring's hops; an
    L40S ring of four leaves its PCIe switch and runs at the host path's bandwidth."""
    from dataclasses import replace

    model = catalog.model("llama-3.1-8b")
    l4 = catalog.gpu("L4")
    small = IterationWork(decode_sequences=1, decode_context=100)
    comm = {tp: Engine(model, l4, tp=tp).breakdown(small).comm_s for tp in (2, 4)}
    per_allreduce = {tp: comm[tp] / (2 * model.layers) for tp in comm}
    assert per_allreduce[4] > 2.9 * l4.pcie_latency_us * 1e-6 and per_allreduce[2] < 1.1 * l4.pcie_latency_us * 1e-6
    l40s = catalog.gpu("L40S")
    assert l40s.pcie_switch_gpus == 2 and l40s.pcie_host_gbps is not None
    prefill = IterationWork(prefill_tokens=2048, prefill_attention=causal_attention(2048), prefills_finishing=1)
    host = Engine(model, l40s, tp=4).breakdown(prefill).comm_s
    no_host = Engine(model, replace(l40s, pcie_host_gbps=None), tp=4).breakdown(prefill).comm_s
    assert host > 3 * no_host
    assert Engine(model, l40s, tp=2).breakdown(prefill).comm_s == Engine(model, replace(l40s, pcie_host_gbps=None), tp=2).breakdown(prefill).comm_s


def test_a_large_nvlink_all_reduce_runs_the_faster_of_two_algorithms():
    """Over NVLink, where a card sets `nvlink_bulk_latency_us` (B200), an all-reduce is the faster of
    the small-message algorithm and a bulk one with a longer start-up and more bandwidth: a decode
    step's small all-reduces keep the small latency, a long prefill's large ones get the bulk
    bandwidth; a card without it (H100) has one algorithm."""
    from dataclasses import replace

    model = catalog.model("llama-3.1-8b")
    b200 = catalog.gpu("B200")
    assert b200.nvlink_bulk_latency_us is not None and catalog.gpu("H100").nvlink_bulk_latency_us is None
    one = replace(b200, nvlink_bulk_latency_us=None)
    bulk_only = replace(b200, nvlink_latency_us=b200.nvlink_bulk_latency_us, link_scale=b200.bulk_link_scale)
    for nbytes in (2 * 4096, 2 * 4096 * 64, 2 * 4096 * 512, 2 * 4096 * 2048, 2 * 8192 * 2048):
        times = {name: Engine(model, card, tp=4)._allreduce_s(nbytes) for name, card in
                 (("both", b200), ("small", one), ("bulk", bulk_only))}
        assert times["both"] == min(times["small"], times["bulk"])
    decode = IterationWork(decode_sequences=8, decode_context=8 * 1024)
    prefill = IterationWork(prefill_tokens=2048, prefill_attention=causal_attention(2048), prefills_finishing=1)
    assert Engine(model, b200, tp=4).breakdown(decode).comm_s == Engine(model, one, tp=4).breakdown(decode).comm_s
    assert Engine(model, b200, tp=4).breakdown(prefill).comm_s < 0.8 * Engine(model, one, tp=4).breakdown(prefill).comm_s
    h100 = catalog.gpu("H100")
    assert Engine(model, h100, tp=4).breakdown(prefill).comm_s == Engine(model, replace(h100, bulk_link_scale=9.0), tp=4).breakdown(prefill).comm_s


def test_routed_experts_are_their_own_roofline(tmp_path):
    """MoE: the routed experts' weights are streamed and then multiplied (no overlap); dense models
    have no expert term."""
    from scepsy.models.catalog.model_config import card_from_config
    from pathlib import Path

    moe = card_from_config(Path(__file__).parent / "fixtures" / "model_configs" / "Qwen--Qwen3-30B-A3B")
    h100 = catalog.gpu("H100")
    dense = Engine(catalog.model("llama-3.1-8b"), h100).breakdown(IterationWork(decode_sequences=8, decode_context=8000))
    assert dense.experts_s == 0
    engine = Engine(moe, h100)
    one = engine.breakdown(IterationWork(decode_sequences=1, decode_context=1000))
    many = engine.breakdown(IterationWork(prefill_tokens=2048, prefill_attention=causal_attention(2048), prefills_finishing=1))
    assert 0 < one.experts_s < many.experts_s
    rate = h100.hbm_gbps * 1e9 * engine._memory_efficiency
    assert one.experts_s >= moe.routed_expert_bytes_for(1) / rate
    assert math.isclose(one.total_s, max(one.compute_s, one.memory_s) + one.experts_s + one.elementwise_s + one.comm_s
                        + one.overhead_s)


def test_elementwise_traffic_is_replicated_norms_and_sharded_activations():
    """Per token and layer: two fused add-norms (4 x hidden bf16 values each) on every shard, and
    the gate activation (3 x intermediate) split over the shards."""
    model = catalog.model("llama-3.1-8b")
    per_token_layer = {tp: model.elementwise_bytes(1, tp) / model.layers for tp in (1, 4)}
    norms = 2 * 4 * model.hidden * 2
    assert per_token_layer[1] == norms + 3 * model.intermediate * 2
    assert per_token_layer[4] == norms + 3 * model.intermediate * 2 / 4
    work = IterationWork(prefill_tokens=2048, prefill_attention=causal_attention(2048), prefills_finishing=1)
    tp1, tp4 = (Engine(model, catalog.gpu("H100"), tp=tp).breakdown(work).elementwise_s for tp in (1, 4))
    assert tp4 > tp1 / 4  # the norms do not shrink with TP


def test_encoders_only_prefill():
    engine = Engine(catalog.model("bge-reranker-base"), catalog.gpu("A6000"))
    assert engine.model.kv_bytes_per_token == 0
    assert engine.request_time_s(512, 100) == pytest.approx(engine.prefill_time_s(512))


def test_decode_run_equals_step_by_step():
    engine = Engine(catalog.model("qwen2.5-7b"), catalog.gpu("L40S"), fraction=0.7)
    run = engine.decode_run_times_s(12, 12 * 300, 50)
    steps = [engine.decode_step_time_s(12, 300 + i) for i in range(50)]
    assert np.allclose(run, steps, rtol=1e-12)


def test_settings_are_validated():
    with pytest.raises(ValueError):
        EngineSettings(compute_efficiency=1.5)
    with pytest.raises(ValueError):
        Engine(catalog.model("llama-3.2-1b"), catalog.gpu("L4"), fraction=0.0)


def test_error_against_published_measurements_is_within_the_stated_bound():
    comparisons = [c for c in compare() if c.reference.in_bound]
    assert len(comparisons) >= 10
    worst = max(comparisons, key=lambda c: abs(c.error))
    assert abs(worst.error) <= ERROR_BOUND, f"{worst.reference.key}: {worst.error:+.1%}"
    assert np.mean([abs(c.error) for c in comparisons]) <= MAPE_BOUND
    for reference in REFERENCES:
        assert reference.source.startswith("https://")
        assert math.isfinite(reference.published)


def test_a_bad_constant_breaks_the_bound():
    """The validation can fail: halving the memory efficiency moves decode far off."""
    bad = EngineSettings(memory_efficiency=0.4)
    decode = [c for c in compare(bad) if c.reference.kind == "decode" and c.reference.in_bound]
    assert max(abs(c.error) for c in decode) > ERROR_BOUND
