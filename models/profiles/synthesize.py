"""Synthesized per-replica profiles: a discrete-event simulation of one replica under Poisson load.

For each (tp, fraction) of one model on one GPU type, `synthesize` finds the replica's saturation
throughput (a closed loop that keeps the engine full), then sweeps the arrival rate from light
load (5% of it) to past saturation (120%), simulating `requests_per_point` Poisson arrivals per
rate on models/performance/replica.py. The capacity, the largest stable rate, is then located on
the curve rather than on the grid (`sweep`): rates past the grid until one is unstable (a closed
loop of session replays with think times can underestimate saturation severalfold), then
bisections between the largest stable and the next unstable rate. Every rate point becomes one
profile row (models/instance/profile.py format):

    throughput   the rate times completions / arrivals in the window from the end of the warm-up
                 (the first `warmup_fraction` of the requests) to the last arrival: the replica's
                 steady-state output rate
    latency_*    arrival-to-completion latency of the requests after the warm-up: mean, p50, p90, p99

Rows whose throughput falls below 0.95 x rate are written too: they mark saturation, and the
profile loader drops them. All rate points replay the same requests and the same exponential
gaps scaled by 1/rate (common random numbers, normalised so that the realised rate is the nominal
one), so the curve is smooth in the rate and stability is judged against the rate actually offered.

Request lengths come from a `RequestSource` (models/profiles/request_sources.py: fixed lengths, the
Azure traces, a CSV, or a calls JSONL whose request structure is replayed with its dependencies).
A request longer than the model's context or than the replica's KV cache is clipped to fit.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import simpy

from scepsy.models.catalog.catalog import GpuCard, ModelCard
from scepsy.models.performance.engine import DEFAULT_SETTINGS, Engine, EngineSettings, IterationTimer
from scepsy.models.errors import InputError
from scepsy.models.instance.profile import PROFILE_COLUMNS, STABLE_THROUGHPUT_RATIO, as_written
from scepsy.models.performance.replica import ReplicaSim, Request, run_poisson, unit_gaps
from scepsy.models.profiles.request_sources import RequestShape, RequestSource, Session, SessionCall
# scepsy.api reads request sources through this module
from scepsy.models.profiles.request_sources import load_request_source as load_request_source

RATE_POINTS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.1, 1.2)
# fractions of the located capacity where the curve must have a row (within FILL_TOLERANCE of it):
# latency is convex there, and a straight line across a wider gap overstates it (the verifier's
# grid ends at a third of its capacity: a line from 0.79 to 0.99 of it read 0.134 s at 0.8 where
# rows measure 0.100-0.117 s, docs/evidence.md section 4)
FILL_POINTS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
FILL_TOLERANCE = 0.025


@dataclass(frozen=True)
class SynthesisSettings:
    # None: DEFAULT_REQUESTS_PER_POINT, or more for lumpy completions (`requests_per_point`)
    requests_per_point: int | None = None
    rate_points: tuple[float, ...] = RATE_POINTS  # fractions of the saturation throughput
    warmup_fraction: float = 0.25  # long enough for the queue to reach its steady level
    min_sessions: int = 300  # traced requests replayed per rate point, at least
    seed: int = 0
    engine: EngineSettings = DEFAULT_SETTINGS
    # the capacity (largest stable rate) is found on the curve, not on the grid: past the grid,
    # the rate grows by EXTENSION_FACTOR until a row is unstable (at most `max_extensions` times),
    # then `refine_steps` bisections between the largest stable rate and the next unstable one
    max_extensions: int = 8
    refine_steps: int = 4
    fill_points: tuple[float, ...] = FILL_POINTS  # then rows where these fractions of it lack one
    # requests whose completions come in lumps (prefill-only calls: a chunked-prefill iteration
    # finishes budget / prompt of them at once) are replayed for at least this many iterations'
    # worth per point, so that the stability count is not decided by where a lump falls
    min_lump_iterations: int = 100
    # independent draws of requests and gaps measured at every rate and pooled (`pooled_row`):
    # ten bring the latency noise between seeds at 10-80% of the capacity under 10% on 7 of the 13
    # curves where one draw moved most (the reranker on one H100 at f = 0.1: 24% -> 9.5%); the
    # shipped verifier and generator profiles pool ten (docs/evidence.md, section 4)
    replications: int = 1
    # the capacity must hold over a long window in every draw (`confirm`): the largest stable rate
    # of the rows is measured again on `confirm_draws` new draws whose measured window holds
    # `confirm_window_s` of arrivals (0: not confirmed), and stepped down by CONFIRM_STEP until
    # every draw keeps up, then bisected `confirm_steps` times between the two. Near its capacity
    # a replica holds tens of calls in flight, and one draw of 400 calls neither reaches the
    # queue's level nor sees the prefix cache thrash (docs/model.md, "Capacity that holds")
    confirm_window_s: float = 0.0
    confirm_calls: int = 4000  # and at least this many calls in each long window
    # and at most this many (where confirm_calls is smaller): the window is long against the calls
    # in flight, which is what it is for. 200 s of the verifier hold about 220 times its calls in
    # flight (28 req/s x 0.9 s); 250,000 calls of e5-base-v2 at 32,000 req/s on an H100 (10 ms
    # calls) hold about 800 times its, where 200 s would replay 6.4 million per draw. Only
    # e5-base-v2 of the shipped profiles reaches the cap (the next fastest, 950 req/s: 190,000)
    confirm_max_calls: int = 250_000
    confirm_draws: int = 3
    confirm_steps: int = 3
    # a confirmed curve's steep part is measured in steady state too (`steady`): the rows from
    # `steady_from` x the confirmed capacity up to it are measured again on `confirm_draws` draws
    # whose measured window holds `steady_in_flight` times the calls in flight (rate x latency of
    # the short row), at least `confirm_calls` and at most `confirm_max_calls` calls. A short draw
    # starts empty and ends before a replica near its capacity reaches its queue's and prefix
    # cache's level: ten short draws put the beam verifier's mean latency on two A6000s at 81% of
    # its capacity at 0.140 s, 200 s windows at 0.173 s; the generator's at 83% at 0.774 s, windows
    # of 50 and 100 times its calls in flight at 0.851 and 0.850 s. Below 70% of the capacity the
    # two agree within the draws' noise (docs/model.md, "Capacity that holds")
    steady_from: float = 0.5
    steady_in_flight: float = 50.0


DEFAULT_REQUESTS_PER_POINT = 400
CONFIRM_STEP = 0.95  # the next rate tried below one that did not hold (a 5% step down)
# a long window holds where this share of its arrivals completes in it. A stable replica completes
# all of them but the change in the calls in flight between the window's ends, a small share of
# CONFIRM_CALLS or more; a queue that grows by 1% of the arrivals over the window does not hold.
# Stricter than the 97% the workflow simulator checks a plan's claims by (planner/studies/claims.py):
# a workflow request waits on several calls in a row, so a replica's slow queue growth compounds
CONFIRM_RATIO = 0.99


def check_context(source: RequestSource, model: ModelCard) -> None:
    """Refuse a request of the user's own whose tokens exceed the model's context (it could never
    run; clipping it silently would profile another workload)."""
    if source.clip_to_context:
        return
    shapes = list(source.shapes) + [c.shape for s in source.sessions for w in s.waves for c in w]
    for shape in shapes:
        per_sequence = math.ceil(shape.prompt_tokens / max(shape.sequences, 1))
        tokens = per_sequence if model.encoder else shape.prompt_tokens + shape.completion_tokens
        if tokens > model.max_context:
            what = "prompt tokens per sequence" if model.encoder else "prompt + completion tokens"
            raise InputError(
                source.name, "requests", f"a request of {tokens} {what} exceeds {model.name}'s context of {model.max_context}",
                "give lengths within the model's context, or pick a model with a longer one", argument=True,
            )


def fit_shape(shape: RequestShape, engine: Engine) -> RequestShape:
    """Clip a request to the model's context and to the replica's KV cache (encoders: context)."""
    limit = engine.model.max_context
    if not engine.model.encoder:
        limit = min(limit, engine.kv_capacity_tokens)
    per_seq = shape.prompt_tokens / max(shape.sequences, 1)
    if engine.model.encoder:
        per_seq = min(per_seq, limit)
        prompt = max(int(per_seq * shape.sequences), 1)
        return RequestShape(prompt, 0, 0, shape.sequences)
    completion = max(min(shape.completion_tokens, limit // 2), 1)
    prompt = max(min(shape.prompt_tokens, limit - completion), 1)
    return RequestShape(prompt, completion, min(shape.cached_tokens, prompt - 1), 1)


def _fit_session(session: Session, engine: Engine) -> Session:
    waves = tuple(
        tuple(
            SessionCall(fit_shape(c.shape, engine), c.call, c.prefix_call, c.prefix_tokens)
            for c in wave
        )
        for wave in session.waves
    )
    return Session(waves, session.gaps_s)


def _request(shape: RequestShape, replay_cached: bool = True) -> Request:
    return Request(shape.prompt_tokens, shape.completion_tokens, sequences=shape.sequences,
                   cached_tokens=shape.cached_tokens if replay_cached else 0)


def _session_requests(index: int, wave: tuple[SessionCall, ...]) -> list[Request]:
    return [
        Request(
            c.shape.prompt_tokens, c.shape.completion_tokens, sequences=c.shape.sequences,
            prefix_key=None if c.prefix_call is None else (index, c.prefix_call),
            prefix_tokens=c.prefix_tokens, store_key=(index, c.call), tag=index,
        )
        for c in wave
    ]


def _middle_rate(finished: list[float]) -> float:
    finished = sorted(finished)
    lo, hi = len(finished) // 5, len(finished) - len(finished) // 5
    if hi - lo < 2 or finished[hi - 1] <= finished[lo]:
        return len(finished) / max(finished[-1], 1e-9)
    return (hi - lo - 1) / (finished[hi - 1] - finished[lo])


def saturation_rps(engine: Engine, shapes: Sequence[RequestShape]) -> float:
    """Throughput of the replica kept full: a closed loop of max_num_seqs clients replaying `shapes`."""
    env = simpy.Environment()
    replica = ReplicaSim(env, engine)
    queue = list(shapes)
    finished: list[float] = []

    def client():
        while queue:
            yield replica.submit(_request(queue.pop()))
            finished.append(env.now)

    for _ in range(min(engine.settings.max_num_seqs, max(len(shapes) // 4, 1))):
        env.process(client())
    env.run()
    return _middle_rate(finished)


def session_saturation_rps(engine: Engine, sessions: Sequence[Session]) -> float:
    """Calls/s of the replica kept busy by concurrent session replays (gaps included)."""
    env = simpy.Environment()
    replica = ReplicaSim(env, engine)
    queue = list(enumerate(sessions))
    finished: list[float] = []
    width = max(float(np.mean([len(w) for s in sessions for w in s.waves])), 1.0)

    def client():
        while queue:
            index, session = queue.pop()
            for gap, wave in zip(session.gaps_s, session.waves):
                if gap > 0:
                    yield env.timeout(gap)
                yield env.all_of([replica.submit(r) for r in _session_requests(index, wave)])
                finished.extend([env.now] * len(wave))

    for _ in range(max(min(int(engine.settings.max_num_seqs / width), len(sessions) // 4), 1)):
        env.process(client())
    env.run()
    return _middle_rate(finished)


def _row(rate: float, requests: list[Request], window: tuple[float, float], measured: list[Request]) -> dict:
    """One profile row. Throughput: the rate times the ratio of completions to arrivals inside the
    window (output over input flow of the same window, free of edge and sampling effects)."""
    start, end = window
    completed = sum(1 for r in requests if r.finish_s is not None and start <= r.finish_s <= end)
    arrived = sum(1 for r in requests if start <= r.arrival_s <= end)
    done = [r for r in measured if r.finish_s is not None]
    latencies = np.array([r.latency_s for r in done]) if done else np.array([math.inf])
    # rounded as written: a ratio of exactly 0.95 (57 of 60) must be judged alike here and by the loader
    return {
        "arrival_rate": as_written(rate),
        "throughput": as_written(rate * completed / max(arrived, 1)),
        "latency_mean": as_written(float(latencies.mean())),
        "latency_p50": as_written(float(np.percentile(latencies, 50))),
        "latency_p90": as_written(float(np.percentile(latencies, 90))),
        "latency_p99": as_written(float(np.percentile(latencies, 99))),
    }


def measure_point(engine: Engine, shapes: Sequence[RequestShape], gaps: np.ndarray, rate: float,
                  warmup_fraction: float) -> dict:
    """Simulate Poisson arrivals at `rate` (unit-mean `gaps` / rate) of `shapes`; one profile row."""
    requests = [_request(s) for s in shapes]
    window = run_poisson(engine, requests, gaps, rate, warmup_fraction)
    return _row(rate, requests, window, requests[int(len(requests) * warmup_fraction):])


def measure_sessions_point(engine: Engine, sessions: Sequence[Session], gaps: np.ndarray, rate: float,
                           warmup_fraction: float) -> dict:
    """Replay `sessions` (Poisson session starts) so that calls arrive at `rate` per second on
    average; calls keep their order and prefix-cache dependencies; one profile row (per call)."""
    env = simpy.Environment()
    replica = ReplicaSim(env, engine)
    per_session = float(np.mean([s.calls for s in sessions]))
    arrivals = np.cumsum(np.asarray(gaps) * per_session / rate)
    warm = int(len(sessions) * warmup_fraction)
    window = (float(arrivals[warm]), float(arrivals[-1]))
    requests: list[Request] = []
    measured: list[Request] = []

    def replay(index: int, session: Session, at: float):
        yield env.timeout(at - env.now)
        for gap, wave in zip(session.gaps_s, session.waves):
            if gap > 0:
                yield env.timeout(gap)
            batch = _session_requests(index, wave)
            requests.extend(batch)
            if index >= warm:
                measured.extend(batch)
            yield env.all_of([replica.submit(r) for r in batch])

    for index, (session, at) in enumerate(zip(sessions, arrivals)):
        env.process(replay(index, session, float(at)))
    env.run(until=window[1] + max(3 * (window[1] - window[0]), 60.0))
    return _row(rate, requests, window, measured)


@dataclass(frozen=True)
class Skipped:
    tp: int
    fraction: float
    reason: str


EXTENSION_FACTOR = 1.25


def synthesize_curve(engine: Engine, source: RequestSource, settings: SynthesisSettings) -> list[dict]:
    """Rows of one (gpu, tp, fraction) curve: the sweep from 5% to 120% of saturation, extended
    and refined around the stability boundary (`sweep`). A source with sessions is replayed
    session by session (dependencies and prefix cache simulated); otherwise its calls arrive
    independently (traced cache hits replayed as hits). With `replications` > 1 every rate is
    measured on that many independent draws of requests and gaps and the rows are pooled
    (`pooled_row`); the grid is the first draw's, which alone is what one replication measures."""
    seeds: list[int | str] = [settings.seed, *(f"{settings.seed}:{i}" for i in range(1, settings.replications))]
    draws = [_workload(engine, source, settings, random.Random(seed)) for seed in seeds]

    def measure(rate: float) -> dict:
        # one draw's pooled row is its own row (its values are already rounded as written)
        return pooled_row([row_at(rate) for row_at, _ in draws])

    def long_row(rate: float) -> dict:
        return confirmation_row(engine, source, settings, rate)

    def steady_row(rate: float, short: dict) -> dict:
        return steady_state_row(engine, source, settings, rate, short)

    rows = sweep(measure, draws[0][1](), settings)
    if settings.confirm_window_s <= 0:
        return rows
    return steady(confirm(rows, long_row, measure, settings), steady_row, settings)


