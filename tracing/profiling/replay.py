"""The replay profiler: one LLM's traced calls, replayed against an engine at a sweep of arrival rates.

What is replayed. Every completed call of the LLM that has a recorded request body, grouped by
workflow request (calls without a workflow id are requests of one call). Within a request, call c
*depends on* every call d of the same LLM that had ended before c started in the trace. The replay
keeps those dependencies and the recorded gaps: c starts at

    start'_c = max_d (end'_d + (start_c - end_d))      over its dependencies d, or
    start'_c = A_r + (start_c - t0_r)                   when it has none,

where primes are replay times, A_r is the request's replay arrival and t0_r the request's first
recorded call (of any LLM). A gap (start_c - end_d) is the time the workflow spent elsewhere (other
LLMs, tools) and is kept as it was traced; fan-outs are replayed concurrently as traced.

Load. At a target LLM arrival rate lambda (calls/s), workflow requests arrive as a Poisson process
(seeded; or uniformly spaced, `arrivals="uniform"`) of rate lambda / n, n = mean calls per replayed request; requests are drawn in a seeded
shuffled cycle; each point runs max(min_requests, ceil(lambda / n * duration_s)) requests. With the
last arrival at a_last, the point's offered rate is

    arrival_rate = N_calls / (a_last + n / lambda)                           calls/s (the realised rate)
    throughput   = N_ok / max(a_last + n / lambda, max_r (end_r - tail_r) + n / lambda)

where end_r is request r's last response (from the first arrival) and tail_r the time the same
traced request took from arrival to last response at the lightest rate (its mean there; requests the
lightest point did not run take that point's mean): a request needs that long even on an idle
engine, so only the delay beyond it counts against throughput. A long request arriving last
therefore does not look like lost throughput, while a backlog still does. Latency is per call (send
to last byte): mean, p50, p90, p99 of the completed calls.

Sweep. `rates="auto"` first probes the idle engine's service time S (`probe_service_time`: a dozen
calls one at a time), starts at 0.2 / S, doubles the rate until saturation (or, where that start
is already saturated, halves it until a point is stable), then bisects twice between the highest
stable and the lowest saturated rate (a batching engine takes many times 1 / S, which the doubling
finds). A point is saturated when
throughput < 0.95 * arrival_rate or its mean latency exceeds ten times the lightest point's; an
explicit rate list stops at the first saturated point too. Each row of the result is one point in
the core profile format (models/instance/profile.py), labelled with the given gpu_type, tp and fraction.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import httpx
import numpy as np
import pandas as pd

from scepsy.models.arguments import check_choice, check_finite
from scepsy.models.errors import InputError
from scepsy.models.instance.profile import PROFILE_COLUMNS, STABLE_THROUGHPUT_RATIO

from scepsy.tracing.capture.records import CallRecord

LATENCY_BLOWUP = 10.0
AUTO_LIGHT_UTILIZATION = 0.2
MAX_AUTO_POINTS = 14


@dataclass(frozen=True)
class ReplayCall:
    path: str
    body: bytes
    stream: bool
    rel_start_s: float  # recorded start - t0_r
    rel_end_s: float
    deps: tuple[int, ...]  # indices of earlier calls (of this LLM, same request) that had ended


@dataclass(frozen=True)
class ReplayRequest:
    key: str
    calls: tuple[ReplayCall, ...]


@dataclass(frozen=True)
class PointResult:
    target_rate_rps: float
    arrival_rate_rps: float
    throughput_rps: float
    calls: int
    completed: int
    failed: int
    latency_s: dict  # mean, p50, p90, p99
    tail_s: float  # mean arrival-to-last-response per request
    tails_s: dict = field(default_factory=dict)  # request key -> mean arrival-to-last-response
    saturated: bool = False
    first_error: str | None = None


def replay_requests(calls: Iterable[CallRecord], llm: str, model: str | None = None) -> list[ReplayRequest]:
    """The LLM's replayable calls grouped by workflow request, with their dependencies."""
    calls = [c for c in calls if c.outcome == "ok" and 200 <= c.status < 300]
    groups: dict[tuple, list[CallRecord]] = defaultdict(list)
    for call in calls:
        key = (call.workflow or "", call.workflow_id) if call.workflow_id else ("", f"call:{call.call_id}")
        groups[key].append(call)
    requests = []
    missing_bodies = 0
    for key in sorted(groups):
        group = groups[key]
        t0 = min(c.start_s for c in group)
        mine = sorted((c for c in group if c.llm == llm), key=lambda c: (c.start_s, c.call_id))
        replayable: list[tuple[CallRecord, bytes]] = []
        for call in mine:
            if not call.request_body:
                missing_bodies += 1
                continue
            replayable.append((call, call.request_body))
        if not replayable:
            continue
        items = []
        for i, (call, body) in enumerate(replayable):
            deps = tuple(j for j, (other, _) in enumerate(replayable[:i]) if other.end_s <= call.start_s)
            if model is not None:
                body = _with_model(body, model)
            items.append(ReplayCall(call.path, body, call.stream, call.start_s - t0, call.end_s - t0, deps))
        requests.append(ReplayRequest(f"{key[0]}/{key[1]}", tuple(items)))
    if not requests:
        known = sorted({c.llm for c in calls})
        if missing_bodies:
            raise InputError(None, "traces", f"the {missing_bodies} traced calls of llm {llm!r} have no request bodies",
                             "record the calls with their bodies (`scepsy proxy --no-bodies` leaves them out) so that they can be replayed")
        raise InputError(None, "llm", f"no completed calls of llm {llm!r} in the traces", f"use one of: {', '.join(known) or '(none)'}")
    return requests


