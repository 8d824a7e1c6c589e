"""Recovery after a burst: does a plan return to its steady state once a burst has passed?

A burst run offers each workflow Poisson arrivals at `base_load` x a rate, `height` x that rate
for `length_s` from `start_s`, then `base_load` x it again; the same seeds without the burst give
the reference. Agentic workflows can fail to return: a workflow's next call joins the engine's
waiting queue behind the calls of newer workflows, and by its turn they have evicted its prefix
from the KV cache, so every call pays its whole prefill, the LLM serves fewer calls than arrive and
the queue never drains (a metastable state). Serving older workflow requests first (the engines'
priority scheduling with the workflow's start as each call's priority, models/performance/replica.py)
keeps the working set of prefixes to the workflows in service.

    served_rps        requests completed in the measured window / its length
    latency_mean_s    mean latency of the requests that arrived in the window and completed
    recovered         served_rps >= SERVED_SHARE x the reference's, and latency_mean_s within
                      LATENCY_SHARE of the reference's, in the window that opens `settle_s` after
                      the burst's end and holds `window_s`
    recovery_s        from the burst's end to the start of the first minute from which the requests
                      arriving in every later minute of the run completed with a mean latency within
                      LATENCY_SHARE of the reference's (None: it never returned)

The burst (`Burst`, STANDARD_BURST) and the recovery limit a plan prints are
models/performance/recovery.py's; this study checks them in the simulator.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Mapping

from scepsy.models.instance.allocation import Allocation
from scepsy.models.instance.instance import Instance
from scepsy.models.performance.alp import Prediction
from scepsy.models.performance.recovery import STANDARD_BURST, Burst
from scepsy.models.simulation.simulator import SimulationSettings, simulate

SERVED_SHARE = 0.97  # of the reference run's completions in the window
LATENCY_SHARE = 0.25  # relative excess of the mean latency over the reference run's
MINUTE_S = 60.0




def plan_burst(prediction: Prediction, burst: Burst = STANDARD_BURST) -> Burst:
    """`burst` from the recovery limit a plan prints: every workflow at the same share of its
    `max_throughput_rps` before and after it, the smallest `recovery_limit_rps` share over them."""
    base = min(w.recovery_limit_rps / w.max_throughput_rps for w in prediction.workflows)
    return replace(burst, base_load=base)


def burst_arrivals(rate_rps: float, burst: Burst, seed: int, workflow: str, with_burst: bool = True) -> list[float]:
    """Poisson arrival times of one workflow over the burst run (the base rate outside the burst,
    `height` x the rate inside it); the draw of the base load is the same with and without it."""
    base_rng = random.Random(f"{seed}/burst-base/{workflow}")
    extra_rng = random.Random(f"{seed}/burst-extra/{workflow}")
    times = _poisson(base_rng, burst.base_load * rate_rps, 0.0, burst.duration_s)
    if with_burst and burst.height > burst.base_load:
        times += _poisson(extra_rng, (burst.height - burst.base_load) * rate_rps, burst.start_s, burst.end_s)
    return sorted(times)


def _poisson(rng: random.Random, rate_rps: float, start_s: float, end_s: float) -> list[float]:
    times: list[float] = []
    now = start_s
    if rate_rps <= 0:
        return times
    while True:
        now += rng.expovariate(rate_rps)
        if now >= end_s:
            return times
        times.append(now)


@dataclass(frozen=True)
class WorkflowRecovery:
    workflow: str
    rate_rps: float  # the rate the shares are of
    served_rps: float
    reference_served_rps: float
    latency_mean_s: float
    reference_latency_mean_s: float
    recovery_s: float | None
    # with an untagged share: the mean latency, in the measured window, of the requests whose calls
    # carried their workflow id and of those the entry stamped call by call (None: no such request)
    tagged_latency_mean_s: float | None = None
    untagged_latency_mean_s: float | None = None

    @property
    def served_share(self) -> float:
        return self.served_rps / self.reference_served_rps if self.reference_served_rps > 0 else math.nan

    @property
    def latency_excess(self) -> float:
        return self.latency_mean_s / self.reference_latency_mean_s - 1 if self.reference_latency_mean_s > 0 else math.nan

    @property
    def recovered(self) -> bool:
        return self.served_share >= SERVED_SHARE and self.latency_excess <= LATENCY_SHARE


@dataclass
class _Finishes:
    """Each workflow's completed requests as (arrival_s, finish_s), and the untagged ones apart."""

    done: dict[str, list[tuple[float, float]]]
    untagged: dict[str, list[tuple[float, float]]]

    def add(self, workflow: str, arrival_s: float, finish_s: float, tagged: bool) -> None:
        self.done.setdefault(workflow, []).append((arrival_s, finish_s))
        if not tagged:
            self.untagged.setdefault(workflow, []).append((arrival_s, finish_s))

    def window_latencies_s(self, workflow: str, burst: Burst) -> tuple[float | None, float | None]:
        """(tagged, untagged) mean latency of the requests arriving in the measured window."""
        start_s, end_s = burst.end_s + burst.settle_s, burst.duration_s

        def mean(pairs: list[tuple[float, float]]) -> float | None:
            inside = [finish - arrival for arrival, finish in pairs if start_s <= arrival < end_s]
            return sum(inside) / len(inside) if inside else None

        untagged = set(self.untagged.get(workflow, []))
        return mean([p for p in self.done.get(workflow, []) if p not in untagged]), mean(list(untagged))