def _long_window(engine: Engine, source: RequestSource, settings: SynthesisSettings, measured: float) -> SynthesisSettings:
    """`settings` whose draws hold `measured` calls after the warm-up share (at least the short rows' count)."""
    calls = math.ceil(measured / (1 - settings.warmup_fraction))
    return replace(settings, requests_per_point=max(requests_per_point(source, engine, settings), calls))


def confirmation_row(engine: Engine, source: RequestSource, settings: SynthesisSettings, rate: float) -> dict:
    """The row at `rate` measured over long windows: `confirm_draws` new draws (their own seeds),
    each with enough requests that its measured window holds `confirm_window_s` of arrivals (at
    most `confirm_max_calls` calls) and at least `confirm_calls` calls,
    measured one after the other until one completes less than CONFIRM_RATIO of its arrivals in
    the window (then the rate does not hold, and that draw's row is the row). Otherwise the draws'
    pooled row, with the throughput of the worst draw: the rate holds only where every draw keeps
    up."""
    measured = max(min(rate * settings.confirm_window_s, settings.confirm_max_calls), settings.confirm_calls)
    long = _long_window(engine, source, settings, measured)
    rows: list[dict] = []
    for draw in range(settings.confirm_draws):
        row_at, _ = _workload(engine, source, long, random.Random(f"{settings.seed}:confirm:{draw}"))
        row = row_at(rate)
        if not _held(row):
            return row
        rows.append(row)
    return {**pooled_row(rows), "throughput": min(row["throughput"] for row in rows)}