def _with_model(body: bytes, model: str) -> bytes:
    try:
        payload = json.loads(body)
    except ValueError:
        return body
    if isinstance(payload, dict):
        payload["model"] = model
        return json.dumps(payload).encode()
    return body


def mean_calls_per_request(requests: Sequence[ReplayRequest]) -> float:
    return float(np.mean([len(r.calls) for r in requests]))


class _Replayer:
    def __init__(self, endpoint: str, client: httpx.AsyncClient, on_call: Callable[[], None] | None):
        self.endpoint = endpoint.rstrip("/")
        if self.endpoint.endswith("/v1"):
            self.endpoint = self.endpoint[:-3]
        self.client = client
        self.on_call = on_call
        self.latencies: list[float] = []
        self.failed = 0
        self.first_error: str | None = None
        self.last_end = 0.0
        self.request_tails: list[float] = []
        self.finished: list[tuple[str, float, float]] = []  # (request key, arrival, last end)

    async def _send(self, call: ReplayCall) -> bool:
        headers = {"content-type": "application/json"}
        url = self.endpoint + call.path
        try:
            if call.stream:
                async with self.client.stream("POST", url, content=call.body, headers=headers) as response:
                    async for _ in response.aiter_raw():
                        pass
                    status = response.status_code
                    text = "" if status < 300 else (await response.aread()).decode(errors="replace")
            else:
                response = await self.client.post(url, content=call.body, headers=headers)
                status, text = response.status_code, response.text
        except httpx.HTTPError as exc:
            status, text = 0, f"{type(exc).__name__}: {exc}"
        if 200 <= status < 300:
            return True
        if self.first_error is None:
            self.first_error = f"HTTP {status}: {text[:200]}"
        return False

    async def request(self, request: ReplayRequest, arrival: float, loop: asyncio.AbstractEventLoop) -> None:
        ends: dict[int, float] = {}  # replay end - recorded end, per finished call
        done = {i: asyncio.Event() for i in range(len(request.calls))}

        async def one(i: int, call: ReplayCall) -> None:
            for d in call.deps:
                await done[d].wait()
            shift = max(ends[d] for d in call.deps) if call.deps else arrival
            delay = call.rel_start_s + shift - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            started = loop.time()
            ok = await self._send(call)
            finished = loop.time()
            ends[i] = finished - call.rel_end_s
            if ok:
                self.latencies.append(finished - started)
            else:
                self.failed += 1
            self.last_end = max(self.last_end, finished)
            done[i].set()
            if self.on_call is not None:
                self.on_call()

        await asyncio.gather(*(one(i, c) for i, c in enumerate(request.calls)))
        last_end = self.last_end_of(request, ends)
        self.request_tails.append(last_end - arrival)
        self.finished.append((request.key, arrival, last_end))

    @staticmethod
    def last_end_of(request: ReplayRequest, ends: dict[int, float]) -> float:
        return max(ends[i] + c.rel_end_s for i, c in enumerate(request.calls))


