"""NVIDIA AIConfigurator as an engine model: iteration times from its database of measured kernels.

AIConfigurator (PyPI `aiconfigurator-core`, https://github.com/ai-dynamo/aiconfigurator) ships, per
GPU system, serving framework (vLLM, SGLang, TensorRT-LLM) and framework version, the measured
latencies of the kernels an engine iteration runs (GEMMs, attention, MoE, all-reduce) and composes
them into iteration times. `AiconfiguratorTimer` asks it for the time of one scepsy iteration
(models/performance/engine.py `IterationWork`), so that `Engine(..., timer=...)` -- and with it profile
synthesis, the simulator and the emulator -- runs on measured kernels instead of the roofline:

    prefill only   predict_prefill_latency(n, isl = (new + past) / n, prefix = past / n),
                   n = prefills finishing in the iteration (at least 1)
    decode only    decode_step_latency(batch, isl = mean context, osl = 2)
    mixed          mixed_step_latency(prefill tokens, decode sequences, isl = mean decode context,
                   osl = 2, prefix = past prefill tokens)

Decode contexts are rounded to CONTEXT_BUCKET tokens and the answers cached (a simulation asks
for the same shapes many times). Memory (KV cache capacity) and the scheduler limits stay the
Engine's. A GPU fraction f divides the time by f, as the roofline does.

Coverage is checked when the timer is built; anything not covered is an `EngineModelUnavailable`
(an InputError: exit code 2) whose message says what is missing:
  - the package is not installed (`pip install 'scepsy[aiconfigurator]'`);
  - the GPU has no AIConfigurator system (SYSTEMS maps catalog GPUs to them), or the system has no
    database for the backend and version;
  - the model's architecture is not one AIConfigurator models (encoders, Gemma, ...);
  - the model is given neither by a local config.json nor by a config AIConfigurator ships (no hub
    access: a catalog model is described to it by a config.json written from its card).
`coverage` reports the share of the iteration time that comes from measured kernels ("silicon")
rather than AIConfigurator's own formulas ("empirical").
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from scepsy.models.catalog.catalog import GpuCard, ModelCard, find_gpu
from scepsy.models.performance.engine import IterationWork
from scepsy.models.errors import InputError

BACKENDS = ("vllm", "sglang", "trtllm")
CONTEXT_BUCKET = 16  # tokens: decode contexts are timed at this granularity
# catalog GPU -> AIConfigurator system (systems/<name>.yaml and systems/data/<name>/)
SYSTEMS = {
    "A100-80G": "a100_sxm",
    "A100-40G": "a100_sxm",
    "H100-SXM": "h100_sxm",
    "H200": "h200_sxm",
    "B200": "b200_sxm",
    "L40S": "l40s",
    "RTX-PRO-6000": "rtx_pro_6000_server",
}
# catalog models whose Hugging Face config AIConfigurator ships (others are written from the card)
SHIPPED_CONFIGS = {
    "llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B",
    "llama-3.1-70b": "meta-llama/Meta-Llama-3.1-70B",
}
GEMM_QUANT = {"bf16": "bfloat16", "fp8": "fp8", "int4": "int4_wo"}


class EngineModelUnavailable(InputError):
    """AIConfigurator cannot time this model, GPU or backend."""

    def __init__(self, field_name: str, problem: str, fix: str):
        super().__init__(None, field_name, problem, fix)


def package_version() -> str | None:
    """The installed aiconfigurator-core version, or None."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        return version("aiconfigurator-core")
    except PackageNotFoundError:
        return None


def _require_package() -> str:
    found = package_version()
    if found is None:
        raise EngineModelUnavailable("engine_model", "AIConfigurator is not installed",
                                     "pip install 'scepsy[aiconfigurator]' (the aiconfigurator-core package)")
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    return found


def system_for(gpu: GpuCard) -> str:
    """The AIConfigurator system of a catalog GPU (also under an instance's name for it, e.g. H100)."""
    catalog_card = find_gpu(gpu.name)
    system = SYSTEMS.get(catalog_card.name if catalog_card else gpu.name)
    if system is None:
        raise EngineModelUnavailable(
            "gpu", f"AIConfigurator has no measured database for {gpu.name}",
            f"use the built-in engine model for it, or one of: {', '.join(sorted(SYSTEMS))}")
    return system