def steady_state_row(engine: Engine, source: RequestSource, settings: SynthesisSettings, rate: float,
                     short: dict) -> dict:
    """The row at `rate` measured in steady state: `confirm_draws` draws (their own seeds) whose
    measured window holds `steady_in_flight` x the calls in flight the `short` row measured at
    this rate (Little's law: rate x mean latency), at least `confirm_calls` and at most
    `confirm_max_calls` calls; their pooled row."""
    in_flight = rate * float(short["latency_mean"])
    measured = min(max(settings.steady_in_flight * in_flight, settings.confirm_calls), settings.confirm_max_calls)
    long = _long_window(engine, source, settings, measured)
    rows = [_workload(engine, source, long, random.Random(f"{settings.seed}:steady:{draw}"))[0](rate)
            for draw in range(settings.confirm_draws)]
    return pooled_row(rows)


def steady(rows: list[dict], steady_row: Callable[[float, dict], dict], settings: SynthesisSettings) -> list[dict]:
    """`rows` (a confirmed curve) with every row from `steady_from` x the capacity (the largest
    stable rate) up to, not including, the capacity measured again in steady state
    (`steady_row(rate, row)`), then ended at the first of them that collapses (`end_at_collapse`).
    The capacity's own row is a long confirmation row already; the rest keep their short rows,
    whose latency a short window measures well away from capacity."""
    stable = [r["arrival_rate"] for r in rows if _stable(r)]
    if not stable:
        return rows
    capacity = max(stable)
    low = settings.steady_from * capacity
    measured = [steady_row(r["arrival_rate"], r) if low <= r["arrival_rate"] < capacity else r for r in rows]
    return end_at_collapse(measured, low)


