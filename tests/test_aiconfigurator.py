"""AIConfigurator as an engine model (models/performance/aiconfigurator.py): real aiconfigurator-core, its
shipped kernel databases. Runs when the `aiconfigurator` extra is installed (the CI installs it
with the test extra)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("aiconfigurator_core")

from scepsy.models.performance.aiconfigurator import AiconfiguratorTimer, EngineModelUnavailable, make_timer  # noqa: E402
from scepsy.models.catalog.catalog import gpu, model  # noqa: E402
from scepsy.models.performance.engine import Engine, IterationWork, causal_attention  # noqa: E402
from scepsy.models.catalog.model_config import card_from_config  # noqa: E402
from scepsy.models.profiles.request_sources import RequestShape, RequestSource  # noqa: E402
from scepsy.models.profiles.synthesize import SynthesisSettings, synthesize  # noqa: E402

CONFIGS = Path(__file__).parent / "fixtures" / "model_configs"


@pytest.fixture(scope="module")
def llama_h100():
    return AiconfiguratorTimer(model("llama-3.1-8b"), gpu("H100"), tp=1, backend="vllm")


def test_times_come_from_the_measured_database(llama_h100):
    assert llama_h100.measured_share > 0.5  # most of the time from measured kernels ("silicon")
    assert llama_h100.resolved_version and "vllm" in llama_h100.describe()
    decode = [llama_h100.iteration_time_s(IterationWork(decode_sequences=b, decode_context=b * 1024)) for b in (1, 16, 64)]
    assert decode == sorted(decode) and decode[0] > 1e-3  # milliseconds, growing with the batch
    prefill = [llama_h100.iteration_time_s(IterationWork(prefill_tokens=n, prefill_attention=causal_attention(n), prefills_finishing=1))
               for n in (256, 1024, 4096)]
    assert prefill == sorted(prefill) and prefill[-1] > 3 * prefill[0]
    mixed = IterationWork(prefill_tokens=1024, prefill_attention=causal_attention(1024), prefills_finishing=1,
                          decode_sequences=16, decode_context=16 * 1024)
    assert llama_h100.iteration_time_s(mixed) > decode[1]


def test_the_engine_uses_the_timer_and_scales_it_by_the_fraction(llama_h100):
    card, h100 = model("llama-3.1-8b"), gpu("H100")
    work = IterationWork(decode_sequences=8, decode_context=8 * 700)
    whole = Engine(card, h100, timer=llama_h100)
    half = Engine(card, h100, fraction=0.5, timer=llama_h100)
    assert whole.iteration_time_s(work) == llama_h100.iteration_time_s(work)
    assert half.iteration_time_s(work) == pytest.approx(2 * whole.iteration_time_s(work))
    # the two engine models agree within the error the comparison in docs/engine-model.md reports
    assert whole.iteration_time_s(work) == pytest.approx(Engine(card, h100).iteration_time_s(work), rel=0.35)
    steps = whole.decode_run_times_s(8, 8 * 700, 3)
    assert steps[0] == whole.iteration_time_s(work)


def test_config_json_models_and_other_backends():
    qwen = card_from_config(CONFIGS / "Qwen--Qwen3-30B-A3B")
    timer = make_timer("aiconfigurator", qwen, gpu("B200"), 1, "sglang", "current")
    assert timer is not None
    assert timer.iteration_time_s(IterationWork(decode_sequences=4, decode_context=4000)) > 0
    assert make_timer("builtin", qwen, gpu("B200"), 1) is None


def test_what_it_does_not_cover_is_one_line_each():
    with pytest.raises(EngineModelUnavailable, match="no measured database for A6000"):
        AiconfiguratorTimer(model("llama-3.1-8b"), gpu("A6000"))
    with pytest.raises(EngineModelUnavailable, match="does not model e5-base-v2"):
        AiconfiguratorTimer(model("e5-base-v2"), gpu("H100"))
    with pytest.raises(EngineModelUnavailable, match="Gemma2ForCausalLM is not supported"):
        AiconfiguratorTimer(card_from_config(CONFIGS / "google--gemma-2-2b-it"), gpu("H100"))
    with pytest.raises(EngineModelUnavailable, match="unknown backend"):
        AiconfiguratorTimer(model("llama-3.1-8b"), gpu("H100"), backend="tgi")
    with pytest.raises(EngineModelUnavailable, match="no vllm database '9.9.9'"):
        AiconfiguratorTimer(model("llama-3.1-8b"), gpu("H100"), database_version="9.9.9")
    with pytest.raises(Exception, match="unknown engine model"):
        make_timer("magic", model("llama-3.1-8b"), gpu("H100"), 1)


def test_synthesis_runs_on_either_engine_model():
    card, l40s = card_from_config(CONFIGS / "Qwen--Qwen3-8B"), gpu("L40S")
    source = RequestSource("fixed", (RequestShape(1024, 128),))
    settings = SynthesisSettings(requests_per_point=60, rate_points=(0.2, 0.6, 1.0), max_extensions=0, refine_steps=0,
                                 fill_points=())
    timer = AiconfiguratorTimer(card, l40s)
    measured, _ = synthesize(card, l40s, [1], [1.0], source, settings, timer_for=lambda tp: timer)
    roofline, _ = synthesize(card, l40s, [1], [1.0], source, settings)
    assert len(measured) == len(roofline) == 3
    assert list(measured["latency_mean"]) != list(roofline["latency_mean"])


def test_emulator_and_simulator_use_it(write_instance):
    from scepsy.models.instance.instance import load_instance
    from scepsy.models.simulation.simulator import replica_engine
    from scepsy.tracing.emulation.emulator import emulator_config

    config = emulator_config(str(CONFIGS / "Qwen--Qwen3-8B"), "H100", engine_model="aiconfigurator", backend="sglang")
    assert config.timer is not None and "timed by AIConfigurator" in config.describe()
    assert config.engine.timer is config.timer

    def h100_llama(doc):
        doc["cluster"]["gpu_types"] = {"H100": {"memory_gib": 80}}
        doc["cluster"]["nodes"][0]["gpu_type"] = "H100"
        doc["llms"][1]["model"] = "meta-llama/Llama-3.1-8B"

    from conftest import profile_rows
    instance = load_instance(write_instance(h100_llama, profiles={"gen.csv": profile_rows("H100"), "ver.csv": profile_rows("H100")}))
    engine = replica_engine(instance, "ver", "H100", 1, 1.0, engine_model="aiconfigurator")
    assert isinstance(engine.timer, AiconfiguratorTimer) and engine.timer.tp == 1
    assert replica_engine(instance, "ver", "H100", 1, 1.0).timer is None
