"""The one catalogue lookup of an instance: the engine model's card of each LLM and GPU type.

Everything that runs the engine model for an instance looks its hardware up here: the simulator
(each replica's engine) and the derived curves of unprofiled fractions (their share shape,
models/performance/fraction_shape.py). So a model given by its config.json and a GPU the catalogue
does not know, or knows with other numbers, are modelled alike everywhere:

    model   the catalogue model of the LLM's `model` id, else of its name, else the config.json (or
            model directory) at `model`, relative to the instance file
    GPU     the catalogue GPU of the type's name with the instance's own numbers where it gives them
            (memory_gib, tflops, bandwidth_gbps, nvlink_gbps), else a card from those numbers alone
            (tflops and bandwidth_gbps needed)

`find_*` answer None where there is no card (a prediction then derives curves without the shape);
`model_card` and `gpu_card` raise the InputError that says what to give (the simulator needs them).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from scepsy.models.catalog.catalog import GpuCard, ModelCard, find_gpu, find_model
from scepsy.models.catalog.model_config import card_from_config
from scepsy.models.errors import InputError
from scepsy.models.instance.instance import Instance


def _config_path(instance: Instance, llm: str) -> Path | None:
    """The config.json (or model directory) an LLM's `model` names, relative to the instance file."""
    model = instance.llm(llm).model
    path = Path(instance.source).parent / model if instance.source else Path(model)
    try:
        return path if path.is_dir() or (path.suffix == ".json" and path.is_file()) else None
    except OSError:  # a name too long for the file system is no path
        return None


@lru_cache(maxsize=256)
def _config_card(path: str, modified_ns: int) -> ModelCard:
    """A config.json's card, read once per version of the file (curves ask for it per share)."""
    return card_from_config(path)


def find_model_card(instance: Instance, llm: str) -> ModelCard | None:
    """The engine model's card of an instance LLM (module docstring), or None."""
    spec = instance.llm(llm)
    card = find_model(spec.model) or find_model(spec.name)
    if card is not None:
        return card
    path = _config_path(instance, llm)
    if path is None:
        return None
    config = path / "config.json" if path.is_dir() else path
    return _config_card(str(path), config.stat().st_mtime_ns if config.is_file() else 0)


def model_card(instance: Instance, llm: str) -> ModelCard:
    """find_model_card, or the InputError naming the LLM's `model` field."""
    card = find_model_card(instance, llm)
    if card is None:
        index = [m.name for m in instance.llms].index(llm)
        raise InputError(
            instance.source, f"llms[{index}] ({llm}).model", f"model {instance.llm(llm).model!r} is not in the engine catalog",
            "use a model of models/catalog/catalog.py (e.g. meta-llama/Llama-3.1-8B) or the path of its config.json",
        )
    return card


def find_gpu_card(instance: Instance, gpu_type: str) -> GpuCard | None:
    """The engine model's card of an instance GPU type (module docstring), or None."""
    spec = instance.cluster.gpu_types[gpu_type]
    base = find_gpu(gpu_type)
    if base is None:
        if spec.tflops is None or spec.bandwidth_gbps is None:
            return None
        domain = instance.cluster.largest_domain(gpu_type)
        return GpuCard(gpu_type, spec.memory_gib, spec.bandwidth_gbps, spec.tflops, spec.nvlink_gbps, max(domain, 1), 64.0,
                       source=f"instance {instance.source}")
    return replace(
        base,
        name=gpu_type,
        memory_gib=spec.memory_gib,
        hbm_gbps=spec.bandwidth_gbps or base.hbm_gbps,
        bf16_tflops=spec.tflops or base.bf16_tflops,
        nvlink_gbps=spec.nvlink_gbps if spec.nvlink_gbps is not None else base.nvlink_gbps,
    )


def gpu_card(instance: Instance, gpu_type: str) -> GpuCard:
    """find_gpu_card, or the InputError naming the GPU type's missing numbers."""
    card = find_gpu_card(instance, gpu_type)
    if card is None:
        raise InputError(
            instance.source, f"cluster.gpu_types.{gpu_type}",
            "unknown GPU type without tflops and bandwidth_gbps",
            "give tflops and bandwidth_gbps (and nvlink_gbps) or name it after a catalog GPU (A6000, H100, ...)",
        )
    return card