def end_at_collapse(rows: list[dict], low: float) -> list[dict]:
    """A curve whose steady-state rows (from `low` up) include one that does not keep up ends
    there: the stable rows above the first such rate are left out, so the capacity is the largest
    stable rate below it; the rows that collapsed stay as the curve's end. A replica near its
    capacity can collapse and not recover (its prefix cache thrashes: the misses add prefill work,
    which queues more calls, which evicts more); three 200 s confirmation draws that keep up at a
    rate do not rule out a collapse over a longer run at a lower one (the beam verifier on half
    an A6000: confirmed at 20.52 req/s, its steady rows collapse at 19.32 and 19.93; one of four
    1,500 s runs falls behind at 18.5). Where no steady row collapses the rows are as they were."""
    collapsed = [r["arrival_rate"] for r in rows if r["arrival_rate"] >= low and not _stable(r)]
    stable = [r["arrival_rate"] for r in rows if _stable(r)]
    if not collapsed or not stable or min(collapsed) > max(stable):
        return rows
    first = min(collapsed)
    return [r for r in rows if r["arrival_rate"] < first or not _stable(r)]


def confirm(rows: list[dict], long_row: Callable[[float], dict], measure: Callable[[float], dict],
            settings: SynthesisSettings) -> list[dict]:
    """`rows` with their capacity confirmed over long windows (`confirmation_row`): the largest
    stable rate; where it holds, rates EXTENSION_FACTOR apart above it until one does not, else
    CONFIRM_STEP of the last rate tried until one holds (at most `max_extensions` steps either
    way); then `confirm_steps` bisections between the largest rate that held and the smallest
    that did not. The capacity is so the largest rate at which every long draw keeps up, above or
    below the short rows' one. The long rows replace the short ones at their rates; short
    rows above the confirmed capacity are left out (they were stable only over a short window),
    and the long rows that did not hold are kept: they mark where the replica collapses. Then the
    fill rows below the confirmed capacity that the rows lack (`fill_rates`)."""
    stable = [r["arrival_rate"] for r in rows if _stable(r)]
    if not stable:
        return rows
    long: dict[float, dict] = {}
    rate = max(stable)
    long[rate] = long_row(rate)
    # the short rows' capacity holds: rates EXTENSION_FACTOR apart above it until one does not
    # (a short draw can fall behind by chance where long ones keep up); else steps down
    step = EXTENSION_FACTOR if _held(long[rate]) else CONFIRM_STEP
    for _ in range(settings.max_extensions):
        if _held(long[rate]) != (step > 1):
            break
        rate = as_written(rate * step)
        long[rate] = long_row(rate)
    held = [r for r, row in long.items() if _held(row)]
    # a long row that did not hold is written only where the loader reads it as unstable too
    collapsed = [row for row in long.values() if not _stable(row)]
    if not held:
        return collapsed
    for _ in range(settings.confirm_steps):
        failed = [r for r, row in long.items() if not _held(row) and r > max(held)]
        if not failed:
            break
        rate = as_written((max(held) + min(failed)) / 2)
        long[rate] = long_row(rate)
        held = [r for r, row in long.items() if _held(row)]
    capacity = max(held)
    kept = [row for row in rows if row["arrival_rate"] < capacity and row["arrival_rate"] not in long]
    kept += [row for row in long.values() if _held(row) or not _stable(row)]
    kept += [measure(rate) for rate in fill_rates(kept, settings.fill_points)]
    return sorted(kept, key=lambda r: r["arrival_rate"])


