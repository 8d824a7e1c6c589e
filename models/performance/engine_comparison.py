"""The built-in engine model against AIConfigurator's measured kernels on a grid (docs/engine-model.md).

`grid_points()` lists (model, GPU, tp, phase, batch, length) points where the model fits; `compare()`
times each with both engine models (models/performance/engine.py and models/performance/aiconfigurator.py):

    decode   one iteration of `batch` sequences at `length` tokens of context each
    prefill  one iteration prefilling `batch` prompts of `length` tokens

and `error = builtin / aiconfigurator - 1`. `fit_calibration` recalibrates the built-in model where
it is more than 15% off, on the training (fit) half of the points (`training_points`): the efficiency
of the routed-expert GEMMs of MoE models (EngineSettings.moe_efficiency), and per GPU the GpuCard
fields of `fitted_fields` (compute, memory and link scales, the all-reduce latency of its link,
over NVLink the large-message all-reduce's latency and link scale, a PCIe host path's bandwidth),
by grid search on the mean absolute log ratio; `calibrated_errors` re-times the held-out half with
it (out of sample). `SPLITS` are the fixed fit/held-out splits (the shipped calibration is fitted
on "stated"; the others check it is not a lucky one). bench/engine_model_comparison.py prints the
tables of docs/engine-model.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from scepsy.models.performance.aiconfigurator import AiconfiguratorTimer, EngineModelUnavailable
from scepsy.models.catalog.catalog import GpuCard, ModelCard, gpu, model
from scepsy.models.performance.engine import DEFAULT_SETTINGS, Engine, IterationWork, causal_attention
from scepsy.models.catalog.model_config import card_from_config

DECODE_BATCHES = (1, 8, 32, 64)
DECODE_CONTEXT = 1024
PREFILL_LENGTHS = (512, 2048)
TPS = (1, 2, 4)
GPUS = ("A100-80G", "H100-SXM", "H200", "B200", "L40S", "RTX-PRO-6000")


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
        builtin = builtin_time_s(card, point, {}, 1.0)  # the model uncalibrated
        results.append(Comparison(point, builtin, timer.iteration_time_s(point.work)))
    return results, skipped


# The fixed splits of the grid into fit and held-out halves. "stated" is the one the shipped
# calibration is fitted on; the others check that its held-out errors are not a lucky split.
SPLITS = ("stated", "complement", "tp-first", "by-model")
BY_MODEL_FIT = ("llama-3.1-8b", "Qwen--Qwen3-30B-A3B")  # the by-model split fits on these, holds out the others


def training_points(comparisons: Sequence[Comparison], split: str = "stated") -> set[Point]:
    """The points that fit the calibration; the others measure it out of sample.

    stated      within each (model, GPU, phase) group, sorted by (batch, length, tp), every other
                point (sorted by length before tp, both prompt lengths and every TP are on both sides)
    complement  the other half of the stated split
    tp-first    the same, sorted by (tp, batch, length): every 2,048-token prefill is held out
    by-model    the points of the BY_MODEL_FIT models (one dense, one MoE)"""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    if split == "by-model":
        return {c.point for c in comparisons if c.point.model in BY_MODEL_FIT}
    if split == "complement":
        return {c.point for c in comparisons} - training_points(comparisons)
    order = (lambda p: (p.tp, p.batch, p.length)) if split == "tp-first" else (lambda p: (p.batch, p.length, p.tp))
    groups: dict[tuple[str, str, str], list[Point]] = {}
    for c in comparisons:
        groups.setdefault((c.point.model, c.point.gpu, c.point.phase), []).append(c.point)
    return {p for points in groups.values() for i, p in enumerate(sorted(points, key=order)) if i % 2 == 0}


@dataclass(frozen=True)
class Calibration:
    """Per GPU, the GpuCard fields fitted (models/catalog/catalog.py CALIBRATION), and the MoE efficiency."""

    gpus: Mapping[str, Mapping[str, float | None]]  # gpu -> {field: value}, fields of FIELD_GRID
    moe_efficiency: float


# the fitted GpuCard fields, their values before any fit, and the values the grid search tries
UNCALIBRATED: dict[str, float | None] = {"compute_scale": 1.0, "memory_scale": 1.0, "link_scale": 1.0,
                                         "nvlink_latency_us": 8.0, "pcie_latency_us": 25.0, "pcie_host_gbps": None,
                                         "nvlink_bulk_latency_us": None, "bulk_link_scale": 1.0}
FIELD_GRID: dict[str, tuple[float | None, ...]] = {
    "compute_scale": tuple(round(0.50 + 0.05 * i, 2) for i in range(19)),  # 0.50 .. 1.40 (efficiency <= 1)
    "memory_scale": tuple(round(0.75 + 0.025 * i, 3) for i in range(25)),  # 0.75 .. 1.35 (efficiency <= 1)
    "link_scale": tuple(round(0.10 + 0.05 * i, 2) for i in range(27)),  # 0.10 .. 1.40
    "nvlink_latency_us": (1, 2, 3, 4, 5, 6, 7, 8, 10, 12),
    "pcie_latency_us": (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15, 20, 25),
    "pcie_host_gbps": tuple(round(0.5 * i, 1) for i in range(2, 41)),  # 1 .. 20 GB/s
    "nvlink_bulk_latency_us": (None,) + tuple(float(v) for v in range(10, 65, 5)),  # None: one algorithm; 10 .. 60
    "bulk_link_scale": tuple(round(0.10 + 0.05 * i, 2) for i in range(27)),  # 0.10 .. 1.40
}
MOE_GRID = tuple(round(0.20 + 0.05 * i, 2) for i in range(17))  # 0.20 .. 1.00 (a prior: not below a fifth)


def fitted_fields(name: str) -> tuple[str, ...]:
    """What is fitted on a GPU: the three efficiency scales, the latency of the link its TP uses,
    over NVLink the large-message all-reduce algorithm (its latency and link scale), and the host
    path's bandwidth where a PCIe ring of the grid's TP leaves its switch."""
    card = gpu(name)
    fields = ("compute_scale", "memory_scale", "link_scale")
    if card.nvlink_gbps:
        return fields + ("nvlink_latency_us", "nvlink_bulk_latency_us", "bulk_link_scale")
    return fields + ("pcie_latency_us",) + (("pcie_host_gbps",) if card.pcie_switch_gpus < max(TPS) else ())


def uncalibrated_gpu(name: str, fields: Mapping[str, float | None] = {}) -> GpuCard:
    """The catalog's GPU without its calibration, with `fields` set."""
    changes: dict[str, Any] = {**UNCALIBRATED, **fields}  # GpuCard fields, each a number (or None)
    return replace(gpu(name), **changes)


