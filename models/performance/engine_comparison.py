"""The built-in engine model against AIConfigurator's measured kernels on a grid (docs/engine-model.md).

`grid_points()` lists (model, GPU, tp, phase, batch, length) points where the model fits; `compare()`
times each with both engine models (models/performance/engine.py and models/performance/aiconfigurator.py):

    decode   one iteration of `batch` sequences at `length` tokens of context each
    prefill  one iteration prefilling `batch` prompts of `length` tokens

and `error = builtin / aiconfigurator - 1`. `fit_calibration` recalibrates the built-in model where
it is more than 15% off, on the training half of the points (`training_points`): the efficiency of the
routed-expert GEMMs of MoE models (EngineSettings.moe_efficiency), and per GPU the scales of the
compute, memory and link efficiencies (GpuCard.compute_scale, memory_scale, link_scale), by grid
search on the mean absolute log ratio; `calibrated_errors` re-times the held-out half with it
(out of sample). bench/engine_model_comparison.py prints the tables of docs/engine-model.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from scepsy.models.performance.aiconfigurator import AiconfiguratorTimer, EngineModelUnavailable
from scepsy.models.catalog.catalog import ModelCard, gpu, model
from scepsy.models.performance.engine import DEFAULT_SETTINGS, Engine, IterationWork, causal_attention
from scepsy.models.catalog.model_config import card_from_config

DECODE_BATCHES = (1, 8, 32, 64)
DECODE_CONTEXT = 1024
PREFILL_LENGTHS = (512, 2048)
TPS = (1, 2, 4)
GPUS = ("A100-80G", "H100-SXM", "H200", "B200", "L40S", "RTX-PRO-6000")
UNCALIBRATED = (1.0, 1.0, 1.0)


@dataclass(frozen=True)
class Point:
    model: str
    gpu: str
    tp: int
    phase: str  # decode | prefill
    batch: int
    length: int  # decode: context per sequence; prefill: prompt tokens per sequence

    @property
    def work(self) -> IterationWork:
        if self.phase == "decode":
            return IterationWork(decode_sequences=self.batch, decode_context=self.batch * self.length)
        return IterationWork(prefill_tokens=self.batch * self.length, prefill_attention=self.batch * causal_attention(self.length),
                             prefills_finishing=self.batch)


@dataclass(frozen=True)
class Comparison:
    point: Point
    builtin_s: float
    aiconfigurator_s: float

    @property
    def error(self) -> float:
        return self.builtin_s / self.aiconfigurator_s - 1.0


def default_models(config_root: Path) -> list[ModelCard]:
    """Two catalog models and two config.json models (a dense Qwen3 and a MoE)."""
    return [model("llama-3.1-8b"), model("llama-3.1-70b"),
            card_from_config(config_root / "Qwen--Qwen3-8B"), card_from_config(config_root / "Qwen--Qwen3-30B-A3B")]


def grid_points(cards: Sequence[ModelCard], gpus: Iterable[str] = GPUS, tps: Iterable[int] = TPS) -> list[tuple[ModelCard, Point]]:
    """Every grid point where the weights and the batch's KV cache fit on tp whole GPUs."""
    points = []
    for card in cards:
        for name in gpus:
            for tp in tps:
                engine = Engine(card, gpu(name), tp)
                if not engine.fits or card.heads % tp:
                    continue
                points += [(card, Point(card.name, name, tp, "decode", b, DECODE_CONTEXT)) for b in DECODE_BATCHES
                           if engine.max_batch(DECODE_CONTEXT) >= b]
                points += [(card, Point(card.name, name, tp, "prefill", 1, n)) for n in PREFILL_LENGTHS]
    return points


def compare(points: Sequence[tuple[ModelCard, Point]], backend: str = "vllm") -> tuple[list[Comparison], list[str]]:
    """Both engine models on every point AIConfigurator covers; the rest listed as skipped."""
    timers: dict[tuple[str, str, int], AiconfiguratorTimer | None] = {}
    results, skipped = [], []
    for card, point in points:
        key = (point.model, point.gpu, point.tp)
        if key not in timers:
            try:
                timers[key] = AiconfiguratorTimer(card, gpu(point.gpu), point.tp, backend)
            except EngineModelUnavailable as exc:
                timers[key] = None
                skipped.append(f"{point.model} on {point.gpu} tp{point.tp}: {exc.problem}")
        timer = timers[key]
        if timer is None:
            continue
        builtin = builtin_time_s(card, point, UNCALIBRATED, 1.0)  # the model before the recalibration
        results.append(Comparison(point, builtin, timer.iteration_time_s(point.work)))
    return results, skipped


def training_points(comparisons: Sequence[Comparison]) -> set[Point]:
    """The fixed split, stratified: within each (model, GPU, phase) group, sorted by (tp, batch,
    length), every other point fits the calibration; the others measure it out of sample."""
    groups: dict[tuple[str, str, str], list[Point]] = {}
    for c in comparisons:
        groups.setdefault((c.point.model, c.point.gpu, c.point.phase), []).append(c.point)
    return {p for points in groups.values()
            for i, p in enumerate(sorted(points, key=lambda p: (p.tp, p.batch, p.length))) if i % 2 == 0}


@dataclass(frozen=True)
class Calibration:
    """Per-GPU efficiency scales (models/catalog/catalog.py GpuCard) and the MoE efficiency."""

    scales: Mapping[str, tuple[float, float, float]]  # gpu -> (compute, memory, link)
    moe_efficiency: float


