"""How a replica's capacity and light-load latency change with its GPU share, from the engine model.

A profile measures some fractions of a (gpu_type, tp); the curve of an unprofiled fraction is the
measured neighbours' curves scaled by the engine model's ratios between the target share and
theirs (models/instance/profile.py `derive_curve`, docs/model.md "Profiles"). This module gives
those ratios for one model on one GPU type and TP degree (models/performance/engine.py):

    light-load latency  L(f) = prefill(P) + (C - 1) * decode_step(1, P + C/2)     one request alone
    capacity            T(f) = b / (C * decode_step(b, P + C/2) + b (P + m(f)) / budget * chunk(budget))
                        b    = min(B, kv_tokens(f) // (P + C))                    sequences that fit
                        m(f) = X * max(0, 1 - kv_tokens(f) / W)                   prefix-cache misses
    encoders            T(f) = (budget / P) / chunk(budget),  L(f) = prefill(P)
    load shape          g_f(u) = M_f(u T(f)) / M_f(0.05 T(f))                  where the rise changes
    excess change       (g_f(u) - 1 + e) / (g_f0(u) - 1 + e)      scales a neighbour's rise over its light load

(`chunk(budget)` is one iteration of `budget` prompt tokens, the chunked-prefill token budget).
kv_tokens(f) is the replica's KV cache at share f, a step in the share that cuts the batch where
the cache runs short (the 8B verifier on one H100 gains 63% of capacity from f = 0.3 to 0.4), and
iteration times are work / share plus fixed costs. The request shape (P prompt and C completion
tokens, at most B sequences at once) is not in a profile: it is the grid point whose T and L, up to
one scale each, best fit the measured fractions (least squares of the log ratios, plus a tenth of
the squared log scales), so the shape stands for the profile's own mix of lengths; the prefix-cache
term (X tokens per request that miss while the cache cannot hold a working set of W tokens) is
added only where it cuts the misfit to a quarter (a verifier that re-reads long shared prefixes).
M_f(r) is the mean latency at rate r of the fitted shape's requests simulated at share f as profile
synthesis measures a curve (Poisson arrivals on one replica, models/profiles/synthesize.py); used only
where a measured neighbour's rise with the load does not carry over (`rise_changes`: where a share's
KV cache caps the batch, and for encoders), about 0.03-0.5 s per share, once per process.
Deterministic; cached per (model, gpu, tp, measured points) and per profile object.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import ClassVar

import numpy as np

from scepsy.models.catalog.catalog import GpuCard, ModelCard
from scepsy.models.performance.engine import DEFAULT_SETTINGS, Engine, IterationWork, causal_attention
from scepsy.models.performance.replica import Request, run_poisson, unit_gaps

PROMPT_GRID = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
COMPLETION_GRID = (1, 4, 16, 64, 128, 256, 512, 1024)
BATCH_GRID = (8, 16, 32, 48, 64, 96, 128, 192, 256)
# the fit: ratios between shares count fully, the absolute level (the catalogue's calibration
# against the measured one) a tenth: it picks among shapes with alike ratios
LEVEL_WEIGHT = 0.1
PREFIX_GRID = (256, 1024, 4096, 16384)
WORKING_SET_GRID = (2**14, 2**15, 2**16, 2**17, 2**18, 2**19, 2**20)
MISS_GAIN = 0.25  # prefix-cache misses are kept only where they cut the misfit to a quarter
LIGHT_LOAD = 0.05  # the load shapes' first load: the latency they are relative to (rate / T(f))


@dataclass(frozen=True)
class ShareModel:
    """The engine model of one (model, gpu, tp) for the fitted request shape: `at(f)` gives the
    modelled (capacity_rps, light-load latency_s) at share f; only their ratios are used."""

    model: ModelCard
    gpu: GpuCard
    tp: int
    prompt_tokens: int
    completion_tokens: int
    max_batch: int  # the most sequences that run at once where the KV cache does not bind
    prefix_tokens: int = 0  # prompt tokens per request that hit the prefix cache when it holds the working set
    working_set_tokens: int = 1  # KV the prefix cache needs to hold all of them

    def at(self, fraction: float) -> tuple[float, float]:
        return _modelled(self.model, self.gpu, self.tp, fraction, self.prompt_tokens, self.completion_tokens,
                         self.max_batch, self.prefix_tokens, self.working_set_tokens)

    light_load: ClassVar[float] = LIGHT_LOAD  # the utilisation the load shapes are relative to

    def load_shape(self, fraction: float, utilisation) -> np.ndarray:
        """Latency at each `utilisation` (rate / T(f)) over the latency at the lightest load, of the
        fitted request shape simulated at share `fraction` as profile synthesis measures a curve
        (`_simulated_load_shape`); used where the rise changes between shares (`rise_changes`)."""
        loads, shape = _simulated_load_shape(self.model, self.gpu, self.tp, fraction, self.prompt_tokens,
                                             self.completion_tokens, self.max_batch)
        return np.interp(np.asarray(utilisation, dtype=float), loads, shape)

    def excess_change(self, measured: float, fraction: float, utilisation) -> np.ndarray:
        """How much more latency rises over its light-load value at `fraction` than at the
        `measured` share, at each `utilisation`: (g_f(u) - 1 + e) / (g_f0(u) - 1 + e), the simulated
        load shapes' excesses (`load_shape`, 1 at `light_load`), e = EXCESS_FLOOR so that where
        neither rises (light load) the ratio is 1, not a ratio of noise."""
        target, neighbour = self.load_shape(fraction, utilisation), self.load_shape(measured, utilisation)
        return (target - 1 + EXCESS_FLOOR) / (neighbour - 1 + EXCESS_FLOOR)

    def rise_changes(self, measured: float, fraction: float) -> bool:
        """Whether latency rises with the load differently at `fraction` than at the `measured`
        share, so that the measured curve's rise is not carried over as it is (`excess_change`
        scales it): unless both shares are compute-bound (a fuller batch slows every iteration
        alike), and for encoders, whose queue of lumps (a chunked-prefill iteration finishes
        budget / P requests at once) changes with the share as an iteration's fixed part does. A
        share whose KV cache caps the batch acts as as many servers as sequences fit, a number the
        share sets: the ensemble's Llama-3.1-8B on an A6000 rises 1.8x from 5% to 80% of its
        capacity at f = 0.4 and 2.6x at 0.5, both capped."""
        return self.model.encoder or "memory" in (self.regime(measured), self.regime(fraction))

    def regime(self, fraction: float) -> str:
        """"memory" where the KV cache caps the batch below `max_batch` (the replica then acts as
        that many servers: latency stays flat until the batch is full), else "compute" (a fuller
        batch slows every iteration: latency grows with the load)."""
        if self.model.encoder:
            return "compute"
        engine = _engine(self.model, self.gpu, self.tp, fraction)
        fitting = engine.kv_capacity_tokens // (self.prompt_tokens + self.completion_tokens)
        return "memory" if fitting < self.max_batch else "compute"


@lru_cache(maxsize=4096)
def _engine(model: ModelCard, gpu: GpuCard, tp: int, fraction: float) -> Engine:
    return Engine(model, gpu, tp, min(max(fraction, 1e-6), 1.0))


@lru_cache(maxsize=262144)
def _light(model: ModelCard, gpu: GpuCard, tp: int, fraction: float, prompt: int, completion: int) -> float:
    """Latency of one request alone: its prefill, then its decode steps."""
    engine = _engine(model, gpu, tp, fraction)
    if model.encoder:
        return engine.prefill_time_s(prompt)
    return engine.prefill_time_s(prompt) + (completion - 1) * engine.decode_step_time_s(1, prompt + completion / 2)


@lru_cache(maxsize=262144)
def _chunk_s(model: ModelCard, gpu: GpuCard, tp: int, fraction: float, prompt: int) -> float:
    """One iteration of a full chunked-prefill token budget of `prompt`-token requests."""
    engine = _engine(model, gpu, tp, fraction)
    budget = engine.settings.max_num_batched_tokens
    attention = budget * prompt if model.encoder else causal_attention(budget)
    return engine.iteration_time_s(IterationWork(
        prefill_tokens=budget, prefill_attention=attention, prefills_finishing=max(budget // prompt, 1)))


@lru_cache(maxsize=262144)
def _decode_s(model: ModelCard, gpu: GpuCard, tp: int, fraction: float, prompt: int, completion: int,
              batch: int) -> float:
    """The decode steps of `batch` requests running together."""
    if model.encoder:
        return 0.0
    return completion * _engine(model, gpu, tp, fraction).decode_step_time_s(batch, prompt + completion / 2)


def _modelled(model: ModelCard, gpu: GpuCard, tp: int, fraction: float, prompt: int, completion: int,
              max_batch: int, prefix_tokens: int = 0, working_set_tokens: int = 1) -> tuple[float, float]:
    """(capacity_rps, light-load latency_s) of the engine model; capacity 0 where nothing fits.
    Under load, `prefix_tokens` more prompt tokens per request miss the prefix cache in the share
    of the working set (`working_set_tokens`) the KV cache cannot hold."""
    engine = _engine(model, gpu, tp, fraction)
    budget = engine.settings.max_num_batched_tokens
    if model.encoder:
        batch = max(budget // prompt, 1)
    else:
        batch = min(max_batch, engine.kv_capacity_tokens // (prompt + completion)) if engine.fits else 0
    if batch < 1:
        return 0.0, math.inf
    missed = prefix_tokens * min(max(1.0 - engine.kv_capacity_tokens / working_set_tokens, 0.0), 1.0)
    busy_s = _decode_s(model, gpu, tp, fraction, prompt, completion, batch) \
        + batch * (prompt + missed) / budget * _chunk_s(model, gpu, tp, fraction, prompt)
    return batch / busy_s, _light(model, gpu, tp, fraction, prompt, completion)


# the load shape where the rise changes: rates as fractions of the modelled capacity T(f), each
# point SHAPE_REQUESTS fixed-shape requests (common random numbers at every share)
SHAPE_LOADS = (LIGHT_LOAD, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)
SHAPE_REQUESTS = 400
SHAPE_LUMPS = 30  # encoders: iterations of budget / prompt requests per point
SHAPE_WARMUP = 0.25  # the share of a point's requests not measured (synthesis' warm-up)
EXCESS_FLOOR = 0.02  # excess rises below 2% are Poisson noise of the simulated points, not a shape


@lru_cache(maxsize=256)
def _simulated_load_shape(model: ModelCard, gpu: GpuCard, tp: int, fraction: float, prompt: int, completion: int,
                          max_batch: int) -> tuple[np.ndarray, np.ndarray]:
    """(SHAPE_LOADS, mean latency over the first point's, non-decreasing): Poisson arrivals of
    `prompt`/`completion`-token requests on one replica of the engine model at `fraction`, at most
    `max_batch` running, measured as profile synthesis measures a rate point (models/performance/
    replica.py `run_poisson`, a quarter warm-up, seed 0). A KV cache that caps the batch makes the
    replica act as that many servers of a near-constant service time: flat, then a queue at once; a
    compute-bound batch slows every iteration as it fills; an encoder finishes lumps of requests."""
    capacity, _ = _modelled(model, gpu, tp, fraction, prompt, completion, max_batch)
    if not capacity > 0:  # nothing fits: no rise to speak of (such a share gets no curve)
        return np.array(SHAPE_LOADS), np.ones(len(SHAPE_LOADS))
    settings = replace(DEFAULT_SETTINGS, max_num_seqs=max(1, min(max_batch, DEFAULT_SETTINGS.max_num_seqs)))
    engine = Engine(model, gpu, tp, min(max(fraction, 1e-6), 1.0), settings)
    count = SHAPE_REQUESTS
    if model.encoder:  # an iteration finishes budget / prompt requests at once: SHAPE_LUMPS of them per point
        count = max(count, SHAPE_LUMPS * max(settings.max_num_batched_tokens // prompt, 1))
    gaps = unit_gaps(random.Random(0), count)
    warm = int(count * SHAPE_WARMUP)
    latency = []
    for load in SHAPE_LOADS:
        requests = [Request(prompt, completion) for _ in range(count)]
        run_poisson(engine, requests, gaps, load * capacity, SHAPE_WARMUP)
        done = [r.latency_s for r in requests[warm:] if r.latency_s is not None]
        latency.append(float(np.mean(done)) if done else math.inf)
    rising = np.maximum.accumulate(np.array(latency))
    return np.array(SHAPE_LOADS), rising / rising[0]


def _misfit(model: ModelCard, gpu: GpuCard, tp: int, points, prompt: int, completion: int,
            max_batch: int, prefix_tokens: int = 0, working_set_tokens: int = 1) -> float:
    """Squared log error of the modelled capacity and latency against the measured ones, each up to
    one scale (only ratios between shares are used), plus LEVEL_WEIGHT times the squared scales."""
    modelled = [_modelled(model, gpu, tp, f, prompt, completion, max_batch, prefix_tokens, working_set_tokens)
                for f, _, _ in points]
    if any(c <= 0 for c, _ in modelled):
        return math.inf
    capacity = np.log([t for _, t, _ in points]) - np.log([c for c, _ in modelled])
    latency = np.log([lat for _, _, lat in points]) - np.log([lat for _, lat in modelled])
    error = 0.0
    for residual in (capacity, latency):
        centre = float(residual.mean())
        error += float(np.sum((residual - centre) ** 2)) + LEVEL_WEIGHT * len(residual) * centre**2
    return error


@lru_cache(maxsize=4096)
def _fit(model: ModelCard, gpu: GpuCard, tp: int, points: tuple[tuple[float, float, float], ...]) -> ShareModel:
    """The grid shape (P, C, max batch) of least `_misfit`; the first of equals (deterministic).
    Where the KV cache caps the batch at every measured share, every larger max batch fits them
    exactly alike (the data bound it only from below); the first of equals is then the smallest
    (the grid is ordered by batch within each (P, C)), so a larger share is not given capacity from a
    batch no measurement showed."""
    completions = (0,) if model.encoder else COMPLETION_GRID
    batches = (DEFAULT_SETTINGS.max_num_seqs,) if model.encoder else BATCH_GRID
    grid = [(p, c, b) for p in PROMPT_GRID for c in completions for b in batches]
    error, best = min((_misfit(model, gpu, tp, points, *shape), i) for i, shape in enumerate(grid))
    shape = grid[best]
    if not model.encoder:  # then prefix-cache misses, kept where they explain most of what is left
        misses = [(x, w) for x in PREFIX_GRID for w in WORKING_SET_GRID]
        with_misses, index = min((_misfit(model, gpu, tp, points, *shape, *m), i) for i, m in enumerate(misses))
        if with_misses < MISS_GAIN * error:
            return ShareModel(model, gpu, tp, *shape, *misses[index])
    return ShareModel(model, gpu, tp, *shape)


def share_model(model: ModelCard | None, gpu: GpuCard | None, tp: int, measured) -> ShareModel | None:
    """The engine model's share shape for `model` on `gpu` x `tp` (the instance's cards:
    models/performance/cards.py), its request shape fitted to the `measured` curves (ProfileCurve:
    fraction, capacity_rps, light-load latency); None without a model or GPU card, or with fewer
    than two measured fractions."""
    if model is None or gpu is None or len(measured) < 2:
        return None
    points = tuple((c.fraction, c.capacity_rps, float(c.latencies_s["mean"][0])) for c in measured)
    if any(not (t > 0 and lat > 0) for _, t, lat in points):
        return None
    fitted = _fit(model, gpu, tp, points)
    return fitted if all(fitted.at(f)[0] > 0 for f, _, _ in points) else None


@lru_cache(maxsize=1024)
def profile_share_model(profile, model: ModelCard | None, gpu: GpuCard | None, gpu_type: str, tp: int) -> ShareModel | None:
    """`share_model` of an LlmProfile's measured curves of (gpu_type, tp), once per profile object."""
    return share_model(model, gpu, tp, profile.curves.get((gpu_type, tp), ()))
