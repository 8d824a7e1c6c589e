"""The configuration of one emulated replica: model, GPU share, served names, timing and personality."""

from __future__ import annotations

from dataclasses import dataclass

from scepsy.models.catalog.catalog import GpuCard, ModelCard, encoder_task
from scepsy.models.performance.engine import DEFAULT_SETTINGS, Engine, EngineSettings, IterationTimer

PERSONALITIES = ("vllm", "sglang")


@dataclass(frozen=True)
class EmulatorConfig:
    """One emulated replica. Build it with `emulator_config` (tracing/emulation/emulator.py), which
    checks that it fits."""

    model: ModelCard
    gpu: GpuCard
    tp: int = 1
    fraction: float = 1.0
    served_model_names: tuple[str, ...] = ()
    max_model_len: int = 0
    speedup: float = 1.0
    mean_output_tokens: float = 0.0  # 0: sequences with a cap run to it
    prefix_caching: bool = True
    settings: EngineSettings = DEFAULT_SETTINGS
    timer: IterationTimer | None = None  # another engine model (models/performance/aiconfigurator.py); None: the roofline
    personality: str = "vllm"  # which engine's extra endpoints to serve (PERSONALITIES)

    @property
    def engine(self) -> Engine:
        return Engine(self.model, self.gpu, self.tp, self.fraction, self.settings, timer=self.timer)

    @property
    def names(self) -> tuple[str, ...]:
        return self.served_model_names or (self.model.hf_id,)

    def describe(self) -> str:
        engine = self.engine
        what = f"{self.model.name} on {self.gpu.name} (tp {self.tp}, fraction {self.fraction:g})"
        if self.model.encoder:
            timing = f"{engine.prefill_time_s(128) * 1e3:.2f} ms per 128-token input alone"
            memory = f"encoder ({encoder_task(self.model)})"
        else:
            timing = f"single-stream decode {engine.decode_step_time_s(1, 512) * 1e3:.2f} ms/token at 512 tokens of context"
            memory = f"KV cache {engine.kv_capacity_gib:.2f} GiB = {engine.kv_capacity_tokens} tokens"
        caching = "prefix caching" if self.prefix_caching and not self.model.encoder else "no prefix caching"
        timed_by = f"; timed by {self.timer.describe()}" if self.timer is not None else ""
        return (f"{what}: {memory}, max_model_len {self.max_model_len}, {timing}, {caching}, "
                f"speedup {self.speedup:g}x; served as {', '.join(self.names)}{timed_by}")