def _workload(engine: Engine, source: RequestSource, settings: SynthesisSettings,
              rng: random.Random) -> tuple[Callable[[float], dict], Callable[[], float]]:
    """One draw of requests (or sessions) and unit gaps from `rng`: the row at a rate, and the
    saturation estimate of the draw (computed only when asked: a closed-loop run)."""
    n = requests_per_point(source, engine, settings)
    if source.sessions:
        sessions: list[Session] = []
        fitted: dict[int, Session] = {}  # a traced session drawn again is fitted once
        calls = 0  # kept as a running total: the draws of long windows hold thousands of sessions
        while calls < n or len(sessions) < settings.min_sessions:
            index = rng.randrange(len(source.sessions))
            if index not in fitted:
                fitted[index] = _fit_session(source.sessions[index], engine)
            sessions.append(fitted[index])
            calls += sessions[-1].calls
        session_gaps = unit_gaps(rng, len(sessions))
        return (lambda rate: measure_sessions_point(engine, sessions, session_gaps, rate, settings.warmup_fraction),
                lambda: session_saturation_rps(engine, sessions))
    shapes = [fit_shape(s, engine) for s in source.sample(rng, n)]
    gaps = unit_gaps(rng, len(shapes))
    return (lambda rate: measure_point(engine, shapes, gaps, rate, settings.warmup_fraction),
            lambda: saturation_rps(engine, shapes))