def _database(system: str, backend: str, version: str):
    from aiconfigurator_core.sdk import perf_database

    try:
        database = perf_database.get_database(system, backend, version)
    except Exception as exc:  # noqa: BLE001 - its errors become one line
        database, reason = None, f" ({str(exc).splitlines()[0][:200]})"
    else:
        reason = ""
    if database is None:
        raise EngineModelUnavailable(
            "backend", f"AIConfigurator has no {backend} database {version!r} for {system}{reason}",
            "choose another `backend` or `database_version` (current, previous, next or a version it lists)")
    return database


def _hf_config(card: ModelCard) -> dict:
    """A Llama-architecture config.json describing a dense catalog card (for AIConfigurator)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": card.hidden,
        "intermediate_size": card.intermediate, "num_hidden_layers": card.layers,
        "num_attention_heads": card.heads, "num_key_value_heads": card.kv_heads, "head_dim": card.head_dim,
        "vocab_size": card.vocab, "max_position_embeddings": card.max_context,
        "tie_word_embeddings": card.tied_embeddings, "torch_dtype": "bfloat16", "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    }


def model_path_for(card: ModelCard, scratch: Path) -> str:
    """What AIConfigurator is given for `card`: the card's own config.json directory, a config it
    ships, or a config.json written from a dense decoder card into `scratch`."""
    source = Path(card.source)
    if source.name == "config.json" and source.is_file():
        return str(source.parent)
    if card.name in SHIPPED_CONFIGS:
        return SHIPPED_CONFIGS[card.name]
    if card.encoder or card.moe is not None or card.mla is not None or not card.gated_mlp:
        raise EngineModelUnavailable("model", f"AIConfigurator does not model {card.name} (an encoder or a "
                                     "catalog card without a config.json)", "use the built-in engine model for it")
    folder = scratch / card.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(_hf_config(card), indent=1))
    return str(folder)


@dataclass
class AiconfiguratorTimer:
    """Iteration times of `card` on `tp` whole GPUs of `gpu` from AIConfigurator's database."""

    card: ModelCard
    gpu: GpuCard
    tp: int = 1
    backend: str = "vllm"
    database_version: str = "current"
    name: str = field(init=False, default="aiconfigurator")
    package: str = field(init=False, default="")
    resolved_version: str = field(init=False, default="")
    measured_share: float = field(init=False, default=0.0)
    system: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.package = _require_package()
        if self.backend not in BACKENDS:
            raise EngineModelUnavailable("backend", f"unknown backend {self.backend!r}", f"use one of: {', '.join(BACKENDS)}")
        system = self.system = system_for(self.gpu)
        database = _database(system, self.backend, self.database_version)
        self.resolved_version = str(getattr(database, "version", self.database_version))
        from aiconfigurator_core.sdk.engine import EngineHandle

        with tempfile.TemporaryDirectory(prefix="scepsy-aic-") as scratch:
            path = model_path_for(self.card, Path(scratch))
            try:
                self._handle = EngineHandle.compile(
                    path, system, self.backend, backend_version=self.resolved_version, tp_size=self.tp,
                    moe_tp_size=self.tp if self.card.moe else None,
                    # MoE and mixed-precision checkpoints: AIConfigurator reads the quantization from the config
                    gemm_quant_mode=GEMM_QUANT[self.card.weights] if self.card.moe is None and not self.card.attention_weights else None,
                )
            except Exception as exc:  # noqa: BLE001 - its errors become one line
                raise EngineModelUnavailable(
                    "model", f"AIConfigurator cannot model {self.card.name} with {self.backend} on {system}: "
                    f"{str(exc).splitlines()[0][:300]}", "use the built-in engine model for it") from None
        self.measured_share = self._measured_share()
        self._decode = lru_cache(maxsize=65536)(self._decode_ms)
        self._prefill = lru_cache(maxsize=65536)(self._prefill_ms)
        self._mixed = lru_cache(maxsize=65536)(self._mixed_ms)

    def _measured_share(self) -> float:
        """Share of a reference request's time (1024-token prompt, one decode step) timed from
        measured kernels."""
        context, generation = self._handle.run_static_per_op(batch_size=1, isl=1024, osl=2)
        total = sum(ms for _, ms, _, _ in context + generation)
        silicon = sum(ms for _, ms, _, source in context + generation if source == "silicon")
        return silicon / total if total > 0 else 0.0

    def describe(self) -> str:
        return (f"AIConfigurator {self.package}, {self.backend} {self.resolved_version} on {self.system}, "
                f"tp={self.tp}: {self.measured_share:.0%} of the time from measured kernels")

    # -- timing ---------------------------------------------------------------------------------

    def _decode_ms(self, batch: int, context: int) -> float:
        return float(self._handle.decode_step_latency(batch, context, 2))

    def _prefill_ms(self, sequences: int, length: int, past: int) -> float:
        return float(self._handle.predict_prefill_latency(sequences, length, past))

    def _mixed_ms(self, prefill_tokens: int, decode_sequences: int, context: int, past: int) -> float:
        return float(self._handle.mixed_step_latency(prefill_tokens, decode_sequences, context, 2, past))

    def iteration_time_s(self, work: IterationWork) -> float:
        if work.tokens <= 0:
            return 0.0
        if work.prefill_tokens == 0:
            context = _bucket(work.decode_context / work.decode_sequences)
            return self._decode(work.decode_sequences, context) / 1e3
        if work.decode_sequences == 0:
            sequences = max(work.prefills_finishing, 1)
            past = work.prefill_past_tokens // sequences
            length = max(work.prefill_tokens // sequences, 1) + past
            return self._prefill(sequences, length, past) / 1e3
        context = _bucket(work.decode_context / work.decode_sequences)
        return self._mixed(work.prefill_tokens, work.decode_sequences, context, work.prefill_past_tokens) / 1e3


def measured_allreduce_ms(system: str, backend: str = "vllm", version: str = "0.24.0") -> dict[tuple[int, int], float]:
    """AIConfigurator's measured all-reduce latencies of `system` (ms), by (GPUs, bf16 elements): its
    table systems/data/<system>/comm/<backend>/<version>/custom_allreduce_perf.parquet, the
    CUDA-graph rows (how vLLM runs decode and prefill). Used to cross-check the all-reduce fitted
    to the grid (models/performance/engine_comparison.py), not by the timer."""
    _require_package()
    import aiconfigurator_core
    import pandas as pd

    path = Path(aiconfigurator_core.__file__).parent / "systems" / "data" / system / "comm" / backend / version / "custom_allreduce_perf.parquet"
    if not path.is_file():
        raise EngineModelUnavailable("backend", f"AIConfigurator has no {backend} {version} all-reduce table for {system}",
                                     "choose another backend or version")
    table = pd.read_parquet(path, columns=["backend", "num_gpus", "message_size", "latency"])
    graph = table[table["backend"].str.endswith("_graph")]
    rows = zip(graph["num_gpus"].tolist(), graph["message_size"].tolist(), graph["latency"].tolist())
    return {(int(gpus), int(elements)): float(ms) for gpus, elements, ms in rows}


def _bucket(context: float) -> int:
    return max(int(round(context / CONTEXT_BUCKET)) * CONTEXT_BUCKET, CONTEXT_BUCKET)


def make_timer(engine_model: str, card: ModelCard, gpu: GpuCard, tp: int, backend: str = "vllm",
               database_version: str = "current") -> AiconfiguratorTimer | None:
    """The timer of `--engine-model` (None: the built-in roofline)."""
    if engine_model == "builtin":
        return None
    if engine_model != "aiconfigurator":
        raise InputError(None, "engine_model", f"unknown engine model {engine_model!r}", "use builtin or aiconfigurator")
    return AiconfiguratorTimer(card, gpu, tp, backend, database_version)