async def _run_point(
    requests: Sequence[ReplayRequest],
    endpoint: str,
    rate_rps: float,
    duration_s: float,
    min_requests: int,
    seed: int,
    light_tails: dict | None,
    timeout_s: float,
    on_call: Callable[[], None] | None,
    process: str = "poisson",
) -> PointResult:
    rng = random.Random(seed)
    n_mean = mean_calls_per_request(requests)
    workflow_rate = rate_rps / n_mean
    count = max(min_requests, math.ceil(workflow_rate * duration_s))
    order: list[ReplayRequest] = []
    while len(order) < count:
        cycle = list(requests)
        rng.shuffle(cycle)
        order += cycle
    order = order[:count]
    arrivals = arrival_times(count, workflow_rate, process, rng)
    total_calls = sum(len(r.calls) for r in order)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), limits=limits) as client:
        replayer = _Replayer(endpoint, client, on_call)
        loop = asyncio.get_running_loop()
        t0 = loop.time() + 0.05
        await asyncio.gather(*(replayer.request(r, t0 + a, loop) for r, a in zip(order, arrivals)))
    nominal_s = arrivals[-1] + 1.0 / workflow_rate
    tails_s = _mean_tails(replayer.finished)
    completed = len(replayer.latencies)
    finished = [(key, arrival - t0, end - t0) for key, arrival, end in replayer.finished]
    throughput = replay_throughput(completed, nominal_s, workflow_rate, finished, light_tails or tails_s)
    lat = np.asarray(replayer.latencies, dtype=float)
    latency = (
        {"mean": float(lat.mean()), "p50": float(np.percentile(lat, 50)), "p90": float(np.percentile(lat, 90)),
         "p99": float(np.percentile(lat, 99))}
        if completed
        else {"mean": math.inf, "p50": math.inf, "p90": math.inf, "p99": math.inf}
    )
    return PointResult(
        target_rate_rps=rate_rps,
        arrival_rate_rps=total_calls / nominal_s,
        throughput_rps=throughput,
        calls=total_calls,
        completed=completed,
        failed=replayer.failed,
        latency_s=latency,
        tail_s=float(np.mean(replayer.request_tails)) if replayer.request_tails else 0.0,
        tails_s=tails_s,
        first_error=replayer.first_error,
    )


def replay_throughput(
    completed: int, nominal_s: float, workflow_rate: float, finished: list[tuple[str, float, float]], light_tails: dict
) -> float:
    """N_ok / max(a_last + n/lambda, max_r (end_r - tail_r) + n/lambda) (module docstring); `finished`
    holds (request key, arrival, last end) in seconds from the first arrival."""
    fallback = float(np.mean(list(light_tails.values()))) if light_tails else 0.0
    backlog_end = max((end - light_tails.get(key, fallback) for key, _, end in finished), default=0.0)
    return completed / max(nominal_s, backlog_end + 1.0 / workflow_rate)


def _mean_tails(finished: list[tuple[str, float, float]]) -> dict[str, float]:
    """Mean arrival-to-last-response per traced request key."""
    by_key: dict[str, list[float]] = defaultdict(list)
    for key, arrival, end in finished:
        by_key[key].append(end - arrival)
    return {key: float(np.mean(values)) for key, values in sorted(by_key.items())}


