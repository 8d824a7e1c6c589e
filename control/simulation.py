"""The closed loop on the workflow simulator: the controller (or a baseline) drives the replicas
of a simulated deployment while requests arrive from a file.

Systems (`SYSTEMS`), all on the same arrivals, seed and cluster; scepsy-control, static,
saturation and oracle start from the same plan, the controller's plan for the first 5 minutes'
mean rate plus headroom (`opening_plan`; `run_systems(opening=False)` starts from the given one):

    scepsy-control  the policy (control/policy.py `decide`) every `period_s`, observing each
                    workflow's arrival rate at the entry over the live loop's rate window (the
                    entry's request counter over Prometheus' 60 s, or the period where
                    longer), the requests waiting per LLM (engines' queues: the backlog), KV
                    usage, ready and starting replicas
    static          the plan it starts from, never changed
    static-peak     the plan for the trace's peak 5-minute rate per workflow (the controller's
                    planner at that rate, with the same headroom), never changed
    k8s-hpa         the Kubernetes HPA per LLM (models/simulation/autoscaler.py), from one whole-GPU
                    replica per LLM, with the same start-up time
    saturation      a WVA-style rule per LLM on the given plan's shapes: one more replica when the
                    LLM's mean KV-cache usage reaches 0.8 or its mean queue 5 waiting requests per
                    replica, one fewer when both stayed below half of that (and the queue empty)
                    over the stabilization window; +-1 replica per period, none while a replica of
                    the LLM starts; every change placed with the fewest moves
    oracle          the policy fed the true workflow rates: the highest 1-minute rate of the
                    arrivals over the next start-up time + period (constant predictor, no
                    stabilization window, median, burst margin or flap guard)
    reactive        the oracle fed the true rate of the minute just past instead: what a
                    controller that knows the past exactly and nothing of the future does (the
                    reference for what learning the load from its arrivals allows)

Actuation (plan-driven systems): the fleet runs on the cluster's GPUs, share units per GPU as the
placement puts them. A replica asked for at t takes its GPUs as soon as they are free and serves
startup_s later (it joins its LLM's router only then: starting replicas are no capacity); until
its GPUs are free it waits and holds nothing. A stopped replica leaves the router and drains
(finishes what it holds), and its GPUs are free once it has. Make before break where the
cluster has room: a replica to stop drains only while its LLM keeps another replica serving.
Where it has none (a swap on a full cluster), the swap is staged in this order: (1) every
successor whose GPUs are free starts; (2) a replica to stop drains once its LLM keeps another
serving; (3) a replica to stop whose GPUs a waiting successor needs drains even as its LLM's last
serving one, unless a new replica of its LLM will serve without its GPUs (one starting, or one
waiting for GPUs a draining replica frees: a rolling swap, one replica of an LLM at a time),
and where none will, its LLM's calls wait at the router until the successor serves; (4) each
release of GPUs repeats these steps. No moment holds more
GPUs, or more share units on a GPU, than the cluster has.

Measured per system (control/report.py writes them): gpu_hours (replicas' GPUs, fractional
shares as fractions, from taking the GPUs until drained: starting and draining included),
replicas_moved and its lower bound, flaps, decision_p99_s, and per workflow slo_miss_minutes
(1-minute windows of arrivals whose latency metric exceeds latency_slo_s; a request unfinished at
the end counts as infinitely late), requests_unfinished, latency_mean_s, latency_p99_s.
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Generator, Mapping, Sequence, TypeVar

import numpy as np
import simpy

from scepsy.control.prometheus import RATE_WINDOW_S
from scepsy.control.policy import ControlSettings, ControllerState, Decision, Observation, PolicyContext, decide, make_context
from scepsy.control.replan import moves, moves_lower_bound, replica_key
from scepsy.models.errors import InputError
from scepsy.models.instance.allocation import Allocation, LlmAllocation, Placement, ReplicaPlacement, Shard
from scepsy.models.instance.instance import Instance
from scepsy.models.performance.replica import ReplicaSim
from scepsy.models.simulation.arrivals import load_arrivals
from scepsy.models.simulation.autoscaler import Autoscaler, HpaSettings
from scepsy.models.simulation.simulator import SimCluster, SimulationResult, SimulationSettings, replica_engine, simulate
from scepsy.planner.studies.baselines import hpa_deployment

SYSTEMS = ("scepsy-control", "static", "static-peak", "k8s-hpa", "saturation", "oracle", "reactive")
BASELINES = ("static", "static-peak", "k8s-hpa", "saturation", "oracle")  # what --simulate runs beside the controller by default
WINDOW_S = 60.0  # the SLO windows: 1 minute
PEAK_WINDOW_S = 300.0  # static-peak plans for the peak 5-minute rate
OPENING_S = 300.0  # every system starts from the plan for the first 5 minutes' rate
FLAP_WINDOW_S = 600.0  # a direction reversal within 10 minutes is a flap
SAMPLE_S = 5.0  # KV usage and queues are sampled this often (a Prometheus scrape interval)
_T = TypeVar("_T")


@dataclass(frozen=True)
class ClosedLoopSettings:
    """How the closed loop runs; `control` holds the policy's knobs (period_s, startup_s, ...)."""

    control: ControlSettings = ControlSettings()
    seed: int = 0
    drain_s: float = 600.0  # after the last arrival, how long requests may still finish
    saturation_kv: float = 0.8  # WVA's KV-cache saturation threshold
    saturation_queue: float = 5.0  # WVA's queue threshold, waiting requests per replica
    hpa_target: float = 0.7  # the HPA's GPU-utilisation target (its default here)