def pooled_row(rows: Sequence[dict]) -> dict:
    """One row from the rows of independent draws at one rate: throughput and latencies are their
    means (the draws measure about as many requests each, so the mean of their mean latencies
    stands for the pooled one; a percentile is the mean of the draws' percentiles). A draw that
    collapsed pulls the throughput below the stability ratio as often as it happens."""
    return {
        key: rows[0][key] if key == "arrival_rate" else as_written(float(np.mean([row[key] for row in rows])))
        for key in rows[0]
    }


def _stable(row: dict) -> bool:
    return row["throughput"] >= STABLE_THROUGHPUT_RATIO * row["arrival_rate"]


def _held(row: dict) -> bool:
    """A long row's rate holds (`confirm`)."""
    return row["throughput"] >= CONFIRM_RATIO * row["arrival_rate"]


def sweep(measure: Callable[[float], dict], saturation_rps_: float, settings: SynthesisSettings) -> list[dict]:
    """Rows at the grid `settings.rate_points` x the saturation estimate, then: while the fastest
    row is still stable (the estimate fell short of the replica's capacity, as a closed loop of
    session replays with think times does), rates EXTENSION_FACTOR apart until one is not; then
    bisections between the largest stable rate and the slowest unstable rate above it. The
    largest stable rate, the profile's capacity, is so the stability boundary of the curve to
    within 10% / 2^refine_steps of the grid, not whichever grid point happens to lie below it.
    Last, rows at `settings.fill_points` x that capacity where the rows so far leave a gap
    (`fill_rates`), so that the steep part of the curve is measured, not a straight line across it.
    The grid rows are the same with or without the extra ones (common random numbers)."""
    rows = [measure(point * saturation_rps_) for point in settings.rate_points]
    for _ in range(settings.max_extensions):
        fastest = max(rows, key=lambda r: r["arrival_rate"])
        if not _stable(fastest):
            break
        rows.append(measure(fastest["arrival_rate"] * EXTENSION_FACTOR))
    for _ in range(settings.refine_steps):
        stable = [r["arrival_rate"] for r in rows if _stable(r)]
        if not stable:
            break
        above = [r["arrival_rate"] for r in rows if not _stable(r) and r["arrival_rate"] > max(stable)]
        if not above:
            break
        rows.append(measure((max(stable) + min(above)) / 2))
    rows += [measure(rate) for rate in fill_rates(rows, settings.fill_points)]
    return sorted(rows, key=lambda r: r["arrival_rate"])