def _run(instance: Instance, allocation: Allocation, rates_rps: Mapping[str, float], burst: Burst, seed: int,
         scheduling: str, with_burst: bool, entry_limits: Mapping[str, int] | None,
         untagged_share: float, preemption_threshold: float | None) -> tuple[dict, _Finishes]:
    arrivals = {w: burst_arrivals(rate, burst, seed, w, with_burst) for w, rate in rates_rps.items()}
    settings = SimulationSettings(duration_s=burst.duration_s, warmup_s=burst.end_s + burst.settle_s,
                                  seed=seed, scheduling=scheduling, entry_limits=entry_limits, untagged_share=untagged_share,
                                  preemption_threshold=preemption_threshold)
    finishes = _Finishes({}, {})
    result = simulate(instance, allocation, settings, arrivals=arrivals, on_finish=finishes.add)
    return {w.name: w for w in result.workflows}, finishes


def _minute_latencies(finishes: list[tuple[float, float]], arrivals: list[float], start_s: float,
                      end_s: float) -> list[float]:
    """Mean latency of the requests arriving in each minute of [start_s, end_s); inf for a minute
    some of whose requests never finished."""
    minutes = int((end_s - start_s) // MINUTE_S)
    sums, counts = [0.0] * minutes, [0] * minutes
    for arrival, finish in finishes:
        k = int((arrival - start_s) // MINUTE_S)
        if 0 <= k < minutes:
            sums[k] += finish - arrival
            counts[k] += 1
    offered = [0] * minutes
    for arrival in arrivals:
        k = int((arrival - start_s) // MINUTE_S)
        if 0 <= k < minutes:
            offered[k] += 1
    return [math.inf if counts[k] < offered[k] else sums[k] / counts[k] if counts[k] else 0.0 for k in range(minutes)]


def recovery(instance: Instance, allocation: Allocation, rates_rps: Mapping[str, float], burst: Burst = STANDARD_BURST,
             seed: int = 0, scheduling: str | None = None,
             entry_limits: Mapping[str, int] | None = None, untagged_share: float = 0.0,
             preemption_threshold: float | None = None) -> list[WorkflowRecovery]:
    """Run the burst and its reference on `allocation` (`rates_rps`: the rate per workflow the
    burst's shares are of; `scheduling`: the engines' policy, the simulator's default if None;
    `untagged_share`: of the workflow requests, those whose calls carry no workflow id;
    `preemption_threshold`: SGLang engines' priority preemption, None for vLLM's scheduler)."""
    policy = SimulationSettings().scheduling if scheduling is None else scheduling
    options = (entry_limits, untagged_share, preemption_threshold)
    burst_stats, burst_done = _run(instance, allocation, rates_rps, burst, seed, policy, True, *options)
    calm_stats, _ = _run(instance, allocation, rates_rps, burst, seed, policy, False, *options)
    rows = []
    for workflow, rate in rates_rps.items():
        arrivals = burst_arrivals(rate, burst, seed, workflow)
        reference = calm_stats[workflow].latency_mean_s
        # minutes measured up to the window's end: a request arriving later has no time to finish
        minutes = _minute_latencies(burst_done.done.get(workflow, []), arrivals, burst.end_s,
                                    burst.duration_s - MINUTE_S)
        late = [k for k, latency in enumerate(minutes) if not latency <= (1 + LATENCY_SHARE) * reference]
        first_good = (late[-1] + 1) if late else 0
        recovery_s = first_good * MINUTE_S if first_good < len(minutes) else None
        rows.append(WorkflowRecovery(workflow, rate, burst_stats[workflow].throughput_rps,
                                     calm_stats[workflow].throughput_rps, burst_stats[workflow].latency_mean_s,
                                     reference, recovery_s, *burst_done.window_latencies_s(workflow, burst)))
    return rows