@dataclass(frozen=True)
class Sample:
    """One period of a system's timeline."""

    time_s: float
    rate_rps: Mapping[str, float]  # per workflow: arrivals in the period / period
    ready: Mapping[str, int]  # per LLM: replicas serving
    starting: Mapping[str, int]  # per LLM
    gpus: float  # GPUs held (starting, serving and draining replicas)
    latency_s: Mapping[str, float]  # per workflow: mean latency of the requests that arrived in the period
    serving: Mapping[str, int] = field(default_factory=dict)  # per LLM: replicas taking requests (ready, or leaving and not drained)


@dataclass(frozen=True)
class WorkflowOutcome:
    name: str
    slo_s: float
    slo_miss_minutes: int
    requests: int
    requests_unfinished: int
    latency_mean_s: float
    latency_p99_s: float


@dataclass(frozen=True)
class SystemRun:
    """One system's closed-loop run (module docstring)."""

    name: str
    gpu_hours: float
    replicas_moved: int
    replicas_moved_lower_bound: int
    flaps: int
    flaps_max_per_llm: int  # the most flaps of one LLM
    decision_times_s: tuple[float, ...]
    workflows: tuple[WorkflowOutcome, ...]
    timeline: tuple[Sample, ...] = field(repr=False, default=())
    decisions: tuple[Decision, ...] = field(repr=False, default=())

    @property
    def decision_p99_s(self) -> float:
        return float(np.percentile(self.decision_times_s, 99)) if self.decision_times_s else 0.0

    def workflow(self, name: str) -> WorkflowOutcome:
        return next(w for w in self.workflows if w.name == name)


# ---------------------------------------------------------------------------------------------
# Arrivals


def scale_arrivals(times: Sequence[float], factor: float, seed: int = 0, jitter_s: float = 60.0) -> list[float]:
    """A trace at `factor` times its rate with its shape kept: each arrival kept floor(factor)
    times and once more with probability frac(factor), every copy shifted by a uniform jitter in
    [0, jitter_s) (deterministic for a seed). factor < 1 thins the trace."""
    rng = random.Random(f"{seed}/scale")
    out = []
    whole, part = int(math.floor(factor)), factor - math.floor(factor)
    for t in times:
        copies = whole + (1 if rng.random() < part else 0)
        for k in range(copies):
            out.append(t + (rng.random() * jitter_s if k or copies > 1 else 0.0))
    return sorted(out)


SHAPES = {  # load shapes of the bench scenarios: the rate multiplier at minute m, from 1 at the start
    "ramp": lambda m: 1.0 + 2.0 * min(m / 10.0, 1.0),  # x3 over 10 minutes, then held
    "step": lambda m: 2.0 if m >= 5.0 else 1.0,  # x2 at minute 5
    "burst": lambda m: 1.5 if 5.0 <= m < 7.0 else 1.0,  # 1.5x for two minutes from minute 5
    "dip": lambda m: 0.1 if 5.0 <= m < 15.0 else 1.0,  # a fall to 10% for ten minutes, and back
    "constant": lambda m: 1.0,
}


def shaped_arrivals(rates_rps: Mapping[str, float], shape: str, minutes: float, seed: int = 0) -> dict[str, list[float]]:
    """Poisson arrivals per workflow whose rate is `rates_rps` times SHAPES[shape] of the minute
    (thinning of a process at the shape's highest rate; deterministic for a seed)."""
    if shape not in SHAPES:
        raise InputError(None, "shape", f"unknown load shape {shape!r}", f"use one of: {', '.join(SHAPES)}")
    factor = SHAPES[shape]
    top = max(factor(m / 10.0) for m in range(int(minutes * 10) + 1))
    out: dict[str, list[float]] = {}
    for index, (workflow, rate) in enumerate(sorted(rates_rps.items())):
        rng = random.Random(f"{seed}/{index}/{shape}")
        times: list[float] = []
        t = 0.0
        while rate > 0:
            t += rng.expovariate(rate * top)
            if t >= minutes * 60:
                break
            if rng.random() < factor(t / 60.0) / top:
                times.append(t)
        out[workflow] = times
    return out


def trace_arrivals(drivers: Mapping[str, tuple[Path | str, float]], start_s: float, length_s: float,
                   seed: int = 0) -> dict[str, list[float]]:
    """Arrivals per workflow from a driving trace each (a file `load_arrivals` reads: JSONL or an
    Azure-format CSV) cut to [start_s, start_s + length_s) and scaled so that its peak 5-minute
    rate is the given rate (requests/s); times from 0."""
    out = {}
    for index, (workflow, (path, peak_rps)) in enumerate(sorted(drivers.items())):
        times = load_arrivals(path, [workflow]).get(workflow, [])
        cut = [t - start_s for t in times if start_s <= t < start_s + length_s]
        if not cut:
            raise InputError(str(path), None, f"no arrival in [{start_s:g}, {start_s + length_s:g}) s",
                             "pick a window of the trace that has arrivals")
        peak = peak_rates({workflow: cut}, length_s)[workflow]
        scaled = scale_arrivals(cut, peak_rps / peak, seed=seed * 1000 + index)
        out[workflow] = [t for t in scaled if t < length_s]
    return out