SCALE_GRID = {
    "compute": tuple(round(0.50 + 0.05 * i, 2) for i in range(19)),  # 0.50 .. 1.40 (efficiency <= 1)
    "memory": tuple(round(0.75 + 0.025 * i, 3) for i in range(21)),  # 0.75 .. 1.25
    "link": tuple(round(0.10 + 0.05 * i, 2) for i in range(27)),  # 0.10 .. 1.40
}
MOE_GRID = tuple(round(0.20 + 0.05 * i, 2) for i in range(17))  # 0.20 .. 1.00 (a prior: not below a fifth)


def builtin_time_s(card: ModelCard, point: Point, scales: tuple[float, float, float] = (1.0, 1.0, 1.0),
                   moe_efficiency: float = DEFAULT_SETTINGS.moe_efficiency) -> float:
    compute, memory, link = scales
    card_gpu = replace(gpu(point.gpu), compute_scale=compute, memory_scale=memory, link_scale=link)
    settings = replace(DEFAULT_SETTINGS, moe_efficiency=moe_efficiency)
    return Engine(card, card_gpu, point.tp, settings=settings).iteration_time_s(point.work)


def _loss(items, scales_of, moe_efficiency) -> float:
    """Mean absolute log ratio builtin / aiconfigurator."""
    if not items:
        return 0.0
    return sum(abs(math.log(builtin_time_s(card, c.point, scales_of(c.point.gpu), moe_efficiency) / c.aiconfigurator_s))
               for card, c in items) / len(items)


def _fit_moe(items, scales_of) -> float:
    moe = [(card, c) for card, c in items if card.moe is not None]
    return min(MOE_GRID, key=lambda e: (_loss(moe, scales_of, e), abs(e - 1))) if moe else 1.0


def _fit_scale(items, scales: list[float], index: int, moe_efficiency: float) -> float:
    """One scale by grid search (ties: the value nearest 1); items empty: unchanged."""
    if not items:
        return scales[index]
    grid = list(SCALE_GRID.values())[index]

    def loss(value):
        trial = tuple(value if i == index else v for i, v in enumerate(scales))
        return _loss(items, lambda _: trial, moe_efficiency), abs(value - 1)

    return min(grid, key=loss)


def _fit_gpu(items, moe_efficiency: float) -> tuple[float, float, float]:
    """Compute scale from single-GPU prefills, memory scale from single-GPU decodes, link scale
    from the tensor-parallel points (each fitted with the others fixed)."""
    scales = [1.0, 1.0, 1.0]
    single = [(card, c) for card, c in items if c.point.tp == 1]
    scales[0] = _fit_scale([(k, c) for k, c in single if c.point.phase == "prefill"], scales, 0, moe_efficiency)
    scales[1] = _fit_scale([(k, c) for k, c in single if c.point.phase == "decode"], scales, 1, moe_efficiency)
    scales[2] = _fit_scale([(k, c) for k, c in items if c.point.tp > 1], scales, 2, moe_efficiency)
    return scales[0], scales[1], scales[2]


def fit_calibration(cards: Mapping[str, ModelCard], comparisons: Sequence[Comparison], keep: Iterable[str] = (),
                    threshold: float = 0.15) -> Calibration:
    """Fit on the training points: the MoE efficiency, then per-GPU scales for every GPU with a
    (phase) group whose training error exceeds `threshold` -- except the GPUs in `keep` (whose
    numbers shipped profiles were generated with), and kept only if neither phase's training error
    grows -- then the MoE efficiency again."""
    training = training_points(comparisons)
    items = [(cards[c.point.model], c) for c in comparisons if c.point in training]
    scales: dict[str, tuple[float, float, float]] = {}

    def scales_of(name: str) -> tuple[float, float, float]:
        return scales.get(name, UNCALIBRATED)

    moe_efficiency = _fit_moe(items, scales_of)
    for name in sorted({c.point.gpu for _, c in items} - set(keep)):
        mine = [(card, c) for card, c in items if c.point.gpu == name]
        off = any(_loss([(card, c) for card, c in mine if c.point.phase == phase], scales_of, moe_efficiency) > threshold
                  for phase in ("decode", "prefill"))
        if off:
            fitted = _fit_gpu([(card, c) for card, c in mine if card.moe is None], moe_efficiency)
            before = [_loss([i for i in mine if i[1].point.phase == ph], scales_of, moe_efficiency) for ph in ("decode", "prefill")]
            after = [_loss([i for i in mine if i[1].point.phase == ph], lambda _: fitted, moe_efficiency) for ph in ("decode", "prefill")]
            if all(a <= b for a, b in zip(after, before)):  # kept only if no phase gets worse
                scales[name] = fitted
    return Calibration(dict(scales), _fit_moe(items, scales_of))


def calibrated_errors(cards: Mapping[str, ModelCard], comparisons: Sequence[Comparison], calibration: Calibration,
                      training: bool | None = None) -> list[Comparison]:
    """The comparisons re-timed with `calibration` (only the training or held-out points if given)."""
    split = training_points(comparisons)
    chosen = [c for c in comparisons if training is None or (c.point in split) == training]
    return [Comparison(c.point, builtin_time_s(cards[c.point.model], c.point, calibration.scales.get(c.point.gpu, (1.0, 1.0, 1.0)),
                                               calibration.moe_efficiency), c.aiconfigurator_s) for c in chosen]


def summary(comparisons: Sequence[Comparison]) -> dict[tuple[str, str], tuple[int, float, float]]:
    """(GPU, phase) -> (points, mean signed error, mean absolute error)."""
    groups: dict[tuple[str, str], list[float]] = {}
    for c in comparisons:
        groups.setdefault((c.point.gpu, c.point.phase), []).append(c.error)
    return {k: (len(v), sum(v) / len(v), sum(abs(e) for e in v) / len(v)) for k, v in sorted(groups.items())}