def builtin_time_s(card: ModelCard, point: Point, fields: Mapping[str, float | None] = {},
                   moe_efficiency: float = DEFAULT_SETTINGS.moe_efficiency) -> float:
    settings = replace(DEFAULT_SETTINGS, moe_efficiency=moe_efficiency)
    return Engine(card, uncalibrated_gpu(point.gpu, fields), point.tp, settings=settings).iteration_time_s(point.work)


def _loss(items, fields_of, moe_efficiency) -> float:
    """Mean absolute log ratio builtin / aiconfigurator."""
    if not items:
        return 0.0
    return sum(abs(math.log(builtin_time_s(card, c.point, fields_of(c.point.gpu), moe_efficiency) / c.aiconfigurator_s))
               for card, c in items) / len(items)


def _fit_moe(items, fields_of) -> float:
    moe = [(card, c) for card, c in items if card.moe is not None]
    return min(MOE_GRID, key=lambda e: (_loss(moe, fields_of, e), abs(e - 1))) if moe else 1.0


def _nearest_default(name: str, field_name: str, value: float | None) -> float:
    """How far `value` is from the uncalibrated GPU (ties of the fit go to the nearest). A field
    that is None uncalibrated is nearest to None, then to the figure it stands in for: the PCIe
    bandwidth (host path), the small-message latency (bulk all-reduce)."""
    if value is None:
        return 0.0
    default = UNCALIBRATED[field_name]
    if default is None:
        uncalibrated = uncalibrated_gpu(name)
        default = uncalibrated.pcie_gbps if field_name == "pcie_host_gbps" else uncalibrated.nvlink_latency_us
    return 1.0 + abs(value - default)


