"""The one catalogue lookup (models/performance/cards.py): the simulator and the derived curves of
unprofiled fractions see the same model and GPU, also for a model given by its config.json, a GPU
the catalogue does not know and a catalogue GPU with the instance's own numbers."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import profile_rows
from scepsy.models.instance.instance import load_instance
from scepsy.models.performance.alp import replica_curve
from scepsy.models.performance.cards import find_gpu_card, find_model_card, gpu_card, model_card
from scepsy.models.performance.fraction_shape import share_model

CONFIGS = Path(__file__).parent / "fixtures" / "model_configs"
CUSTOM_GPU = {"memory_gib": 48, "tflops": 300.0, "bandwidth_gbps": 1200.0, "nvlink_gbps": 100.0}  # no catalogue GPU
OVERRIDDEN_A6000 = {"memory_gib": 48, "tflops": 300.0, "bandwidth_gbps": 1200.0}  # the catalogue says 154.8 and 768


def _instance(write_instance, tmp_path, model: str, gpu_type: str, numbers: dict):
    """The base instance with `ver` as `model` on one node of `gpu_type`, profiled at 0.5 and 1.0."""
    shutil.copytree(CONFIGS / "Qwen--Qwen3-8B", tmp_path / "models" / "my-qwen")

    def mutate(doc):
        doc["cluster"]["gpu_types"] = {gpu_type: numbers}
        doc["cluster"]["nodes"][0]["gpu_type"] = gpu_type
        doc["llms"][1].update(model=model, weights_gib=16.4, tp_degrees=[1])
        doc["llms"][0].update(tp_degrees=[1])

    profiles = {"gen.csv": profile_rows(gpu_type, tps=(1,), light_s=1.0, capacity_rps=20.0),
                "ver.csv": profile_rows(gpu_type, tps=(1,), light_s=2.0, capacity_rps=8.0)}
    return load_instance(write_instance(mutate, profiles))


@pytest.mark.parametrize("model, gpu_type, numbers", [
    ("models/my-qwen", "A6000", {"memory_gib": 48}),  # a config.json model on a catalogue GPU
    ("meta-llama/Llama-3.1-8B", "ACME-X1", CUSTOM_GPU),  # a catalogue model on a GPU the catalogue does not know
    ("models/my-qwen", "ACME-X1", CUSTOM_GPU),
    ("meta-llama/Llama-3.1-8B", "A6000", OVERRIDDEN_A6000),  # the instance's numbers, not the catalogue's
], ids=["config-json", "custom-gpu", "both", "overridden-gpu"])
def test_derived_fractions_use_the_instances_cards(write_instance, tmp_path, model, gpu_type, numbers):
    instance = _instance(write_instance, tmp_path, model, gpu_type, numbers)
    llm = instance.llm("ver")
    card, gpu = model_card(instance, "ver"), gpu_card(instance, gpu_type)
    assert find_model_card(instance, "ver") == card and find_gpu_card(instance, gpu_type) == gpu
    assert card.params == pytest.approx(8.19e9 if model.startswith("models/") else 8.03e9, rel=0.01)
    assert gpu.bf16_tflops == numbers.get("tflops", 154.8) and gpu.memory_gib == 48
    measured = llm.profile.curves[(gpu_type, 1)]
    shape = share_model(card, gpu, 1, measured)
    assert shape is not None and shape.gpu == gpu and shape.model == card

    derived = replica_curve(instance, llm, gpu_type, 1, 7)  # 0.7: between the measured 0.5 and 1.0
    assert derived is not None and derived.derived_from == (0.5, 1.0)
    expected = llm.profile.curve(gpu_type, 1, 0.7, 48, llm.weights_gib, shape)
    without_shape = llm.profile.curve(gpu_type, 1, 0.7, 48, llm.weights_gib, None)
    assert expected is not None and without_shape is not None
    rates = np.linspace(0.1, 0.9, 9) * expected.capacity_rps
    assert derived.capacity_rps == expected.capacity_rps
    assert np.array_equal(derived.latency_s(rates), expected.latency_s(rates))
    assert not np.allclose(derived.latency_s(rates), without_shape.latency_s(rates))  # the shape made a difference


def test_no_card_is_no_shape_and_the_simulator_says_what_to_give(write_instance, tmp_path):
    from scepsy.models.errors import InputError

    instance = _instance(write_instance, tmp_path, "nobody/unknown-model", "ACME-X1", {"memory_gib": 48})
    assert find_model_card(instance, "ver") is None and find_gpu_card(instance, "ACME-X1") is None
    assert replica_curve(instance, instance.llm("ver"), "ACME-X1", 1, 7) is not None  # derived without a shape
    with pytest.raises(InputError, match=r"llms\[1\] \(ver\)\.model"):
        model_card(instance, "ver")
    with pytest.raises(InputError, match="tflops and bandwidth_gbps"):
        gpu_card(instance, "ACME-X1")