ARRIVAL_PROCESSES = ("poisson", "uniform")


def arrival_times(count: int, rate: float, process: str, rng: random.Random) -> list[float]:
    """`count` arrival times from 0 at `rate`/s: Poisson (exponential gaps) or uniform (1 / rate apart)."""
    check_choice(process, ARRIVAL_PROCESSES, "arrivals", "arrival process")
    times = [0.0]
    for _ in range(count - 1):
        times.append(times[-1] + (rng.expovariate(rate) if process == "poisson" else 1.0 / rate))
    return times


def _saturated(point: PointResult, light_latency_s: float | None) -> bool:
    if point.completed == 0 or point.throughput_rps < STABLE_THROUGHPUT_RATIO * point.arrival_rate_rps:
        return True
    return light_latency_s is not None and point.latency_s["mean"] > LATENCY_BLOWUP * light_latency_s


@dataclass(frozen=True)
class SweepSettings:
    rates_rps: tuple[float, ...] | None = None  # None: auto
    duration_s: float = 60.0
    min_requests: int = 5
    seed: int = 0
    timeout_s: float = 600.0
    model: str | None = None
    arrivals: str = "poisson"  # or "uniform": workflow requests exactly 1 / rate apart

    def __post_init__(self) -> None:
        check_choice(self.arrivals, ARRIVAL_PROCESSES, "arrivals", "arrival process")
        for value, field_name in ((self.duration_s, "duration_s"), (self.timeout_s, "timeout_s")):
            check_finite(value, field_name)


async def probe_service_time(requests: Sequence[ReplayRequest], endpoint: str, calls: int = 12, timeout_s: float = 600.0) -> float:
    """Mean latency of `calls` replayed calls sent one at a time, s: one call's service time on an
    idle engine. Calls are taken round robin across requests (request 0's first call, request 1's
    first call, ...), so consecutive calls share no more prompt prefix than unrelated requests do."""
    order: list[ReplayCall] = []
    depth = 0
    while len(order) < calls and depth < max(len(r.calls) for r in requests):
        order += [r.calls[depth] for r in requests if depth < len(r.calls)]
        depth += 1
    order = order[:calls]
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0)) as client:
        replayer = _Replayer(endpoint, client, None)
        loop = asyncio.get_running_loop()
        for call in order:
            started = loop.time()
            if not await replayer._send(call):
                raise InputError(None, "endpoint", f"the endpoint rejected a replayed call ({replayer.first_error})",
                                 "check the endpoint URL and that it serves this LLM's requests")
            replayer.latencies.append(loop.time() - started)
    return float(np.mean(replayer.latencies))


def auto_start_rate(service_time_s: float) -> float:
    """Light load for the auto sweep: 20% of what an engine serving one call at a time could take."""
    return AUTO_LIGHT_UTILIZATION / service_time_s