def _fit_gpu(name: str, items, start: Mapping[str, float | None], moe_efficiency: float, sweeps: int = 2) -> dict[str, float | None]:
    """The GPU's fields by coordinate descent on a grid: each field in turn with the others fixed,
    `sweeps` times (ties: the value nearest the uncalibrated one)."""
    fields = dict(start)
    for _ in range(sweeps):
        for field_name in fitted_fields(name):
            def loss(value, field_name=field_name):
                trial = {**fields, field_name: value}
                return _loss(items, lambda _: trial, moe_efficiency), _nearest_default(name, field_name, value)
            fields[field_name] = min(FIELD_GRID[field_name], key=loss)
    return fields


def fit_calibration(cards: Mapping[str, ModelCard], comparisons: Sequence[Comparison], keep: Iterable[str] = (),
                    threshold: float = 0.15, rounds: int = 2, split: str = "stated") -> Calibration:
    """Fit on the training points, `rounds` times: the MoE efficiency, then the fields of every
    GPU with a (phase) group whose training error exceeds `threshold` -- except the GPUs in `keep`
    (whose numbers shipped profiles were generated with) -- kept only if the larger of the two
    phases' training errors falls."""
    training = training_points(comparisons, split)
    items = [(cards[c.point.model], c) for c in comparisons if c.point in training]
    fitted: dict[str, dict[str, float | None]] = {}

    def fields_of(name: str) -> Mapping[str, float | None]:
        return fitted.get(name, {})

    moe_efficiency = 1.0
    for _ in range(rounds):
        moe_efficiency = _fit_moe(items, fields_of)
        for name in sorted({c.point.gpu for _, c in items} - set(keep)):
            mine = [(card, c) for card, c in items if c.point.gpu == name]
            phases = [[i for i in mine if i[1].point.phase == phase] for phase in ("decode", "prefill")]
            before = [_loss(group, fields_of, moe_efficiency) for group in phases]
            if name not in fitted and max(before) <= threshold:
                continue
            trial = _fit_gpu(name, mine, fields_of(name), moe_efficiency)
            after = [_loss(group, lambda _: trial, moe_efficiency) for group in phases]
            if max(after) < max(before):  # kept only if the worse phase improves
                fitted[name] = trial
    return Calibration({name: dict(fields) for name, fields in fitted.items()}, moe_efficiency)


def calibrated_errors(cards: Mapping[str, ModelCard], comparisons: Sequence[Comparison], calibration: Calibration,
                      training: bool | None = None, split: str = "stated") -> list[Comparison]:
    """The comparisons re-timed with `calibration` (only the training or held-out points of
    `split` if given)."""
    fit_half = training_points(comparisons, split)
    chosen = [c for c in comparisons if training is None or (c.point in fit_half) == training]
    return [Comparison(c.point, builtin_time_s(cards[c.point.model], c.point, calibration.gpus.get(c.point.gpu, {}),
                                               calibration.moe_efficiency), c.aiconfigurator_s) for c in chosen]


def summary(comparisons: Sequence[Comparison]) -> dict[tuple[str, str], tuple[int, float, float]]:
    """(GPU, phase) -> (points, mean signed error, mean absolute error)."""
    groups: dict[tuple[str, str], list[float]] = {}
    for c in comparisons:
        groups.setdefault((c.point.gpu, c.point.phase), []).append(c.error)
    return {k: (len(v), sum(v) / len(v), sum(abs(e) for e in v) / len(v)) for k, v in sorted(groups.items())}