def fill_rates(rows: Sequence[dict], points: Sequence[float]) -> list[float]:
    """The rates `points` x the capacity (the largest stable rate of `rows`) that no row lies within
    FILL_TOLERANCE x the capacity of: the rows the steep part of the curve still lacks."""
    stable = [r["arrival_rate"] for r in rows if _stable(r)]
    if not stable:
        return []
    capacity, rates = max(stable), [r["arrival_rate"] for r in rows]
    return [point * capacity for point in points
            if all(abs(rate - point * capacity) > FILL_TOLERANCE * capacity for rate in rates)]


def requests_per_point(source: RequestSource, engine: Engine, settings: SynthesisSettings) -> int:
    """The settings' count if given; else DEFAULT_REQUESTS_PER_POINT, raised for prefill-only
    calls (encoders, scoring calls of one output token), which finish `budget / prompt` at a
    time, to `min_lump_iterations` iterations' worth: with e5-base-v2's 32-token queries one
    iteration finishes 64 of them, and 400 requests left the stability count (completions over
    arrivals in a 300-request window) to where the last lump fell (capacities 0.84-1.08 x apart
    at neighbouring rates)."""
    if settings.requests_per_point is not None:
        return settings.requests_per_point
    if source.mean_completion_tokens > 1:
        return DEFAULT_REQUESTS_PER_POINT
    budget = engine.settings.max_num_batched_tokens
    per_iteration = max(budget // max(int(source.mean_prompt_tokens), 1), 1)
    return max(DEFAULT_REQUESTS_PER_POINT, settings.min_lump_iterations * per_iteration)


def synthesize(
    model: ModelCard,
    gpu: GpuCard,
    tps: Sequence[int],
    fractions: Sequence[float],
    source: RequestSource,
    settings: SynthesisSettings = SynthesisSettings(),
    gpu_type: str | None = None,
    min_kv_gib: float = 0.0,
    progress: Callable[[str], None] | None = None,
    timer_for: Callable[[int], IterationTimer | None] | None = None,
) -> tuple[pd.DataFrame, list[Skipped]]:
    """Profile rows for every (tp, fraction) that fits, labelled `gpu_type` (default gpu.name).
    `timer_for(tp)` gives another engine model's iteration times (None: the roofline)."""
    label = gpu_type or gpu.name
    check_context(source, model)
    rows, skipped = [], []
    for tp in tps:
        timer = timer_for(tp) if timer_for else None
        for fraction in fractions:
            engine = Engine(model, gpu, tp, fraction, settings.engine, timer=timer)
            if not model.encoder and engine.kv_capacity_gib < max(min_kv_gib, 1e-9):
                kv = engine.kv_capacity_gib
                reason = (f"the weights do not fit (KV cache would be {kv:.2f} GiB)" if kv <= 0
                          else f"KV cache {kv:.2f} GiB < the minimum of {min_kv_gib:g} GiB")
                skipped.append(Skipped(tp, fraction, reason))
                if progress:
                    progress(f"skip tp={tp} fraction={fraction:g}")
                continue
            for row in synthesize_curve(engine, source, settings):
                rows.append({"gpu_type": label, "tp": tp, "fraction": fraction, **row})
            if progress:
                progress(f"tp={tp} fraction={fraction:g}")
    frame = pd.DataFrame(rows, columns=list(PROFILE_COLUMNS))
    return frame, skipped


def stable_capacity_rps(rows: pd.DataFrame) -> float:
    """Largest stable arrival rate of a frame of rows (for reports)."""
    stable = rows[rows["throughput"] >= STABLE_THROUGHPUT_RATIO * rows["arrival_rate"]]
    return float(stable["arrival_rate"].max()) if len(stable) else 0.0