class Sweep:
    """Runs the rate sweep point by point; `points` grows as it goes (the CLI shows progress)."""

    def __init__(self, requests: Sequence[ReplayRequest], endpoint: str, settings: SweepSettings, start_rate_rps: float):
        self.requests = list(requests)
        self.endpoint = endpoint
        self.settings = settings
        self.start_rate_rps = start_rate_rps
        self.points: list[PointResult] = []

    def expected_calls(self, rate_rps: float) -> int:
        n_mean = mean_calls_per_request(self.requests)
        count = max(self.settings.min_requests, math.ceil(rate_rps / n_mean * self.settings.duration_s))
        return int(round(count * n_mean))

    async def _point(self, rate: float, on_call) -> PointResult:
        # the reference: the lightest stable point so far (none while every point is saturated)
        light = min((p for p in self.points if not p.saturated), key=lambda p: p.target_rate_rps, default=None)
        point = await _run_point(
            self.requests, self.endpoint, rate, self.settings.duration_s, self.settings.min_requests,
            self.settings.seed + len(self.points), light.tails_s if light else None, self.settings.timeout_s, on_call,
            self.settings.arrivals,
        )
        if point.completed == 0:
            raise InputError(None, "endpoint", f"the endpoint completed no call at {rate:g} calls/s ({point.first_error})",
                             "check the endpoint URL and that it serves this LLM's requests")
        light_latency = light.latency_s["mean"] if light else None
        point = PointResult(**{**point.__dict__, "saturated": _saturated(point, light_latency)})
        self.points.append(point)
        return point

    def next_rates(self) -> Iterable[float]:
        if self.settings.rates_rps is not None:
            yield from sorted(self.settings.rates_rps)
            return
        rate = self.start_rate_rps
        # down from a start the engine cannot take (the probe met a slow moment) to a stable rate
        while len(self.points) < MAX_AUTO_POINTS:
            yield rate
            if not self.points[-1].saturated:
                break
            rate /= 2
        if len(self.points) == 1:  # the start was stable: up to saturation
            while len(self.points) < MAX_AUTO_POINTS:
                rate *= 2
                yield rate
                if self.points[-1].saturated:
                    break
        stable = [p.target_rate_rps for p in self.points if not p.saturated]
        saturated = [p.target_rate_rps for p in self.points if p.saturated]
        if not stable or not saturated:
            return
        low, high = max(stable), min(saturated)
        for _ in range(2):
            if len(self.points) >= MAX_AUTO_POINTS:
                return
            middle = (low + high) / 2
            yield middle
            if self.points[-1].saturated:
                high = middle
            else:
                low = middle

    async def run(self, on_point_start: Callable[[float, int], None] | None = None, on_call: Callable[[], None] | None = None) -> list[PointResult]:
        for rate in self.next_rates():
            if on_point_start is not None:
                on_point_start(rate, self.expected_calls(rate))
            point = await self._point(rate, on_call)
            if point.saturated and self.settings.rates_rps is not None:
                break
        return self.points


def replay_sweep(calls: Iterable[CallRecord], llm: str, endpoint: str, settings: SweepSettings,
                 on_point: Callable[[float, int], None] | None = None,
                 on_call: Callable[[], None] | None = None) -> list[PointResult]:
    """Replay `llm`'s traced calls against the engine at `endpoint` at the sweep's rates: the given
    `settings.rates_rps`, or auto (light load found by a probe of the service time, doubling to
    saturation, then bisecting); `on_point(rate, expected calls)` and `on_call()` report progress."""
    requests = replay_requests(calls, llm, settings.model)
    start_rate = 1.0
    if settings.rates_rps is None:
        start_rate = auto_start_rate(asyncio.run(probe_service_time(requests, endpoint, timeout_s=settings.timeout_s)))
    return asyncio.run(Sweep(requests, endpoint, settings, start_rate).run(on_point, on_call))


def profile_rows(points: Sequence[PointResult], gpu_type: str, tp: int, fraction: float) -> pd.DataFrame:
    """The sweep's points as profile rows (core CSV format)."""
    rows = [
        {
            "gpu_type": gpu_type,
            "tp": tp,
            "fraction": fraction,
            "arrival_rate": p.arrival_rate_rps,
            "throughput": p.throughput_rps,
            "latency_mean": p.latency_s["mean"],
            "latency_p50": p.latency_s["p50"],
            "latency_p90": p.latency_s["p90"],
            "latency_p99": p.latency_s["p99"],
        }
        for p in points
        if p.completed
    ]
    return pd.DataFrame(rows, columns=list(PROFILE_COLUMNS))


def merge_profile_rows(existing: pd.DataFrame | None, new: pd.DataFrame) -> pd.DataFrame:
    """Rows of `existing` for other (gpu_type, tp, fraction) configurations, plus `new`."""
    if existing is None or existing.empty:
        return new
    keys = set(zip(new["gpu_type"], new["tp"], new["fraction"].round(6)))
    keep = existing[[(g, t, round(f, 6)) not in keys for g, t, f in zip(existing["gpu_type"], existing["tp"], existing["fraction"])]]
    return pd.concat([keep, new], ignore_index=True)