def rate_bins(arrivals: Mapping[str, Sequence[float]], duration_s: float, width_s: float) -> dict[str, np.ndarray]:
    """Arrival rate per workflow in consecutive bins of `width_s` (requests/s)."""
    bins = max(int(math.ceil(duration_s / width_s)), 1)
    out = {}
    for workflow, times in arrivals.items():
        counts = np.bincount(np.minimum((np.asarray(times, dtype=float) // width_s).astype(int), bins - 1), minlength=bins)
        out[workflow] = counts / width_s
    return out


def opening_plan(context: PolicyContext, arrivals: Mapping[str, Sequence[float]]) -> tuple[Allocation, Placement]:
    """The plan every system starts from: the controller's planner at each workflow's mean rate
    over the first OPENING_S of the arrivals, with the policy's headroom, placed on the empty
    cluster (InputError where no plan meets the SLOs there)."""
    rates = {w: sum(1 for t in times if t < OPENING_S) / OPENING_S * (1 + context.settings.headroom)
             for w, times in arrivals.items()}
    rates.update({w.name: rates.get(w.name, 0.0) for w in context.instance.workflows})
    allocation = context.replanner.allocation(rates)
    placement = None if allocation is None else context.replanner.place(allocation, None)
    if allocation is None or placement is None:
        raise InputError(None, "arrivals", "no plan meets the SLOs at the first 5 minutes' rate",
                         "scale the arrivals down, or lift the SLOs")
    return allocation, placement


def peak_rates(arrivals: Mapping[str, Sequence[float]], duration_s: float, window_s: float = PEAK_WINDOW_S) -> dict[str, float]:
    """The highest rate per workflow over `window_s` windows (requests/s)."""
    return {w: float(r.max()) if len(r) else 0.0 for w, r in rate_bins(arrivals, duration_s, window_s).items()}


# ---------------------------------------------------------------------------------------------
# Replicas of a plan-driven system


@dataclass
class _Replica:
    llm: str
    key: tuple  # (llm, node, shards): where it runs
    gpus: float
    requested_s: float
    held_s: float | None = None  # when it took its GPUs (None: waiting for them)
    sim: ReplicaSim | None = None  # once serving
    stopped_s: float | None = None  # cancelled before serving, or drained
    stopping: bool = False

    @property
    def units(self) -> dict[tuple[str, int], int]:
        """Share units per (node, GPU) it runs on."""
        _, node, shards = self.key
        return {(node, gpu): units for gpu, units in shards}

    @property
    def holds(self) -> bool:
        return self.held_s is not None and self.stopped_s is None


class _Fleet:
    """The replicas of a plan-driven system on the cluster's GPUs, and the actuation of a target
    plan (module docstring: a replica takes its GPUs only where they are free)."""

    def __init__(self, env: simpy.Environment, instance: Instance, sim: SimulationSettings, startup_s: float,
                 allocation: Allocation, placement: Placement):
        self.env = env
        self.instance = instance
        self.sim = sim
        self.startup_s = startup_s
        self.f = allocation.fractions_per_gpu
        self.cluster: SimCluster | None = None
        self.replicas: list[_Replica] = []
        self.allocation = allocation
        self.initial = placement
        self.changes: list[tuple[float, str, int]] = []  # (time, llm, +1 / -1)
        self.peak_gpus = 0.0  # the most GPUs held at any time

    def attach(self, cluster: SimCluster) -> None:
        """Pair the simulator's first replicas with the placement's, LLM by LLM in order."""
        self.cluster = cluster
        for llm, router in cluster.routers.items():
            placed = sorted((r for r in self.initial.replicas if r.llm == llm), key=lambda r: r.replica)
            for rp, sim in zip(placed, router.replicas):
                self.replicas.append(_Replica(llm, replica_key(rp), self._gpus(rp), 0.0, 0.0, sim))
        self._note_held()

    def _gpus(self, rp: ReplicaPlacement) -> float:
        return sum(s.units for s in rp.shards) / self.f

    def live(self) -> list[_Replica]:
        return [r for r in self.replicas if r.stopped_s is None and not r.stopping]

    def ready(self, llm: str) -> int:
        return sum(1 for r in self.live() if r.llm == llm and r.sim is not None)

    def serving(self, llm: str) -> int:
        """Replicas whose engine takes requests now: ready, or asked to stop and not drained yet."""
        return sum(1 for r in self.replicas if r.llm == llm and r.stopped_s is None and r.sim is not None and r.sim.accepting)

    def starting(self, llm: str) -> int:
        """Replicas asked for and not serving yet: starting, or waiting for their GPUs."""
        return sum(1 for r in self.live() if r.llm == llm and r.sim is None)

    def gpus_held(self) -> float:
        return sum(r.gpus for r in self.replicas if r.holds)

    def _used_units(self) -> dict[tuple[str, int], int]:
        used: dict[tuple[str, int], int] = defaultdict(int)
        for r in self.replicas:
            if r.holds:
                for gpu, units in r.units.items():
                    used[gpu] += units
        return used

    def _fits(self, replica: _Replica, used: Mapping[tuple[str, int], int]) -> bool:
        return all(used.get(gpu, 0) + units <= self.f for gpu, units in replica.units.items())

    def _blocks(self, holder: _Replica, waiting: _Replica) -> bool:
        return bool(set(holder.units) & set(waiting.units))

    def _note_held(self) -> None:
        self.peak_gpus = max(self.peak_gpus, self.gpus_held())

    def apply(self, allocation: Allocation, placement: Placement) -> None:
        """Bring the replicas to `placement` (stops, cancels, starts where GPUs are free)."""
        now = self.env.now
        wanted: dict[tuple, list[ReplicaPlacement]] = defaultdict(list)
        for rp in placement.replicas:
            wanted[replica_key(rp)].append(rp)
        have: dict[tuple, list[_Replica]] = defaultdict(list)
        for r in self.live():
            have[r.key].append(r)
        for key, reps in have.items():
            surplus = len(reps) - len(wanted.get(key, []))
            # serving replicas are kept before starting ones, starting before waiting; the newest go first
            for r in sorted(reps, key=lambda r: (r.sim is not None, r.held_s is not None, -r.requested_s))[:max(surplus, 0)]:
                self._stop(r)
        self.allocation = allocation
        for key, rps in wanted.items():
            for rp in rps[len(have.get(key, [])):]:
                self.replicas.append(_Replica(rp.llm, key, self._gpus(rp), now))
                self.changes.append((now, rp.llm, +1))
        self._progress()

    def _stop(self, replica: _Replica) -> None:
        self.changes.append((self.env.now, replica.llm, -1))
        if replica.sim is None:
            replica.stopped_s = self.env.now  # cancelled before it served: its GPUs are free at once
        else:
            replica.stopping = True  # drains when _progress lets it

    def _progress(self) -> None:
        """The staged swap, in this order: (1) a waiting replica whose GPUs are free takes them and
        starts (make before break); (2) a stopping replica drains once its LLM keeps another
        replica serving; (3) a stopping replica that holds GPUs a waiting replica needs drains
        also as its LLM's last serving replica, unless a new replica of its LLM will serve
        without its GPUs: one starting, or one waiting for GPUs a draining replica frees
        (a rolling swap: one replica of an LLM at a time, the next once its predecessor's
        successor serves). Where none will, break before make: its LLM's calls wait at the
        router until the successor serves. GPUs come free when a drained replica has finished
        its requests; each release runs these steps again."""
        assert self.cluster is not None
        used = self._used_units()
        for replica in self.replicas:
            if replica.held_s is None and replica.stopped_s is None and self._fits(replica, used):
                replica.held_s = self.env.now
                for gpu, units in replica.units.items():
                    used[gpu] = used.get(gpu, 0) + units
                self.env.process(self._start(replica, self.allocation.of(replica.llm)))
        self._note_held()
        waiting = [r for r in self.replicas if r.held_s is None and r.stopped_s is None]
        for replica in self.replicas:
            if not replica.stopping or replica.sim is None or not replica.sim.accepting:
                continue
            router = self.cluster.routers[replica.llm]
            others = [r for r in router.replicas if r is not replica.sim and r.accepting]
            blocking = any(self._blocks(replica, w) for w in waiting)
            if others or (blocking and not self._successor_coming(replica, waiting)):
                router.drain(replica.sim)
                self.env.process(self._retire(replica))

    def _successor_coming(self, replica: _Replica, waiting: list[_Replica]) -> bool:
        """A new replica of `replica`'s LLM will serve without its GPUs: one starting, or one
        waiting for GPUs a draining replica frees (the rolling swap's next step)."""
        draining = [r for r in self.replicas if r.holds and r.stopping and r.sim is not None and not r.sim.accepting]
        for other in self.replicas:
            if other.llm != replica.llm or other.stopped_s is not None or other.stopping or other.sim is not None:
                continue
            if other.holds:
                return True  # starting
            if other in waiting and not self._blocks(replica, other) and any(self._blocks(d, other) for d in draining):
                return True
        return False

    def _start(self, replica: _Replica, choice: LlmAllocation):
        yield self.env.timeout(self.startup_s)
        if replica.stopped_s is not None:
            return
        assert self.cluster is not None
        engine = replica_engine(self.instance, choice.llm, choice.gpu_type, choice.tp, choice.share / self.f,
                                self.sim.engine, self.sim.engine_model, self.sim.backend, self.sim.database_version)
        replica.sim = self.cluster.add_replica(choice.llm, engine)
        self._progress()

    def _retire(self, replica: _Replica):
        assert replica.sim is not None
        while replica.sim.retired_s is None:
            yield self.env.timeout(1.0)
        replica.stopped_s = replica.sim.retired_s
        self._progress()

    def gpu_hours(self, end_s: float) -> float:
        """GPUs times the time held: from taking the GPUs to cancelled or drained."""
        return sum(r.gpus * ((r.stopped_s if r.stopped_s is not None else end_s) - r.held_s)
                   for r in self.replicas if r.held_s is not None) / 3600.0


# ---------------------------------------------------------------------------------------------
# Observation of a simulated deployment


class _Meter:
    """What Prometheus would scrape from the engines: completed calls per LLM (a counter), KV
    usage and waiting requests per ready replica (gauges, averaged over SAMPLE_S samples)."""

    def __init__(self, env: simpy.Environment, cluster: SimCluster):
        self.env = env
        self.cluster = cluster
        self.last_total = {llm: 0 for llm in cluster.routers}
        self.last_latency_sum = {llm: 0.0 for llm in cluster.routers}
        self.kv: dict[str, list[float]] = defaultdict(list)
        self.queue: dict[str, list[float]] = defaultdict(list)
        env.process(self._sample())

    def _sample(self):
        while True:
            yield self.env.timeout(SAMPLE_S)
            for llm, router in self.cluster.routers.items():
                ready = [r for r in router.replicas if r.accepting]
                if not ready:
                    continue
                self.kv[llm].append(sum(r.used / r.capacity if r.capacity else 0.0 for r in ready) / len(ready))
                self.queue[llm].append(sum(len(r.waiting) for r in ready) / len(ready))

    def read(self, period_s: float) -> "_Reading":
        """Per-LLM completion rates and mean call latency over the period (as the engines' latency
        histograms give it: the increase of their sum over that of their count), mean KV usage and
        mean queue; resets the gauges."""
        rates: dict[str, float] = {}
        latency: dict[str, float | None] = {}
        kv: dict[str, float] = {}
        queue: dict[str, float] = {}
        for llm in self.cluster.routers:
            replicas = self.cluster.all_replicas(llm)
            total = sum(r.completed for r in replicas)
            latency_sum = sum(r.latency_sum_s for r in replicas)
            rates[llm] = (total - self.last_total[llm]) / period_s
            latency[llm] = (latency_sum - self.last_latency_sum[llm]) / (total - self.last_total[llm]) if total > self.last_total[llm] else None
            self.last_total[llm] = total
            self.last_latency_sum[llm] = latency_sum
            kv[llm] = float(np.mean(self.kv[llm])) if self.kv[llm] else 0.0
            queue[llm] = float(np.mean(self.queue[llm])) if self.queue[llm] else 0.0
        self.kv.clear()
        self.queue.clear()
        waiting = {llm: float(sum(len(r.waiting) for r in router.replicas) + len(router.parked))
                   for llm, router in self.cluster.routers.items()}
        return _Reading(rates, kv, queue, waiting, llm_latency_s=latency)


# ---------------------------------------------------------------------------------------------
# The closed loop


@dataclass
class _Recorder:
    """Latency of finished requests by arrival window, arrivals per period, and the timeline."""

    workflows: list[str]
    finished: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    timeline: list[Sample] = field(default_factory=list)
    period_latencies: dict[str, list[float]] = field(default_factory=dict)  # finished since the last take

    def on_finish(self, workflow: str, arrival_s: float, finish_s: float, tagged: bool = True) -> None:
        self.finished.setdefault(workflow, []).append((arrival_s, finish_s - arrival_s))
        self.period_latencies.setdefault(workflow, []).append(finish_s - arrival_s)

    def take_latency(self) -> dict[str, float | None]:
        """Per workflow, the mean latency of the requests that finished since the last take (None:
        none did), as the entry's latency histogram gives it over a period."""
        out: dict[str, float | None] = {w: float(np.mean(self.period_latencies[w])) if self.period_latencies.get(w) else None
                                        for w in self.workflows}
        self.period_latencies.clear()
        return out


@dataclass(frozen=True)
class _Run:
    """What every system of one closed loop shares: the inputs and the simulator's settings."""

    instance: Instance
    arrivals: Mapping[str, Sequence[float]]
    settings: ClosedLoopSettings
    context: PolicyContext
    sim: SimulationSettings
    duration_s: float

    @property
    def control(self) -> ControlSettings:
        return self.settings.control

    @property
    def workflows(self) -> list[str]:
        return [w.name for w in self.instance.workflows]


@dataclass(frozen=True)
class _Reading:
    """One period's metrics of a simulated deployment (_Meter.read)."""

    llm_rates_rps: Mapping[str, float]  # completions
    kv_usage: Mapping[str, float]
    queue_per_replica: Mapping[str, float]
    waiting_requests: Mapping[str, float]  # per LLM, now: its engines' queues and calls held at its router
    arrivals_rps: Mapping[str, float] = field(default_factory=dict)  # per workflow: counted at the entry
    latency_s: Mapping[str, float | None] = field(default_factory=dict)  # per workflow: of the requests finished in the period
    llm_latency_s: Mapping[str, float | None] = field(default_factory=dict)  # per LLM: mean latency of the calls finished in the period


class _System:
    """One system of the closed loop: the allocation the simulation starts from, and the SimPy
    process (`process`) that observes the deployment every period, acts on it (`step`) and records
    the timeline. Subclasses say how replicas are counted and how the system acts."""

    name = ""

    def __init__(self, run: _Run, allocation: Allocation, placement: Placement):
        self.run = run
        self.allocation = allocation
        self.placement = placement
        self.decisions: list[Decision] = []
        self.decision_times_s: list[float] = []

    def process(self, env: simpy.Environment, cluster: SimCluster, recorder: _Recorder
                ) -> Generator[simpy.Event, object, object]:
        """The system's loop: one observation, step and timeline sample per period."""
        self.attach(env, cluster)
        meter = _Meter(env, cluster)
        period = self.run.control.period_s
        period_bins = rate_bins(self.run.arrivals, self.run.duration_s, period)
        # the entry's rate as the live loop reads it: over Prometheus' rate window, or the period where longer
        spanned = max(round(RATE_WINDOW_S / period), 1)
        k = 0
        while True:
            yield env.timeout(period)
            k += 1
            now = env.now
            arrived = {w: float(period_bins[w][k - 1]) if k - 1 < len(period_bins[w]) else 0.0 for w in self.run.workflows}
            window = {w: float(np.mean(period_bins[w][max(k - spanned, 0):k])) if k - 1 < len(period_bins[w]) else 0.0
                      for w in self.run.workflows}
            reading = replace(meter.read(period), arrivals_rps=window, latency_s=recorder.take_latency())
            ready, starting = self.ready(), self.starting()
            self.step(now, reading, ready, starting)
            recorder.timeline.append(Sample(now, arrived, ready, starting, self.gpus_held(),
                                            _period_latency(recorder, now - period, now), self.serving()))

    def attach(self, env: simpy.Environment, cluster: SimCluster) -> None:
        raise NotImplementedError

    def step(self, now: float, reading: _Reading, ready: Mapping[str, int], starting: Mapping[str, int]) -> None:
        """Act on one period's observation (plans that never change do nothing)."""

    def ready(self) -> dict[str, int]:
        raise NotImplementedError

    def serving(self) -> dict[str, int]:
        """Per LLM, the replicas taking requests (the ready ones, where none leaves while serving)."""
        return self.ready()

    def starting(self) -> dict[str, int]:
        raise NotImplementedError

    def gpus_held(self) -> float:
        raise NotImplementedError

    def gpu_hours(self) -> float:
        raise NotImplementedError

    def changes(self) -> list[tuple[float, str, int]]:
        """(time, llm, +1 / -1) per replica asked for or stopped."""
        raise NotImplementedError

    def moved(self) -> tuple[int, int]:
        """Replica moves and their lower bound, over the run."""
        return sum(d.moves for d in self.decisions), sum(d.moves_lower_bound for d in self.decisions)


class _PlanSystem(_System):
    """A system that runs a placement through a fleet (module docstring: actuation); this one never
    changes it (static, static-peak)."""

    def attach(self, env: simpy.Environment, cluster: SimCluster) -> None:
        self.fleet = _Fleet(env, self.run.instance, self.run.sim, self.run.control.startup_s, self.allocation, self.placement)
        self.fleet.attach(cluster)

    def ready(self) -> dict[str, int]:
        return {m.name: self.fleet.ready(m.name) for m in self.run.instance.llms}

    def serving(self) -> dict[str, int]:
        return {m.name: self.fleet.serving(m.name) for m in self.run.instance.llms}

    def starting(self) -> dict[str, int]:
        return {m.name: self.fleet.starting(m.name) for m in self.run.instance.llms}

    def gpus_held(self) -> float:
        return self.fleet.gpus_held()

    def gpu_hours(self) -> float:
        return self.fleet.gpu_hours(self.run.duration_s)

    def changes(self) -> list[tuple[float, str, int]]:
        return self.fleet.changes

    def timed(self, decide_: Callable[[], _T]) -> _T:
        began = time.perf_counter()
        out = decide_()
        self.decision_times_s.append(time.perf_counter() - began)
        return out


class _StaticPeak(_PlanSystem):
    """The plan for the trace's peak 5-minute rate per workflow, with the controller's headroom."""

    def __init__(self, run: _Run, allocation: Allocation, placement: Placement):
        peak = peak_rates(run.arrivals, run.duration_s)
        target = run.context.replanner.allocation({w: r * (1 + run.control.headroom) for w, r in peak.items()})
        if target is None:
            raise InputError(None, "arrivals", "no plan meets the SLOs at the trace's peak 5-minute rate",
                             "scale the arrivals down, or lift the SLOs")
        peak_placement = run.context.replanner.place(target, None)
        if peak_placement is None:
            raise InputError(None, "arrivals", "the plan for the trace's peak rate cannot be placed", "scale the arrivals down")
        super().__init__(run, target, peak_placement)


class _Policy(_PlanSystem):
    """scepsy-control: the policy every period on the metrics a deployment exports."""

    def __init__(self, run: _Run, allocation: Allocation, placement: Placement):
        super().__init__(run, allocation, placement)
        self.state = ControllerState.initial(allocation, placement)
        self.context = run.context

    def observe(self, now: float, reading: _Reading, ready: Mapping[str, int], starting: Mapping[str, int]) -> Observation:
        return Observation(now, reading.llm_rates_rps, ready, starting, workflow_rates_rps=dict(reading.arrivals_rps),
                           queue_per_replica=reading.queue_per_replica, kv_usage=reading.kv_usage,
                           waiting_requests=reading.waiting_requests, workflow_latency_s=dict(reading.latency_s),
                           llm_latency_s=dict(reading.llm_latency_s))

    def step(self, now: float, reading: _Reading, ready: Mapping[str, int], starting: Mapping[str, int]) -> None:
        observation = self.observe(now, reading, ready, starting)
        self.state, decision = self.timed(lambda: decide(self.state, observation, self.context))
        self.decisions.append(decision)
        if decision.action == "replan" and decision.allocation is not None and decision.placement is not None:
            self.fleet.apply(decision.allocation, decision.placement)


class _Oracle(_Policy):
    """The policy fed the true workflow rates ahead (module docstring), without the filters that
    guard against noise."""

    def __init__(self, run: _Run, allocation: Allocation, placement: Placement):
        super().__init__(run, allocation, placement)
        control = replace(run.control, predictor="constant", stabilization_s=0.0, confirm_periods=1, burst_z=0.0,
                          flap_window_s=0.0)
        self.context = replace(run.context, settings=control, forecaster=replace(run.context.forecaster, name="constant"))
        self.minute_bins = rate_bins(run.arrivals, run.duration_s, WINDOW_S)

    def observe(self, now: float, reading: _Reading, ready: Mapping[str, int], starting: Mapping[str, int]) -> Observation:
        true: dict[str, float | None] = {w: self.true_rate(w, now) for w in self.run.workflows}
        return replace(super().observe(now, reading, ready, starting), workflow_rates_rps=true)

    def true_rate(self, workflow: str, now: float) -> float:
        """The highest 1-minute rate from the minute of `now` over the next start-up + period."""
        ahead = int(math.ceil((self.run.control.startup_s + self.run.control.period_s) / WINDOW_S))
        start, bins = int(now // WINDOW_S), self.minute_bins[workflow]
        return float(bins[start:start + ahead].max()) if start < len(bins) else 0.0


class _Reactive(_Oracle):
    """The oracle fed the true rate of the last whole minute, nothing ahead (module docstring)."""

    def true_rate(self, workflow: str, now: float) -> float:
        last, bins = max(int(now // WINDOW_S) - 1, 0), self.minute_bins[workflow]
        return float(bins[last]) if last < len(bins) else 0.0


class _Saturation(_PlanSystem):
    """The WVA-style rule per LLM on the given plan's shapes (module docstring)."""

    def __init__(self, run: _Run, allocation: Allocation, placement: Placement):
        super().__init__(run, allocation, placement)
        self.low_since: dict[str, float | None] = {m.name: None for m in run.instance.llms}

    def step(self, now: float, reading: _Reading, ready: Mapping[str, int], starting: Mapping[str, int]) -> None:
        step = self.timed(lambda: _saturation_step(self.fleet, self.run.context, self.run.settings, reading.kv_usage,
                                                   reading.queue_per_replica, self.low_since, now))
        if step is None:
            return
        target_allocation, target_placement = step
        self.decisions.append(Decision(now, "replan", target_allocation, target_placement, "saturation",
                                       moves(fleet_placement(self.fleet), target_placement),
                                       moves_lower_bound(self.fleet.allocation, target_allocation)))
        self.fleet.apply(target_allocation, target_placement)


class _Hpa(_System):
    """The Kubernetes HPA per LLM from one whole-GPU replica each (its own process scales)."""

    def __init__(self, run: _Run, allocation: Allocation, placement: Placement):
        deployment = hpa_deployment(run.instance, HpaSettings(target=run.settings.hpa_target,
                                                              startup_s=run.control.startup_s, sync_period_s=15.0))
        assert isinstance(deployment.controller, Autoscaler)
        self.hpa: Autoscaler = deployment.controller
        super().__init__(run, deployment.allocation, placement)

    def attach(self, env: simpy.Environment, cluster: SimCluster) -> None:
        self.cluster = cluster
        env.process(self.hpa(env, cluster))

    def ready(self) -> dict[str, int]:
        return {m: len(self.cluster.routers[m].replicas) for m in self.cluster.routers}

    def starting(self) -> dict[str, int]:
        return _hpa_starting(self.hpa, self.cluster)

    def gpus_held(self) -> float:
        return _hpa_gpus(self.cluster, self.allocation, self.hpa)

    def gpu_hours(self) -> float:
        return _hpa_gpu_hours(self.cluster, self.allocation, self.hpa, self.run.control.startup_s, self.run.duration_s)

    def changes(self) -> list[tuple[float, str, int]]:
        return [(t, llm, 1 if d == "up" else -1) for t, llm, d, _ in self.hpa.events]

    def moved(self) -> tuple[int, int]:
        return len(self.hpa.events), len(self.hpa.events)


SYSTEM_TYPES: dict[str, type[_System]] = {
    "scepsy-control": _Policy, "static": _PlanSystem, "static-peak": _StaticPeak, "k8s-hpa": _Hpa,
    "saturation": _Saturation, "oracle": _Oracle, "reactive": _Reactive,
}


def run_system(
    name: str,
    instance: Instance,
    allocation: Allocation,
    placement: Placement,
    arrivals: Mapping[str, Sequence[float]],
    slos_s: Mapping[str, float],
    settings: ClosedLoopSettings = ClosedLoopSettings(),
    context: PolicyContext | None = None,
    progress: Callable[[float], None] | None = None,
) -> SystemRun:
    """One system on the arrivals (module docstring). `context`: the controller's (its plan cache
    is shared with static-peak and saturation); made from the instance and SLOs when None."""
    if name not in SYSTEMS:
        raise InputError(None, "baselines", f"unknown system {name!r}", f"use some of: {', '.join(SYSTEMS[1:])}")
    if context is None:
        context = make_context(instance, settings.control, slos_s)
    names = [w.name for w in instance.workflows]
    duration = max((max(t) for t in arrivals.values() if len(t)), default=0.0)
    duration = math.ceil((duration + 1e-9) / WINDOW_S) * WINDOW_S
    sim = SimulationSettings(duration_s=duration, warmup_s=0.0, drain_s=settings.drain_s, seed=settings.seed)
    run = _Run(instance, arrivals, settings, context, sim, duration)
    system = SYSTEM_TYPES[name](run, allocation, placement)
    recorder = _Recorder(names)
    result = simulate(instance, system.allocation, sim, arrivals=arrivals,
                      controller=lambda env, cluster: system.process(env, cluster, recorder), progress=progress,
                      on_finish=recorder.on_finish)
    moved, bound = system.moved()
    flaps = _flaps(system.changes())
    return SystemRun(
        name=name,
        gpu_hours=system.gpu_hours(),
        replicas_moved=moved,
        replicas_moved_lower_bound=bound,
        flaps=sum(flaps.values()),
        flaps_max_per_llm=max(flaps.values(), default=0),
        decision_times_s=tuple(system.decision_times_s),
        workflows=tuple(_outcome(w, slos_s[w], arrivals.get(w, ()), recorder, result, duration, instance) for w in names),
        timeline=tuple(recorder.timeline),
        decisions=tuple(system.decisions),
    )


def fleet_placement(fleet: _Fleet) -> Placement:
    """The placement the fleet's live replicas make (indices in order)."""
    counters: dict[str, int] = defaultdict(int)
    out = []
    for r in sorted(fleet.live(), key=lambda r: r.key):
        llm, node, shards = r.key
        out.append(ReplicaPlacement(llm, counters[llm], node, tuple(Shard(g, u) for g, u in shards)))
        counters[llm] += 1
    return Placement(fleet.f, tuple(out))


def _saturation_step(fleet: _Fleet, context: PolicyContext, settings: ClosedLoopSettings, kv: Mapping[str, float],
                     queue: Mapping[str, float], low_since: dict[str, float | None], now: float
                     ) -> tuple[Allocation, Placement] | None:
    """The WVA-style rule (module docstring): at most one LLM changes by one replica a period."""
    control = settings.control
    current = fleet.allocation
    for choice in sorted(current.llms, key=lambda c: -max(kv.get(c.llm, 0.0) / settings.saturation_kv,
                                                           queue.get(c.llm, 0.0) / settings.saturation_queue)):
        llm = choice.llm
        if fleet.starting(llm):
            low_since[llm] = None
            continue
        saturated = kv.get(llm, 0.0) >= settings.saturation_kv or queue.get(llm, 0.0) >= settings.saturation_queue
        low = kv.get(llm, 0.0) < settings.saturation_kv / 2 and queue.get(llm, 0.0) < 0.5
        if not low:
            low_since[llm] = None
        elif low_since[llm] is None:
            low_since[llm] = now
        delta = 0
        if saturated:
            delta = 1
        elif low and choice.replicas > 1 and now - (low_since[llm] or now) >= control.stabilization_s:
            delta = -1
        if delta == 0:
            continue
        llms = tuple(replace(c, replicas=c.replicas + delta) if c.llm == llm else c for c in current.llms)
        target = Allocation(current.fractions_per_gpu, llms)
        placement = context.replanner.place(target, fleet_placement(fleet))
        if placement is None:
            continue
        low_since[llm] = None
        return target, placement
    return None


def _hpa_starting(hpa: Autoscaler, cluster: SimCluster) -> dict[str, int]:
    ups: dict[str, int] = defaultdict(int)
    for _, llm, direction, _ in hpa.events:
        if direction == "up":
            ups[llm] += 1
    added = {llm: sum(1 for r in cluster.all_replicas(llm) if r.started_s > 0) for llm in cluster.routers}
    return {llm: max(ups[llm] - added[llm], 0) for llm in cluster.routers}


def _hpa_gpus(cluster: SimCluster, allocation: Allocation, hpa: Autoscaler) -> float:
    held = 0.0
    for llm in cluster.routers:
        gpus = allocation.of(llm).tp * allocation.of(llm).share / allocation.fractions_per_gpu
        held += gpus * (sum(1 for r in cluster.all_replicas(llm) if r.retired_s is None)
                        + _hpa_starting(hpa, cluster)[llm])
    return held


def _hpa_gpu_hours(cluster: SimCluster, allocation: Allocation, hpa: Autoscaler, startup_s: float, end_s: float) -> float:
    total = 0.0
    pending = _hpa_starting(hpa, cluster)
    for llm in cluster.routers:
        choice = allocation.of(llm)
        gpus = choice.tp * choice.share / allocation.fractions_per_gpu
        for r in cluster.all_replicas(llm):
            began = r.started_s - startup_s if r.started_s > 0 else 0.0
            total += gpus * ((r.retired_s if r.retired_s is not None else end_s) - began)
        starts = sorted(t for t, m, d, _ in hpa.events if m == llm and d == "up")
        total += gpus * sum(end_s - t for t in starts[len(starts) - pending[llm]:]) if pending[llm] else 0.0
    return total / 3600.0


def _flaps(changes: Sequence[tuple[float, str, int]]) -> dict[str, int]:
    """Direction reversals per LLM within FLAP_WINDOW_S (changes at one time are one step)."""
    steps: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for t, llm, direction in sorted(changes):
        if steps[llm] and steps[llm][-1][0] == t:
            steps[llm][-1] = (t, steps[llm][-1][1] + direction)
        else:
            steps[llm].append((t, direction))
    out = {}
    for llm, seq in steps.items():
        moves_ = [(t, 1 if d > 0 else -1) for t, d in seq if d != 0]
        out[llm] = sum(1 for (t0, d0), (t1, d1) in zip(moves_, moves_[1:]) if d0 != d1 and t1 - t0 <= FLAP_WINDOW_S)
    return out


def _period_latency(recorder: _Recorder, start: float, end: float) -> dict[str, float]:
    out = {}
    for w in recorder.workflows:
        values = [lat for a, lat in recorder.finished.get(w, []) if start <= a < end]
        out[w] = float(np.mean(values)) if values else math.nan
    return out


def _outcome(workflow: str, slo_s: float, times: Sequence[float], recorder: _Recorder, result: SimulationResult,
             duration: float, instance: Instance) -> WorkflowOutcome:
    windows = int(math.ceil(duration / WINDOW_S))
    done: list[list[float]] = [[] for _ in range(windows)]
    for arrival, latency in recorder.finished.get(workflow, []):
        done[min(int(arrival // WINDOW_S), windows - 1)].append(latency)
    arrived = np.bincount(np.minimum((np.asarray(times, dtype=float) // WINDOW_S).astype(int), windows - 1),
                          minlength=windows) if len(times) else np.zeros(windows, dtype=int)
    missed = 0
    for k in range(windows):
        if arrived[k] == 0:
            continue
        if len(done[k]) < arrived[k]:
            missed += 1  # a request of the window never finished
        elif _metric(done[k], instance.latency_metric) > slo_s:
            missed += 1
    stats = result.workflow(workflow)
    return WorkflowOutcome(workflow, slo_s, missed, stats.arrivals, stats.unfinished, stats.latency_mean_s, stats.latency_p99_s)


def _metric(latencies: Sequence[float], metric: str) -> float:
    if metric == "mean":
        return float(np.mean(latencies))
    return float(np.percentile(latencies, float(metric.lstrip("p"))))


# ---------------------------------------------------------------------------------------------
# All systems


def run_systems(
    instance: Instance,
    allocation: Allocation,
    placement: Placement,
    arrivals: Mapping[str, Sequence[float]],
    systems: Sequence[str] = SYSTEMS,
    settings: ClosedLoopSettings = ClosedLoopSettings(),
    slos_s: Mapping[str, float] | None = None,
    progress: Callable[[float], None] | None = None,
    opening: bool = True,
) -> list[SystemRun]:
    """Every system of `systems` on the same arrivals; SLOs default to each workflow's
    latency_slo_s, else twice the given plan's predicted latency at the instance's rates. With
    `opening`, every plan-driven system starts from `opening_plan` (the given plan only sets the
    SLOs); without, from the given plan."""
    for system in systems:
        if system not in SYSTEMS:
            raise InputError(None, "baselines", f"unknown system {system!r}", f"use some of: {', '.join(SYSTEMS[1:])}")
    context = make_context(instance, settings.control, slos_s, allocation)
    if opening:
        allocation, placement = opening_plan(context, arrivals)
    runs = []
    for index, system in enumerate(systems):
        def step(fraction: float, done: int = index) -> None:
            if progress is not None:
                progress(done + fraction)

        runs.append(run_system(system, instance, allocation, placement, arrivals, context.slos_s, settings, context, step))
    return runs
